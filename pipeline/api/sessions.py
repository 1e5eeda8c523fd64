"""Status-page sessions: a signed cookie naming the person, and a CSRF token bound to it.

The cookie holds no token: `<base64 JSON {who, via, tid, iat, nonce}>.<HMAC>` signed with a key
derived from NIGHTSHIFT_API_TOKEN, so rotating that token ends every session. `who` is whom the
person token used at sign-in speaks for (`tid` names that token, and the pages re-check that it
is not revoked) or the trusted proxy's identity header. The CSRF token is an HMAC of the
session's nonce: each form carries it, and a POST without the matching value is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass

COOKIE = "nightshift_session"
MAX_AGE_SECONDS = 12 * 3600


@dataclass(frozen=True)
class WebSession:
    who: str
    """Whom the session speaks for: recorded as `decided_by` on their decisions."""
    via: str
    """How `who` was established (a token's prefix, the proxy header), for the audit trail."""
    token_id: uuid.UUID | None
    issued: int
    nonce: str


class SessionSigner:
    def __init__(self, key: bytes, max_age: int = MAX_AGE_SECONDS) -> None:
        self._key = key
        self.max_age = max_age

    def issue(
        self, who: str, via: str, token_id: uuid.UUID | None, now: float | None = None
    ) -> str:
        issued = int(time.time() if now is None else now)
        claims = {
            "who": who,
            "via": via,
            "tid": str(token_id) if token_id else None,
            "iat": issued,
            "nonce": secrets.token_urlsafe(16),
        }
        payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
        return f"{payload}.{self._mac('session', payload)}"

    def read(self, cookie: str | None, now: float | None = None) -> WebSession | None:
        """The session in a cookie, or None if it is missing, forged or expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, mac = cookie.split(".")
        if not hmac.compare_digest(mac.encode(), self._mac("session", payload).encode()):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            session = WebSession(
                who=str(claims["who"]),
                via=str(claims["via"]),
                token_id=uuid.UUID(claims["tid"]) if claims["tid"] else None,
                issued=int(claims["iat"]),
                nonce=str(claims["nonce"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        age = (time.time() if now is None else now) - session.issued
        return session if 0 <= age <= self.max_age else None

    def csrf_token(self, session: WebSession) -> str:
        return self._mac("csrf", session.nonce)

    def csrf_matches(self, session: WebSession, given: str | None) -> bool:
        if not given:
            return False
        expected = self.csrf_token(session)
        return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}.{value}".encode(), hashlib.sha256).hexdigest()
