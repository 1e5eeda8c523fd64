"""What an agent is: a system prompt, tools, an input schema, limits and a scripted model."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from pipeline.tools import Tool

Message = dict[str, Any]
Block = dict[str, Any]

_INPUT_BLOCK = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Conversation:
    """What a scripted model (or a success check) sees: the run's input and the messages so far."""

    input: dict[str, Any]
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)

    def tool_results(self) -> list[Block]:
        return [
            block
            for message in self.messages
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]

    def tool_uses(self) -> list[Block]:
        """Every tool_use block the model has written so far, oldest first."""
        return [
            block
            for message in self.messages
            if message["role"] == "assistant"
            for block in message["content"]
            if block["type"] == "tool_use"
        ]

    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def last_text(self) -> str:
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return " ".join(
                    b.get("text", "") for b in message["content"] if b["type"] == "text"
                )
        return ""


Script = Callable[[Conversation], list[Block]]


@dataclass(frozen=True)
class Agent:
    name: str
    system: str
    instructions: str
    tools: tuple[Tool, ...]
    input_schema: dict[str, Any]
    script: Script
    """The deterministic stand-in for the model: what it would answer to this conversation."""
    max_steps: int = 20
    max_tokens: int = 1024
    """Per model call (the Messages API's max_tokens)."""
    max_tool_calls: int | None = None
    """Per run; the run stops with reason max_tool_calls when it would exceed it."""
    max_run_tokens: int | None = None
    """Per run, input plus output over all model calls."""
    check_success: Callable[[Conversation], bool] | None = None

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def input_errors(self, run_input: object) -> list[str]:
        validator = Draft202012Validator(self.input_schema)
        errors = sorted(validator.iter_errors(run_input), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]

    def first_message(self, run_input: dict[str, Any]) -> Message:
        body = json.dumps(run_input, sort_keys=True, indent=2)
        return {"role": "user", "content": f"{self.instructions}\n\nInput:\n```json\n{body}\n```"}

    @property
    def prompt_version(self) -> str:
        """Changes whenever the prompt, the tools or the model settings change."""
        described = {
            "system": self.system,
            "instructions": self.instructions,
            "tools": [t.spec() for t in self.tools],
            "max_tokens": self.max_tokens,
        }
        digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
        return digest.hexdigest()[:16]


def input_from_messages(messages: list[Message]) -> dict[str, Any]:
    """Recover the run's input from the first user message (used by the local Messages API)."""
    first = messages[0]["content"] if messages else ""
    text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
    match = _INPUT_BLOCK.search(text)
    return json.loads(match.group(1)) if match else {}


def tool_use(step: int, index: int, name: str, args: dict[str, Any]) -> Block:
    """A tool_use block with a deterministic id, as a scripted model writes it."""
    return {"type": "tool_use", "id": f"toolu_s{step:03d}_{index}", "name": name, "input": args}


def text(body: str) -> Block:
    return {"type": "text", "text": body}
