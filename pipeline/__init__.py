"""nightshift: durable AI-agent runs on Celery.

The authoring API, everything an agent's package needs (docs/agents.md). Everything else in
`pipeline` is the runtime's own and may move. `celery -A pipeline worker` finds the Celery
app here too.
"""

from typing import Any

from pipeline.agent import Agent
from pipeline.errors import LookupUnsupported, NotConfigured, PermanentError, TemporaryError
from pipeline.tools import ArtifactRequest, SideEffect, ToolContext, check_back_in, tool

__all__ = [
    "Agent",
    "ArtifactRequest",
    "LookupUnsupported",
    "NotConfigured",
    "PermanentError",
    "SideEffect",
    "TemporaryError",
    "ToolContext",
    "check_back_in",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "app":
        # Lazy: importing the authoring API must not configure Celery (which reads the
        # environment and may start the embedded services).
        from pipeline.app import app

        return app
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
