"""One artifact's content for a person to read, from the file its row names."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from models import Artifact
from pipeline.db import read_only
from pipeline.errors import NightshiftError
from pipeline.settings import get_settings

MAX_SHOWN_BYTES = 1024 * 1024


class UnknownArtifact(NightshiftError):
    """The run has no artifact with that id."""


@dataclass(frozen=True)
class ArtifactContent:
    name: str
    media_type: str
    size: int
    text: str | None
    """None when the file is gone (retention deleted it) or is not inside the artifact
    directory; `missing` says why."""
    missing: str | None = None
    truncated: bool = False


def read_artifact(run_id: uuid.UUID, artifact_id: int) -> ArtifactContent:
    with read_only() as session:
        row = session.scalar(
            select(Artifact).where(Artifact.run_id == run_id, Artifact.id == artifact_id)
        )
    if row is None:
        raise UnknownArtifact(f"run {run_id} has no artifact {artifact_id}")
    shown = ArtifactContent(row.name, row.media_type, row.size, None)
    if row.deleted_at is not None:
        return _missing(shown, f"deleted by retention on {row.deleted_at:%Y-%m-%d}")
    root = get_settings().artifact_dir.resolve()
    path = Path(row.path).resolve()
    if not path.is_relative_to(root):  # only files nightshift wrote are ever shown
        return _missing(shown, "kept outside the artifact directory; not shown")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SHOWN_BYTES + 1)
    except OSError:
        return _missing(shown, f"the file is not there any more ({path.name})")
    text = data[:MAX_SHOWN_BYTES].decode("utf-8", errors="replace")
    return ArtifactContent(
        row.name, row.media_type, row.size, text, truncated=len(data) > MAX_SHOWN_BYTES
    )


def _missing(shown: ArtifactContent, why: str) -> ArtifactContent:
    return ArtifactContent(shown.name, shown.media_type, shown.size, None, missing=why)
