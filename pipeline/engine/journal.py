"""Record and replay: every model reply and tool result is journaled before it is acted on."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

import pipeline.statements as statements
from pipeline.agent_definition import Agent, Block, Message
from pipeline.errors import NonDeterminism
from pipeline.keys import cut_key, model_key, note_key, tool_key

MODEL_STEP = "ask_model"
CUT_STEP = "cut_off"
NOTE_STEP = "note"


@dataclass(frozen=True)
class Entry:
    key: str
    step: int
    step_name: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Seen:
    """A run's journal as this process last read it: the last entry's id, the entries, and the
    entries by key (copies its reader may extend)."""

    last_id: int
    entries: list[Entry]
    by_key: dict[str, Entry]


class _SeenEntries:
    """Per process: the journal entries already read, by run (in order, and by key), so a long
    run's step reads only what is new and indexes only that. Safe because a run's entries are
    only appended, one fenced transaction at a time (so their ids grow in commit order)."""

    def __init__(self, runs: int = 256) -> None:
        self._runs = runs
        self._seen: OrderedDict[uuid.UUID, tuple[int, list[Entry], dict[str, Entry]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, run_id: uuid.UUID) -> Seen:
        """(the last id read, the entries, the entries by key): copies the caller may extend."""
        with self._lock:
            seen = self._seen.get(run_id)
            if seen is None:
                return Seen(0, [], {})
            self._seen.move_to_end(run_id)
            return Seen(seen[0], list(seen[1]), dict(seen[2]))

    def put(
        self, run_id: uuid.UUID, last_id: int, entries: list[Entry], by_key: dict[str, Entry]
    ) -> None:
        with self._lock:
            self._seen[run_id] = (last_id, list(entries), dict(by_key))
            self._seen.move_to_end(run_id)
            while len(self._seen) > self._runs:
                self._seen.popitem(last=False)


_CACHE = _SeenEntries()


class _Conversations:
    """Per process: the conversation of each run as built up to some step."""

    def __init__(self, runs: int = 256) -> None:
        self._runs = runs
        self._built: OrderedDict[uuid.UUID, tuple[int, list[Message]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: uuid.UUID, before_step: int) -> tuple[int, list[Message]]:
        """The longest conversation built that does not go past `before_step`."""
        with self._lock:
            built = self._built.get(run_id)
            if built is None or built[0] > before_step:
                return 0, []
            return built[0], list(built[1])

    def put(self, run_id: uuid.UUID, until: int, messages: list[Message]) -> None:
        with self._lock:
            self._built[run_id] = (until, list(messages))
            self._built.move_to_end(run_id)
            while len(self._built) > self._runs:
                self._built.popitem(last=False)


_CONVERSATIONS = _Conversations()


class Journal:
    """A run's journal as loaded at the start of a step, plus what this step adds."""

    def __init__(self, run_id: uuid.UUID, entries: list[Entry], by_key: dict[str, Entry]) -> None:
        self.run_id = run_id
        self.entries = entries
        self._by_key = by_key
        self._deferred: list[Entry] = []

    @staticmethod
    def seen(run_id: uuid.UUID) -> Seen:
        """What this process has read of the run's journal: a step's claim reads only what is
        newer (schema.sql's nightshift_claim, after `last_id`)."""
        return _CACHE.get(run_id)

    @classmethod
    def extended(cls, run_id: uuid.UUID, seen: Seen, rows: list[Any]) -> Journal:
        """The run's journal: what was `seen`, and the rows (id, key, step, step_name, payload)
        read after it."""
        entries, by_key = seen.entries, seen.by_key
        for row in rows:
            entry = Entry(row.key, row.step, row.step_name, row.payload)
            entries.append(entry)
            by_key[entry.key] = entry
        if rows:
            _CACHE.put(run_id, rows[-1].id, entries, by_key)
        return cls(run_id, entries, by_key)

    def replay(self, key: str, step_name: str) -> dict[str, Any] | None:
        """The journaled payload for `key` or None; another step name means the code changed."""
        entry = self._by_key.get(key)
        if entry is None:
            return None
        if entry.step_name != step_name:
            raise NonDeterminism(
                f"run {self.run_id}: journal entry {key!r} was written by step {entry.step_name!r} "
                f"but the code now asks for {step_name!r}; the agent changed under a running run"
            )
        return entry.payload

    def cut_offs(self, step: int) -> list[dict[str, Any]]:
        """The replies of `step` that were cut off at max_tokens, in the order they came."""
        found: list[dict[str, Any]] = []
        while (entry := self.replay(cut_key(step, len(found)), CUT_STEP)) is not None:
            found.append(entry)
        return found

    def append_txn(
        self, session: Session, key: str, step: int, step_name: str, payload: dict[str, Any]
    ) -> None:
        """Insert inside the caller's fenced transaction; remembered once that commits."""
        statements.execute(
            session, "journal_append", run_id=self.run_id, key=key, step=step,
            step_name=step_name, payload=statements.jsonb(payload),
        )  # fmt: skip
        self.remember(key, step, step_name, payload)

    def defer(self, key: str, step: int, step_name: str, payload: dict[str, Any]) -> None:
        """Journal this entry in the step's checkpoint statement (take_deferred) instead of
        one of its own: the step's last write before the checkpoint."""
        self._deferred.append(Entry(key, step, step_name, payload))
        self.remember(key, step, step_name, payload)

    def take_deferred(self) -> list[Entry]:
        """The deferred entries, for the checkpoint's statement (which writes them only if the
        fence is current); they are then no longer deferred."""
        deferred, self._deferred = self._deferred, []
        return deferred

    def remember(self, key: str, step: int, step_name: str, payload: dict[str, Any]) -> None:
        """An entry its caller has just committed (or will write with the checkpoint)."""
        entry = Entry(key, step, step_name, payload)
        self.entries.append(entry)
        self._by_key[key] = entry

    def messages(
        self, agent: Agent, run_input: dict[str, Any], before_step: int, *, remember: bool = True
    ) -> list[Message]:
        """Rebuild the conversation from the journal instead of storing it again each step.

        Checkpointed steps never change, so the conversation up to a step this process built
        before is reused and only the newer steps are added. `remember=False` when
        `before_step` includes the step still being worked on.
        """
        built_until, messages = _CONVERSATIONS.get(self.run_id, before_step)
        if not messages:
            messages = [agent.first_message(run_input)]
        for step in range(built_until, before_step):
            reply = self._by_key.get(model_key(step))
            if reply is None:
                continue
            content = reply.payload["content"]
            messages.append({"role": "assistant", "content": content})
            user = self._results_for(content) + self._note_for(step)
            if user:
                messages.append({"role": "user", "content": user})
        if remember:
            _CONVERSATIONS.put(self.run_id, before_step, messages)
        return list(messages)

    def _results_for(self, content: list[Block]) -> list[Block]:
        blocks = []
        for block in content:
            if block["type"] != "tool_use":
                continue
            entry = self._by_key.get(tool_key(block["id"]))
            if entry is not None:
                blocks.append(tool_result_block(entry.payload))
        return blocks

    def _note_for(self, step: int) -> list[Block]:
        entry = self._by_key.get(note_key(step))
        return [{"type": "text", "text": entry.payload["text"]}] if entry else []


def tool_result_block(payload: dict[str, Any]) -> Block:
    block: Block = {
        "type": "tool_result",
        "tool_use_id": payload["tool_use_id"],
        "content": payload["content"],
    }
    if payload.get("is_error"):
        block["is_error"] = True
    return block
