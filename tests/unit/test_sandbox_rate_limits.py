"""The Messages API sandbox enforces a provider's requests and tokens per minute with real 429s
and retry-after, through the real SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from pipeline.retry import retry_after
from pipeline.sandbox import MessagesSandbox
from pipeline.sandbox.rate_limits import RateLimits

HI: Any = [{"role": "user", "content": "hi"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refill_continuously_up_to_a_minutes_worth() -> None:
    clock = Clock()
    limits = RateLimits(clock)
    limits.set(requests_per_minute=60)
    # given a full bucket: a minute's worth at once, then the 61st waits a second
    assert all(limits.admit(10) is None for _ in range(60))
    assert limits.admit(10) == ("requests_per_minute", pytest.approx(1.0))
    # then half a second later one is half there; a second later it is
    clock.now += 0.5
    assert limits.admit(10) == ("requests_per_minute", pytest.approx(0.5))
    clock.now += 0.5
    assert limits.admit(10) is None
    # and a long pause never fills past a minute's worth
    clock.now += 3600
    assert sum(limits.admit(10) is None for _ in range(100)) == 60
    assert limits.refused == 2 + 40


def test_tokens_per_minute_charge_input_before_and_output_after() -> None:
    clock = Clock()
    limits = RateLimits(clock)
    limits.set(input_tokens_per_minute=600, output_tokens_per_minute=120)
    # given a request of 500 input tokens: paid; one more of 200 waits for 100 (10 s at 10/s)
    assert limits.admit(500) is None
    assert limits.admit(200) == ("input_tokens_per_minute", pytest.approx(10.0))
    # when a reply wrote more than the output bucket held, the next request waits out the debt
    limits.charge_output(180)
    clock.now += 10
    # (120 - 180 = -60, +20 in 10 s: 41 short of one token at 2 a second)
    assert limits.admit(200) == ("output_tokens_per_minute", pytest.approx(20.5))
    clock.now += 20.5
    assert limits.admit(200) is None


def test_bad_limits_are_refused_by_name() -> None:
    limits = RateLimits()
    with pytest.raises(ValueError, match="unknown rate limit 'rpm'"):
        limits.set(rpm=5)
    with pytest.raises(ValueError, match="requests_per_minute must be a positive number"):
        limits.set(requests_per_minute=0)


@pytest.fixture
def messages(tmp_path: Path) -> Iterator[MessagesSandbox]:
    with MessagesSandbox(log_path=tmp_path / "messages.jsonl") as server:
        yield server


def test_past_the_limit_the_sdk_gets_429_with_retry_after(messages: MessagesSandbox) -> None:
    # given a provider allowing 3 requests a minute (set as a test or a benchmark sets it)
    with httpx.Client(base_url=messages.url, timeout=5) as http:
        set_ = http.post("/_control/rate_limits", json={"requests_per_minute": 3})
        assert set_.json()["rate_limits"] == {"requests_per_minute": 3.0}
        assert http.post("/_control/rate_limits", json={"rpm": 3}).status_code == 400
    llm = anthropic.Anthropic(api_key="test", base_url=messages.url, max_retries=0, timeout=5)
    with llm:
        replies = [llm.messages.create(model="m", max_tokens=50, messages=HI) for _ in range(3)]
        # then the fourth is refused as the API refuses it, saying when to come back
        with pytest.raises(anthropic.RateLimitError) as refused:
            llm.messages.create(model="m", max_tokens=50, messages=HI)
    assert all(reply.stop_reason == "end_turn" for reply in replies)
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert retry_after(refused.value) == 20.0  # a request every 20 s
    stats = messages.stats()
    assert (stats["requests"], stats["rate_limited"]) == (4, 1)
    # and a reset lifts the limits
    messages.reset()
    assert messages.stats()["rate_limits"] == {}


def test_a_provider_may_hold_less_than_a_minutes_worth() -> None:
    clock = Clock()
    limits = RateLimits(clock)
    # given 60 a minute enforced as one a second (a bucket of 1 s)
    limits.set(burst_seconds=1, requests_per_minute=60)
    assert limits.admit(1) is None
    assert limits.admit(1) == ("requests_per_minute", pytest.approx(1.0))
    clock.now += 30  # never more than a second's worth, however long it was idle
    assert [limits.admit(1) is None for _ in range(2)] == [True, False]
    with pytest.raises(ValueError, match="burst_seconds must be"):
        limits.set(burst_seconds=120, requests_per_minute=60)
