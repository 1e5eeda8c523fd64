"""One artifact's content, from PostgreSQL: for a person to read (the status page) or a
client to fetch (the API); whichever host wrote it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select

from models import Artifact
from pipeline.db import read_only
from pipeline.errors import UnknownArtifact

MAX_SHOWN_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ArtifactContent:
    name: str
    media_type: str
    size: int
    text: str | None
    """None when the content is gone (retention deleted it, or its file was missing when
    artifacts moved into PostgreSQL); `missing` says why."""
    missing: str | None = None
    truncated: bool = False


def read_artifact(run_id: uuid.UUID, artifact_id: int) -> ArtifactContent:
    """The first MAX_SHOWN_BYTES as text, for the status page."""
    with read_only() as session:
        row = session.execute(
            select(Artifact.name, Artifact.media_type, Artifact.size, Artifact.deleted_at,
                   Artifact.missing, func.substring(Artifact.content, 1, MAX_SHOWN_BYTES + 1))
            .where(Artifact.run_id == run_id, Artifact.id == artifact_id)
        ).one_or_none()  # fmt: skip
    if row is None:
        raise UnknownArtifact(f"run {run_id} has no artifact {artifact_id}")
    name, media_type, size, deleted_at, missing, data = row
    why = _why_missing(deleted_at, missing) if data is None else None
    if why is not None:
        return ArtifactContent(name, media_type, size, None, missing=why)
    text = data[:MAX_SHOWN_BYTES].decode("utf-8", errors="replace")
    return ArtifactContent(name, media_type, size, text, truncated=len(data) > MAX_SHOWN_BYTES)


@dataclass(frozen=True)
class ArtifactBytes:
    name: str
    media_type: str
    data: bytes | None
    missing: str | None = None


def artifact_bytes(run_id: uuid.UUID, artifact_id: int) -> ArtifactBytes:
    """The whole content, for the API (bounded by NIGHTSHIFT_ARTIFACT_MAX_BYTES when written)."""
    with read_only() as session:
        row = session.execute(
            select(Artifact.name, Artifact.media_type, Artifact.deleted_at, Artifact.missing,
                   Artifact.content)
            .where(Artifact.run_id == run_id, Artifact.id == artifact_id)
        ).one_or_none()  # fmt: skip
    if row is None:
        raise UnknownArtifact(f"run {run_id} has no artifact {artifact_id}")
    name, media_type, deleted_at, missing, data = row
    why = _why_missing(deleted_at, missing) if data is None else None
    return ArtifactBytes(name, media_type, data, why)


def _why_missing(deleted_at: object, missing: str | None) -> str:
    if deleted_at is not None:
        return f"deleted by retention on {deleted_at:%Y-%m-%d}"
    return missing or "no content stored"
