"""What every benchmark prints: its arguments, progress lines on stderr, percentiles, and the
result table and notes on stdout."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from pipeline.cli.format import progress_bar, table


def parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(description or "").strip())
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs (kept anyway on failure)"
    )
    return parser


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the figures."""
    print(f"  .. {message}", file=sys.stderr, flush=True)


class Progress:
    """A progress line at most every `every` seconds (and at the end)."""

    def __init__(
        self, label: str, total: int, every: float = 2.0, started: float | None = None
    ) -> None:
        self.label, self.total, self.every = label, total, every
        self.started = time.monotonic() if started is None else started
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last >= self.every or done >= self.total:
            self._last = now
            elapsed = now - self.started
            log(f"{self.label} {progress_bar(done, self.total)} {elapsed:.1f}s")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), interpolating between the two nearest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:.2f} s"


def times(ratio: float) -> str:
    return f"{ratio:.2f}x"


def verdict(ratio: float, target: float) -> str:
    """Whether `ratio` is within `target` (lower is better)."""
    return f"{'met' if ratio <= target else 'MISSED'} (target <= {target:g}x)"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(f"\n{title}")
    print(table(rows, headers), flush=True)


def print_notes(*notes: str) -> None:
    for note in notes:
        print(f"  - {note}")
    sys.stdout.flush()
