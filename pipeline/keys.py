"""Every key and `waiting_on` format nightshift writes, built and parsed here and nowhere else.

Journal keys: `model:<step>`, `cut:<step>:<attempt>` (a reply cut off at max_tokens, asked
again), `tool:<tool_use_id>`, `note:<step>`, `timer:<tool_use_id>`, `once:<key>`.
Action keys: `<namespace>:<key>` (the namespace is the agent's name unless the side effect
names a shared one).
Waits (`runs.waiting_on`): `approval:<action key>`, `action:<action key>` (a person must say
what happened), `timer:<tool_use_id>`, `retry:<action key>` (a service kept failing),
`conflict:<action key>` (another run owns that key), `claimed:<action key>` (another run
settled that key: a person ends this run), `model:<model>` (the model provider is
down: waiting out the outage), `turn:<agent>` (the agent's max_concurrent_runs are busy),
`rate:<model>` (the model's rate limits: waiting for the time reserved for the call).
Run keys: `<schedule>:<slot>`, `event:<source>:<event id>`, `<batch>:child:<n>`,
`<batch>:synthesis`, `retry-of:<run id>` (the retry of a failed or cancelled run),
`fork-of:<run id>:<step>` (a finished run forked from one of its steps): forms a caller's key
may not take (runtime_run_key).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from pipeline.errors import InvalidInput

MAX_KEY_LENGTH = 200


def check_key(key: object, what: str = "idempotency key") -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(
            f"{what} must be a non-empty string of at most {MAX_KEY_LENGTH} characters "
            f"(got {type(key).__name__} {str(key)[:40]!r})"
        )
    return key


# -- the journal -----------------------------------------------------------------------------


class EntryKind(StrEnum):
    MODEL = "model"
    CUT = "cut"
    """A model reply cut off at max_tokens: kept for its cost, never acted on."""
    TOOL = "tool"
    NOTE = "note"
    TIMER = "timer"
    ONCE = "once"


def entry_kind(key: str) -> EntryKind | None:
    """What a journal key records (None for a key of some other format)."""
    try:
        return EntryKind(key.partition(":")[0])
    except ValueError:
        return None


def model_key(step: int) -> str:
    return f"model:{step}"


def cut_key(step: int, attempt: int) -> str:
    return f"cut:{step}:{attempt}"


def tool_key(tool_use_id: str) -> str:
    return f"tool:{tool_use_id}"


def note_key(step: int) -> str:
    return f"note:{step}"


def timer_key(tool_use_id: str) -> str:
    return f"timer:{tool_use_id}"


def once_key(key: str) -> str:
    return f"once:{check_key(key, 'the key of once()')}"


# -- actions ---------------------------------------------------------------------------------


def action_key(namespace: str, key: str) -> str:
    """A side effect's idempotency key: what the action means, in its namespace."""
    return f"{namespace}:{key}"


# -- waits -----------------------------------------------------------------------------------


class WaitKind(StrEnum):
    APPROVAL = "approval"
    """A person approves or rejects a pending action."""
    ACTION = "action"
    """A person says whether an action whose outcome is unknown happened."""
    TIMER = "timer"
    RETRY = "retry"
    """A service kept failing with nothing in flight: try again at wake_at."""
    CONFLICT = "conflict"
    """Another run owns the action's key and may still send it: wait until it is settled
    (done, failed, rejected or released), or for a person to cancel this run."""
    CLAIMED = "claimed"
    """Another run owns the action's key and settled it there, not as this run means it (with
    other arguments, or a person decided it for that run): nothing will change that, so only a
    person moves this run on (cancels it)."""
    MODEL = "model"
    """The model provider kept failing: the tick wakes the run once a probe got a reply."""
    TURN = "turn"
    """The agent's max_concurrent_runs are in a step: the run waits for one to end, in order."""
    RATE = "rate"
    """The model's calls reached its rate limits: the run waits for its reserved time."""
    VERSION = "version"
    """The agent changed under the run (its policy parks it, or a journaled call names a tool
    it no longer has): a person allows it to go on under this version, or cancels it."""


@dataclass(frozen=True)
class Wait:
    kind: WaitKind
    ref: str
    """The action's idempotency key, the timer's tool_use_id, the model's name, or the agent
    version."""

    def __str__(self) -> str:
        return f"{self.kind}:{self.ref}"

    @classmethod
    def parse(cls, waiting_on: str) -> Wait:
        kind, _, ref = waiting_on.partition(":")
        return cls(WaitKind(kind), ref)

    @property
    def action_key(self) -> str | None:
        """The action a person decides, for the waits a person settles."""
        return self.ref if self.kind in (WaitKind.APPROVAL, WaitKind.ACTION) else None


