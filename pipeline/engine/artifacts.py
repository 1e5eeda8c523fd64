"""Large outputs (a report, a big tool result) kept in PostgreSQL, named by id and API URL.

An artifact is written in the same fenced transaction as its tool call's journal entry: a
crash before the commit leaves neither (the call runs again), after it both (the call is
replayed from the journal), so there is never an orphan or a second copy. Every host reads it
from the database; nothing is kept on a worker's disk.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import artifact_url
from pipeline.db import transaction
from pipeline.errors import ArtifactTooLarge


@dataclass(frozen=True)
class Pending:
    """An artifact to store with its tool call's journal entry; `ref` is what the journal,
    the run's state and the model see of it."""

    run_id: uuid.UUID
    ref: dict[str, Any]
    data: bytes
    media_type: str


def next_id() -> int:
    """An artifact's id, taken before the fenced transaction (whose fence check must be its
    first statement; an id a crash leaves unused is only a gap)."""
    with transaction() as session:
        row = statements.first(session, "next_artifact_id")
        assert row is not None
        return int(row.id)


def prepare(
    run_id: uuid.UUID,
    name: str,
    content: str,
    media_type: str,
    limit: int,
) -> Pending:
    """Check the size and take the artifact's id."""
    data = content.encode()
    if len(data) > limit:
        raise ArtifactTooLarge(
            f"{name} is {len(data)} bytes, over the {limit}-byte artifact limit "
            "(NIGHTSHIFT_ARTIFACT_MAX_BYTES); nothing was kept"
        )
    artifact_id = next_id()
    ref = {
        "id": artifact_id,
        "name": name,
        "url": artifact_url(run_id, artifact_id),
        "media_type": media_type,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    return Pending(run_id, ref, data, media_type)


def store_txn(session: Session, pending: Pending) -> None:
    """Insert the artifact and name it in the run's state.artifacts, in the caller's
    (fenced) transaction."""
    ref = pending.ref
    statements.execute(
        session, "store_artifact", id=ref["id"], run_id=pending.run_id, name=ref["name"],
        sha256=ref["sha256"], size=ref["size"], media_type=pending.media_type,
        content=pending.data, ref=statements.jsonb({ref["name"]: ref}),
    )  # fmt: skip


def preview(content: str, ref: dict[str, Any], limit: int = 400) -> str:
    """What the model sees instead of a large output."""
    head = content[:limit]
    return (
        f"[stored as artifact {ref['id']} at {ref['url']} ({ref['size']} bytes, sha256 "
        f"{ref['sha256'][:16]}); first {len(head)} characters follow]\n{head}"
    )
