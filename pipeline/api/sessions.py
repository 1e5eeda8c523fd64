"""Status-page sessions: a row in PostgreSQL naming the person, and a signed cookie holding its id.

The cookie is `<random id>.<HMAC>`, signed with the status page's own key
(NIGHTSHIFT_SESSION_SECRET, else `session.key` made into the data dir's secrets: never derived
from a credential a client holds, so no token can mint a session). The session lives while its
row does: signing out deletes it, and so does revoking the person token it signed in with; only
the id's SHA-256 is stored. `who` is whom that token speaks for (`token_id` names it, and the
pages re-check that it is not revoked) or the trusted proxy's identity header. The CSRF token of
each form is an HMAC of the session's id; the sign-in form's is an HMAC of a random value in a
cookie of its own, so another site cannot sign a browser in (login CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, select

from models import StatusPageSession
from pipeline.db import transaction
from pipeline.embedded.access import secret

COOKIE = "nightshift_session"
LOGIN_COOKIE = "nightshift_login"
MAX_AGE_SECONDS = 12 * 3600
LOGIN_MAX_AGE_SECONDS = 3600
KEY_FILE = "session.key"


@dataclass(frozen=True)
class WebSession:
    who: str
    """Whom the session speaks for: recorded as `decided_by` on their decisions."""
    via: str
    """How `who` was established (a token's prefix, the proxy header), for the audit trail."""
    token_id: uuid.UUID | None
    session_id: str


def session_key(configured: str | None, data_dir: Path) -> bytes:
    """The key that signs sessions: NIGHTSHIFT_SESSION_SECRET, else the data dir's own."""
    chosen = configured if configured is not None else secret(data_dir, KEY_FILE)
    return hashlib.sha256(b"nightshift status page sessions." + chosen.encode()).digest()


class Sessions:
    def __init__(self, key: bytes, max_age: int = MAX_AGE_SECONDS) -> None:
        self._key = key
        self.max_age = max_age

    def begin(self, who: str, via: str, token_id: uuid.UUID | None) -> str:
        """A new session's cookie value (its row is written first)."""
        session_id = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        with transaction() as db:
            db.execute(delete(StatusPageSession).where(StatusPageSession.expires_at < now))
            db.add(
                StatusPageSession(
                    id_hash=_digest(session_id),
                    who=who,
                    via=via,
                    token_id=token_id,
                    expires_at=now + timedelta(seconds=self.max_age),
                )
            )
        return f"{session_id}.{self._mac('session', session_id)}"

    def read(self, cookie: str | None) -> WebSession | None:
        """The session in a cookie, or None if it is missing, forged, ended or expired."""
        session_id = self._verified(cookie)
        if session_id is None:
            return None
        with transaction() as db:
            row = db.scalar(
                select(StatusPageSession).where(
                    StatusPageSession.id_hash == _digest(session_id),
                    StatusPageSession.expires_at > datetime.now(UTC),
                )
            )
            if row is None:
                return None
            return WebSession(row.who, row.via, row.token_id, session_id)

    def end(self, cookie: str | None) -> None:
        """Sign out: the session's row goes, so its cookie opens nothing from now on."""
        session_id = self._verified(cookie)
        if session_id is not None:
            with transaction() as db:
                db.execute(
                    delete(StatusPageSession).where(
                        StatusPageSession.id_hash == _digest(session_id)
                    )
                )

    def csrf_token(self, session: WebSession) -> str:
        return self._mac("csrf", session.session_id)

    def csrf_matches(self, session: WebSession, given: str | None) -> bool:
        return self._matches(self.csrf_token(session), given)

    def login_csrf(self, login_nonce: str) -> str:
        """The sign-in form's CSRF token, bound to the random value of its own cookie."""
        return self._mac("login", login_nonce)

    def login_csrf_matches(self, login_nonce: str | None, given: str | None) -> bool:
        return bool(login_nonce) and self._matches(self.login_csrf(str(login_nonce)), given)

    def _verified(self, cookie: str | None) -> str | None:
        if not cookie or cookie.count(".") != 1:
            return None
        session_id, mac = cookie.split(".")
        return session_id if self._matches(self._mac("session", session_id), mac) else None

    @staticmethod
    def _matches(expected: str, given: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}.{value}".encode(), hashlib.sha256).hexdigest()


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()
