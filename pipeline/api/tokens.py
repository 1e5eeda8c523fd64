"""Per-person API tokens: who a request to the API, a webhook or the status page speaks for.

An operator creates one with `nightshift tokens create --for pricing@acme.example`; it is shown
once and only its SHA-256 is stored. A token is listed by its prefix and revoked by id or
prefix; a revoked token (and every status-page session signed in with it) stops working at
once.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Select, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from models import ApiToken, StatusPageSession
from pipeline.db import transaction
from pipeline.errors import InvalidInput, NightshiftError, UnknownToken
from pipeline.runs.decisions import Actor

TOKEN_PREFIX = "nst_"
SHOWN_PREFIX = 12
"""Characters of a token that name it: `nst_` and 8 random ones."""
API_TOKEN_IDENTITY = "NIGHTSHIFT_API_TOKEN"
"""Whom the shared API token speaks for: an operator credential, not a person."""
ANONYMOUS = "anonymous"
"""Whom a request speaks for on a server started with --insecure-no-auth."""
RESERVED = frozenset({API_TOKEN_IDENTITY, ANONYMOUS})
MAX_IDENTITY = 200
_USED_EVERY = timedelta(seconds=60)
"""last_used_at is refreshed at most this often: a busy client must not write on every call."""


@dataclass(frozen=True)
class Authenticated:
    actor: Actor
    token_id: uuid.UUID | None = None
    """The person token it came from (None for the API token, a proxy header, no auth)."""


@dataclass(frozen=True)
class IssuedToken:
    id: uuid.UUID
    identity: str
    prefix: str
    token: str = field(repr=False)
    """Shown once to the operator who created it; nowhere else."""


@dataclass(frozen=True)
class TokenInfo:
    id: uuid.UUID
    identity: str
    prefix: str
    note: str | None
    created_by: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None


def check_identity(identity: str) -> str:
    identity = identity.strip()
    if not identity or len(identity) > MAX_IDENTITY or not identity.isprintable():
        raise InvalidInput(
            f"--for must be a name or email of 1 to {MAX_IDENTITY} printable characters "
            f"(got {identity[:40]!r})"
        )
    if identity in RESERVED:
        raise InvalidInput(f"{identity!r} is reserved; name a person, e.g. pricing@acme.example")
    return identity


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def create_token(identity: str, created_by: str, note: str | None = None) -> IssuedToken:
    identity = check_identity(identity)
    for _ in range(3):  # a prefix collision (8 random characters) is rare; draw again
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = ApiToken(
            identity=identity,
            prefix=token[:SHOWN_PREFIX],
            token_hash=_digest(token),
            note=note,
            created_by=created_by,
        )
        try:
            with transaction() as session:
                session.add(row)
                session.flush()
                return IssuedToken(row.id, identity, row.prefix, token)
        except IntegrityError:
            continue
    raise NightshiftError("could not draw a token with an unused prefix; try again")


def authenticate(token: str) -> Authenticated | None:
    """The identity a bearer token speaks for, or None if it is unknown or revoked."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    digest = _digest(token)
    with transaction() as session:
        row = session.execute(
            select(ApiToken.id, ApiToken.identity, ApiToken.prefix).where(
                ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None)
            )
        ).one_or_none()
        if row is None:
            return None
        _touch_txn(session, row.id)
    return Authenticated(Actor(row.identity, f"token {row.prefix}"), row.id)


def active(token_id: uuid.UUID) -> Authenticated | None:
    """The token's identity while it is not revoked (a status-page session re-checks it)."""
    with transaction() as session:
        row = session.execute(
            select(ApiToken.identity, ApiToken.prefix).where(
                ApiToken.id == token_id, ApiToken.revoked_at.is_(None)
            )
        ).one_or_none()
    if row is None:
        return None
    return Authenticated(Actor(row.identity, f"status page, token {row.prefix}"), token_id)


def still_valid(found: Authenticated) -> bool:
    """Whether what authenticated a request still does: a person token until it is revoked
    (the API token and a proxy's header stay what they were for the request's life)."""
    return found.token_id is None or active(found.token_id) is not None


def _touch_txn(session: Session, token_id: uuid.UUID) -> None:
    session.execute(
        update(ApiToken)
        .where(
            ApiToken.id == token_id,
            or_(
                ApiToken.last_used_at.is_(None),
                ApiToken.last_used_at < func.now() - _USED_EVERY,
            ),
        )
        .values(last_used_at=func.now())
    )


def list_tokens(include_revoked: bool = False) -> list[TokenInfo]:
    query = select(ApiToken).order_by(ApiToken.created_at)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    with transaction() as session:
        return [_info(row) for row in session.scalars(query)]


def revoke_token(ref: str, by: str) -> TokenInfo:
    """Revoke the token with this id or prefix; revoking a revoked token changes nothing."""
    with transaction() as session:
        row = session.scalar(_by_ref(ref).with_for_update())
        if row is None:
            raise UnknownToken(f"no token has id or prefix {ref!r} (see nightshift tokens list)")
        if row.revoked_at is None:
            session.execute(
                update(ApiToken)
                .where(ApiToken.id == row.id)
                .values(revoked_at=func.now(), revoked_by=by)
            )
            # The pages re-check the token anyway; its sessions go with it all the same.
            session.execute(delete(StatusPageSession).where(StatusPageSession.token_id == row.id))
            session.refresh(row)
        return _info(row)


def _by_ref(ref: str) -> Select[ApiToken]:
    try:
        return select(ApiToken).where(ApiToken.id == uuid.UUID(ref))
    except ValueError:
        return select(ApiToken).where(ApiToken.prefix == ref[:SHOWN_PREFIX])


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        row.id,
        row.identity,
        row.prefix,
        row.note,
        row.created_by,
        row.created_at,
        row.last_used_at,
        row.revoked_at,
        row.revoked_by,
    )
