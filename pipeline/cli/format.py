"""Output for people (tables, progress bars) and for programs (--json)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c) for c in headers], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def progress_bar(done: int, total: int, width: int = 30) -> str:
    filled = 0 if total <= 0 else round(width * min(done, total) / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
