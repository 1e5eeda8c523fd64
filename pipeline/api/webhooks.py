"""Signed webhooks: HMAC-SHA256 over the timestamp and the raw body, inside a 5-minute window.

Headers: `X-Nightshift-Timestamp: <unix seconds>` and
`X-Nightshift-Signature: sha256=<hex of HMAC-SHA256(secret, f"{timestamp}.{raw body}")>`.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from pipeline.errors import NightshiftError

TIMESTAMP_HEADER = "X-Nightshift-Timestamp"
SIGNATURE_HEADER = "X-Nightshift-Signature"
TOLERANCE_SECONDS = 300
_PREFIX = "sha256="


class BadSignature(NightshiftError):
    """The webhook's signature or timestamp is missing or wrong."""


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The header value a sender puts in X-Nightshift-Signature."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return _PREFIX + mac.hexdigest()


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """Both headers for `body`, as a sender (or a test) would write them."""
    timestamp = str(int(time.time() if now is None else now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify(
    secret: str,
    timestamp: str | None,
    given: str | None,
    body: bytes,
    *,
    now: float | None = None,
    tolerance: float = TOLERANCE_SECONDS,
) -> None:
    """Raise BadSignature unless `given` signs `body` at a timestamp inside the window.

    The messages say what is wrong, never what was expected.
    """
    if not timestamp or not given:
        raise BadSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise BadSignature(f"{TIMESTAMP_HEADER} must be unix seconds")
    skew = (time.time() if now is None else now) - int(timestamp)
    if abs(skew) > tolerance:
        raise BadSignature(
            f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s in the "
            f"{'past' if skew > 0 else 'future'}; the limit is {tolerance:.0f} s"
        )
    expected = signature(secret, timestamp, body)
    # Compare as bytes: compare_digest refuses non-ASCII str, and that must be a 401, not a 500.
    if not hmac.compare_digest(expected.encode(), given.strip().encode("utf-8", "replace")):
        raise BadSignature(f"{SIGNATURE_HEADER} does not match the body")
