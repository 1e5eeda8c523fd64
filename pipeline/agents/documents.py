"""A tool the shipped agents share: keep a markdown document as one of the run's artifacts."""

from __future__ import annotations

from typing import Any

from pipeline import ArtifactRequest, ToolContext, tool
from pipeline.tools import Tool

_DOCUMENT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "body": {"type": "string", "minLength": 1},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


def document_tool(name: str, artifact: str, description: str) -> Tool:
    """A tool that keeps a markdown document (title, body) as the run's `artifact`.

    Kept in PostgreSQL with the call's journal entry, so a crash never leaves a second copy.
    """

    def write(args: dict[str, Any], context: ToolContext) -> ArtifactRequest:
        return ArtifactRequest(artifact, f"# {args['title']}\n\n{args['body']}\n", "text/markdown")

    return tool(name=name, description=description, schema=_DOCUMENT_SCHEMA)(write)
