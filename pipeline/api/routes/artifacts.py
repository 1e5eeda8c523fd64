"""/runs/{id}/artifacts/{artifact}: a run's artifact (a report, a large tool result) as it was
kept, read from PostgreSQL, so any API host serves what any worker wrote."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from pipeline.api.bodies import failures
from pipeline.api.guards import require_caller
from pipeline.errors import Gone
from pipeline.views.artifacts import artifact_bytes
from pipeline.views.runs import resolve_run_id

authed = APIRouter(dependencies=[Depends(require_caller)])

# Served as their own type only when a browser cannot run them; anything else as plain text.
_TEXT_TYPES = ("text/plain", "text/markdown", "text/csv", "application/json")
ArtifactId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The artifact's `id`.")]


@authed.get(
    "/runs/{run_id}/artifacts/{artifact_id}",
    tags=["runs"],
    response_class=Response,
    responses={
        200: {
            "content": {kind: {"schema": {"type": "string"}} for kind in _TEXT_TYPES},
            "description": "The artifact's content, as its media type (others as text/plain).",
        },
        **failures(401, 404, 410, 422),
    },
)
def artifact(run_id: str, artifact_id: ArtifactId) -> Response:
    """One of the run's artifacts (the run's state names them under `artifacts`, each with its
    `id` and this URL), as its own media type; 410 once retention deleted it."""
    kept = artifact_bytes(resolve_run_id(run_id), artifact_id)
    if kept.data is None:
        raise Gone(f"artifact {artifact_id} ({kept.name}): {kept.missing}")
    media_type = kept.media_type if kept.media_type in _TEXT_TYPES else "text/plain"
    return Response(
        kept.data,
        media_type=f"{media_type}; charset=utf-8",
        headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"},
    )
