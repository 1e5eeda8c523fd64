"""Output for people (tables, progress bars) and for programs (--json).

On a terminal, tables, progress bars and `watch` go through rich: boxed headers, statuses in
colour, real bars, a live status line. Piped or redirected, the output is plain text with
stable columns for grep and awk; `--json` is the same everywhere.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

STYLES = {
    "succeeded": "green", "confirmed": "green", "completed": "green",
    "failed": "red", "rejected": "red", "cancelled": "red", "stopped": "red",
    "running": "blue", "attempted": "blue", "intended": "blue", "synthesizing": "blue",
    "waiting": "yellow", "pending_approval": "yellow",
    "needs_attention": "magenta bold", "outcome_unknown": "magenta bold",
}  # fmt: skip
"""Statuses and states in colour on a terminal: what needs a person stands out."""


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def on_terminal() -> bool:
    return sys.stdout.isatty()


def console() -> Console:
    """Where rich writes on a terminal (`watch`'s live line)."""
    return Console(highlight=False)


def render(renderable: RenderableType) -> str:
    """A rich renderable as the text a terminal shows (colours included)."""
    out = Console(
        file=io.StringIO(),
        force_terminal=True,
        color_system="standard",
        width=shutil.get_terminal_size((120, 24)).columns,
        highlight=False,
    )
    out.print(renderable, end="")
    file = out.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def table(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], *, rich: bool | None = None
) -> str:
    if not (on_terminal() if rich is None else rich):
        return _plain_table(rows, headers)
    shown = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for header in headers:
        shown.add_column(header, overflow="fold")
    for row in rows:
        shown.add_row(*(styled(cell) for cell in row))
    return render(shown)


def styled(value: Any) -> Text:
    text = "" if value is None else str(value)
    return Text(text, style=STYLES.get(text, ""))


def _plain_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c) for c in headers], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def progress_bar(done: int, total: int, width: int = 30, *, rich: bool | None = None) -> str:
    if on_terminal() if rich is None else rich:
        bar = ProgressBar(total=max(total, 1), completed=min(done, total), width=width)
        grid = Table.grid(padding=(0, 1))
        grid.add_row(bar, Text(f"{done}/{total}"))
        return render(grid).rstrip("\n")
    filled = 0 if total <= 0 else round(width * min(done, total) / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