def approval_wait(action_key: str) -> Wait:
    return Wait(WaitKind.APPROVAL, action_key)


def person_wait(action_key: str) -> Wait:
    return Wait(WaitKind.ACTION, action_key)


def timer_wait(tool_use_id: str) -> Wait:
    return Wait(WaitKind.TIMER, tool_use_id)


def retry_wait(action_key: str) -> Wait:
    return Wait(WaitKind.RETRY, action_key)


def conflict_wait(action_key: str) -> Wait:
    return Wait(WaitKind.CONFLICT, action_key)


def claimed_wait(action_key: str) -> Wait:
    return Wait(WaitKind.CLAIMED, action_key)


def model_wait(model: str) -> Wait:
    return Wait(WaitKind.MODEL, model)


MODEL_WAIT_PREFIX = f"{WaitKind.MODEL}:"
"""What `waiting_on` starts with for every run waiting on a model provider (SQL LIKE)."""


def turn_wait(agent: str) -> Wait:
    return Wait(WaitKind.TURN, agent)


def rate_wait(model: str) -> Wait:
    return Wait(WaitKind.RATE, model)


def version_wait(agent_version: str) -> Wait:
    return Wait(WaitKind.VERSION, agent_version)


# -- run keys --------------------------------------------------------------------------------


def slot_key(schedule: str, slot: datetime) -> str:
    """`<schedule>:<slot>` (slot in UTC ISO): the idempotency key and batch id of a slot."""
    return f"{schedule}:{slot.astimezone(UTC).isoformat()}"


def event_key(source: str, event_id: str) -> str:
    return check_key(f"event:{source}:{check_key(event_id, 'event id')}", "event:<source>:<id>")


def child_key(batch_id: str, index: int) -> str:
    return f"{batch_id}:child:{index}"


def synthesis_key(batch_id: str) -> str:
    return f"{batch_id}:synthesis"


def batch_of_synthesis(key: str) -> str | None:
    """The batch id of a synthesis run's key, None for any other key."""
    return key.removesuffix(":synthesis") if key.endswith(":synthesis") else None


RETRY_PREFIX = "retry-of:"


def retry_key(run_id: uuid.UUID) -> str:
    """`retry-of:<run id>`: the key of a run's retry, so a run is retried once (its retry is
    retried in turn) and each retry names its origin."""
    return f"{RETRY_PREFIX}{run_id}"


def retried_run(key: str | None) -> uuid.UUID | None:
    """The run a retry's key names, None for any other key."""
    if key is None or not key.startswith(RETRY_PREFIX):
        return None
    try:
        return uuid.UUID(key.removeprefix(RETRY_PREFIX))
    except ValueError:
        return None


FORK_PREFIX = "fork-of:"


@dataclass(frozen=True)
class ForkOf:
    """What a fork's key names: the run it was forked from, and the step it went on live at."""

    run_id: uuid.UUID
    step: int


def fork_key(run_id: uuid.UUID, step: int) -> str:
    """`fork-of:<run id>:<step>`: the key of a run's fork from `step`, so a run is forked from
    a step once (asking again answers with that fork) and each fork names its origin."""
    return f"{FORK_PREFIX}{run_id}:{step}"


def forked_from(key: str | None) -> ForkOf | None:
    """The run and step a fork's key names, None for any other key."""
    if key is None or not key.startswith(FORK_PREFIX):
        return None
    run, _, step = key.removeprefix(FORK_PREFIX).partition(":")
    try:
        return ForkOf(uuid.UUID(run), int(step))
    except ValueError:
        return None


_CHILD_END = re.compile(r":child:[0-9]+$")
_SLOT_END = re.compile(r":[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?\+00:00$")


def runtime_run_key(key: str) -> str | None:
    """Whose own run-key form `key` has, None for a key a caller may choose. A caller that
    took such a key first would hold the run nightshift starts under it: a night's synthesis
    (its join then fails on the key), a slot's run, an event's, a retry."""
    if key.startswith(RETRY_PREFIX):
        return f"keys starting {RETRY_PREFIX!r} are the retries' own (nightshift runs retry RUN)"
    if key.startswith(FORK_PREFIX):
        return f"keys starting {FORK_PREFIX!r} are the forks' own (nightshift runs fork RUN)"
    if key.startswith("event:"):
        return "keys starting 'event:' are external events' own (POST /events/<source>)"
    if batch_of_synthesis(key) is not None or _CHILD_END.search(key):
        return "keys ending ':synthesis' or ':child:<n>' are batches' own"
    if _SLOT_END.search(key):
        return "keys ending ':<UTC instant>' (':2026-11-30T07:00:00+00:00') are schedule slots' own"
    return None
