"""Every kind of wait reads as words on the status page and in the CLI (a kind missing there
was a 500 on the page of every run waiting that way)."""

from __future__ import annotations

from pipeline.api.words import waiting_words
from pipeline.keys import Wait, WaitKind, rate_wait, turn_wait


def test_every_kind_of_wait_has_words() -> None:
    for kind in WaitKind:
        assert waiting_words(str(Wait(kind, "ref"))).strip(), kind


def test_a_run_waiting_for_its_turn_says_for_what() -> None:
    assert "turn" in waiting_words(str(turn_wait("invoice_reminders")))
    assert "claude-x's rate limits" in waiting_words(str(rate_wait("claude-x")))
