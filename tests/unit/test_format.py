"""Terminal output: rich on a terminal (colours, boxed headers, real bars), plain text when
piped, the same columns either way."""

from __future__ import annotations

from pipeline.cli.format import progress_bar, table

ROWS = [("3f2a9c1e", "nightly_report", "succeeded"), ("9b1d0e7a", "patch", "needs_attention")]
HEADERS = ["run", "agent", "status"]


def test_piped_tables_and_bars_are_plain_text_with_stable_columns() -> None:
    assert [line.rstrip() for line in table(ROWS, HEADERS, rich=False).splitlines()] == [
        "run       agent           status",
        "--------  --------------  ---------------",
        "3f2a9c1e  nightly_report  succeeded",
        "9b1d0e7a  patch           needs_attention",
    ]
    assert progress_bar(3, 10, width=10, rich=False) == "[###.......] 3/10"


def test_on_a_terminal_tables_colour_the_states_that_matter() -> None:
    shown = table(ROWS, HEADERS, rich=True)
    assert "\x1b[1m" in shown  # a bold header
    assert "\x1b[32msucceeded" in shown  # green
    assert "\x1b[1;35mneeds_attention" in shown  # a person must look: bold magenta
    assert "─" in shown and "3f2a9c1e" in shown and "nightly_report" in shown


def test_on_a_terminal_progress_is_a_bar() -> None:
    bar = progress_bar(3, 10, width=10, rich=True)
    assert "━" in bar and bar.endswith("3/10") and "#" not in bar
