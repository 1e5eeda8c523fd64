"""The signature scheme of nightshift's webhooks, both ways: requests sent to nightshift (the
approval and event webhooks, pipeline/api/webhooks.py) are verified with it, and the completion
notifications nightshift sends (pipeline/delivery/sender.py) are signed with it.
HMAC-SHA256 over the timestamp, the method, the path and the raw body, inside a 5-minute window.

Headers: `X-Nightshift-Timestamp: <unix seconds>` and
`X-Nightshift-Signature: v2=<hex HMAC-SHA256(secret, f"{timestamp}\\n{METHOD}\\n{path}\\n" + body)>`
where path is the request's path without the query string, as the receiver routes it
(percent-decoded), e.g. `/approvals/patch:acme/shop:patch/issue-7`.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from pipeline.errors import BadSignature

TIMESTAMP_HEADER = "X-Nightshift-Timestamp"
SIGNATURE_HEADER = "X-Nightshift-Signature"
TOLERANCE_SECONDS = 300
_PREFIX = "v2="
_OLD_PREFIX = "sha256="


def signed_message(timestamp: str, method: str, path: str, body: bytes) -> bytes:
    """What the signature covers. No part before the body can contain a newline (checked by
    `verify`), so two different requests never sign the same bytes."""
    return f"{timestamp}\n{method.upper()}\n{path}\n".encode() + body


def signature(secret: str, timestamp: str, method: str, path: str, body: bytes) -> str:
    """The header value a sender puts in X-Nightshift-Signature."""
    message = signed_message(timestamp, method, path, body)
    return _PREFIX + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(
    secret: str, method: str, path: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """Both headers for one request, as a sender (or a test) would write them."""
    timestamp = str(int(time.time() if now is None else now))
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(secret, timestamp, method, path, body),
    }


def verify(
    secret: str,
    timestamp: str | None,
    given: str | None,
    method: str,
    path: str,
    body: bytes,
    *,
    now: float | None = None,
    tolerance: float = TOLERANCE_SECONDS,
) -> str:
    """The signature's hex digest (for the replay cache); raises BadSignature unless `given`
    signs this method, path and body at a timestamp inside the window.

    The messages say what is wrong, never what was expected.
    """
    if not timestamp or not given:
        raise BadSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise BadSignature(f"{TIMESTAMP_HEADER} must be unix seconds")
    if not path.isprintable():
        raise BadSignature("the request path must not contain control characters")
    skew = (time.time() if now is None else now) - int(timestamp)
    if abs(skew) > tolerance:
        raise BadSignature(
            f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s in the "
            f"{'past' if skew > 0 else 'future'}; the limit is {tolerance:.0f} s"
        )
    given = given.strip()
    if given.startswith(_OLD_PREFIX):
        raise BadSignature(
            f"{SIGNATURE_HEADER} uses the old scheme (timestamp and body only); sign the "
            "timestamp, method, path and body and send v2=<hex> (see docs/api.md)"
        )
    expected = signature(secret, timestamp, method, path, body)
    # Compare as bytes: compare_digest refuses non-ASCII str, and that must be a 401, not a 500.
    if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
        raise BadSignature(f"{SIGNATURE_HEADER} does not match the method, path and body")
    return expected.removeprefix(_PREFIX)
