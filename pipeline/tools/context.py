"""What a tool receives besides its arguments (ToolContext) and what it may return (ToolOutput,
ArtifactRequest for a result kept as one of the run's artifacts)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from pipeline.settings import Settings
from pipeline.tools.agent_state import AgentState


@dataclass(frozen=True)
class ArtifactRequest:
    """A tool's output kept as one of the run's artifacts (in PostgreSQL, served by the API)
    rather than inline in the journal; at most NIGHTSHIFT_ARTIFACT_MAX_BYTES."""

    name: str
    content: str
    media_type: str = "text/plain"


ToolOutput = dict[str, Any] | str | ArtifactRequest | BaseModel


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: never a session, never a lease."""

    run_id: uuid.UUID
    agent: str
    tool_use_id: str
    settings: Settings
    run_input: dict[str, Any]
    batch_id: str | None = None
    """The batch this run belongs to, as the runtime recorded it: a child's batch, or the batch
    this run is the synthesis of; None for a run started on its own. Never the input's: an
    action key scoped to a night takes the night from here (docs/agents.md, "What may go into a
    key")."""
    idempotency_key: str | None = None
    """Set for side-effecting tools (and their lookup): send it to the service, e.g. as
    `Idempotency-Key`. Already namespaced by agent (see SideEffect.namespace)."""
    state: AgentState = field(default_factory=AgentState, repr=False)
    """The run's agent state (a plan, facts): `state.get("plan")`, `state.set("plan", [...])`;
    this call's changes are kept if it returns a result (docs/agents.md, "Agent state")."""
    keep_going: Callable[[], None] = field(default=lambda: None, repr=False)
    """Long tools call this between chunks of work: it raises (past any `except Exception`)
    when the run was cancelled, passed its deadline or lost its lease."""

    def config(self, name: str, default: str | None = None) -> str:
        """This deployment's setting `name` (`"acme.url"`): NIGHTSHIFT_CONFIG_ACME_URL, else
        `[acme] url` in NIGHTSHIFT_CONFIG_FILE, else `default`. Missing with no default: a
        PermanentError naming both places (the model sees it as the tool's error)."""
        return self.settings.config.get(name, default)
