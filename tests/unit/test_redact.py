"""Passwords, tokens and query strings never reach a repr or a journaled error."""

from __future__ import annotations

import io
import logging

import httpx
import pytest

from pipeline.errors import redact_url, redact_urls
from pipeline.logs import safe_log_lines
from pipeline.retry import classify
from pipeline.settings import Settings


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/x?sslpassword=y", "postgresql://app:***@db:5432/x?***"),
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        ("postgresql://postgres@127.0.0.1/ns", "postgresql://postgres@127.0.0.1/ns"),
        (
            "https://ghp_s3cret@git.example.com/a?token=s3cret#f",
            "https://***@git.example.com/a?***",
        ),
        ("http://127.0.0.1:8000/emails", "http://127.0.0.1:8000/emails"),
        # a hook's secret is its path's last segment: token-like segments are hidden, words stay
        (
            "https://hooks.slack.com/services/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",
            "https://hooks.slack.com/services/T0AB12CD3/B0CD45EF6/***",
        ),
        (
            "https://discord.com/api/webhooks/123456789012345678/abcDEF_ghi-JKL123mno456PQR",
            "https://discord.com/api/webhooks/123456789012345678/***",
        ),
        (
            "https://hooks.example.com/nightly-ops-team/x",
            "https://hooks.example.com/nightly-ops-team/x",
        ),
        (
            "postgresql://app@db/nightshift_contract_12345",
            "postgresql://app@db/nightshift_contract_12345",
        ),
        (
            "sentinel://:s3cret@s1:26379/0;sentinel://:s3cret@s2:26380/0",
            "sentinel://:***@s1:26379/0;sentinel://:***@s2:26380/0",
        ),
    ],
)
def test_a_url_keeps_where_it_points_and_loses_its_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_settings_repr_hides_passwords_and_keys() -> None:
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_DATABASE_URL": "postgresql://app:db-s3cret@db:5432/ns",
            "NIGHTSHIFT_BROKER_URL": "redis://:broker-s3cret@redis:6379/0",
            "NIGHTSHIFT_ALERT_WEBHOOK_URL": "https://hooks.example.com/x?token=hook-s3cret",
            "ANTHROPIC_API_KEY": "sk-ant-s3cret",
            "NIGHTSHIFT_FLOWER_BASIC_AUTH": "ops:flower-s3cret",
        }
    )
    shown = repr(settings)
    assert "s3cret" not in shown
    assert "postgresql+psycopg://app:***@db:5432/ns" in shown and "redis://:***@redis" in shown
    assert "lease_seconds=15.0" in shown  # the rest is still there to read


def test_an_http_error_is_classified_without_the_credentials_in_its_url() -> None:
    request = httpx.Request("GET", "http://ops:s3cret@127.0.0.1:9/sources/x?token=s3cret")
    with pytest.raises(httpx.HTTPStatusError) as error:
        httpx.Response(503, request=request).raise_for_status()
    classified = classify(error.value)
    assert "s3cret" not in str(classified)
    assert "http://ops:***@127.0.0.1:9/sources/x?***" in str(classified)
    assert "503" in str(classified)


def test_every_url_in_a_message_is_redacted() -> None:
    text = "tried http://a:p1@x/y?k=1 then redis://:p2@r:1/0, both failed"
    assert redact_urls(text) == "tried http://a:***@x/y?*** then redis://:***@r:1/0, both failed"


def test_a_log_line_is_one_line_and_names_no_secret_whoever_logs_it() -> None:
    # given this process's log lines made safe (as every nightshift process does at its start)
    safe_log_lines()
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("a.library.of.someone.else")
    logger.addHandler(handler)
    try:
        # when a line quotes an input with line breaks and terminal escapes, and a hook's URL
        forged = "night\nINFO nightshift.decisions approve by pricing@example.com"
        logger.warning("batch %s\x1b[2J\u2028%s", forged, "\r\x85")
        hook = "https://hooks.slack.com/services/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"
        logger.warning(f"POST {hook}?token=t0ken failed")
    finally:
        logger.removeHandler(handler)
    # then each is one line, its control characters written as escapes, its URL redacted
    assert written.getvalue().splitlines() == [
        "WARNING a.library.of.someone.else batch night\\nINFO nightshift.decisions approve by "
        "pricing@example.com\\x1b[2J\\u2028\\r\\x85",
        "WARNING a.library.of.someone.else POST https://hooks.slack.com/services/T0AB12CD3/"
        "B0CD45EF6/***?*** failed",
    ]
