"""What the sandbox model says: the default responder and helpers for scripted ones."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pipeline.engine.llm import scripted_reply
from pipeline.registry import all_agents

Responder = Callable[[dict[str, Any]], dict[str, Any]]
"""Request JSON in, assistant message out; missing fields (id, usage, ...) are filled in."""


def agent_responder(request: dict[str, Any]) -> dict[str, Any]:
    """Answer a Messages API request as the registered agent with that system prompt would.

    Serves the local Messages API server, so the real SDK path runs the same scripts.
    """
    system = text_of(request.get("system"))  # a string, or blocks with cache breakpoints
    agent = next((a for a in all_agents() if a.system == system and a.script), None)
    if agent is None:
        raise ValueError("no registered agent with a script has this system prompt")
    return scripted_reply(agent, request["messages"], model=request.get("model", "local"))


def text_reply(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}


def tool_use_reply(
    name: str, tool_input: dict[str, Any], text: str | None = None
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": new_id("toolu"), "name": name, "input": tool_input})
    return {"content": content, "stop_reason": "tool_use"}


def default_responder(request: dict[str, Any]) -> dict[str, Any]:
    """Call the first tool once; after tool results (or with no tools), finish with a summary."""
    tools = request.get("tools") or []
    results = [b for b in content_blocks(request["messages"][-1]) if b.get("type") == "tool_result"]
    if results or not tools:
        texts = [text_of(b.get("content")) for b in results] or [
            text_of(request["messages"][-1].get("content"))
        ]
        gist = " | ".join(t[:200] for t in texts if t)
        return text_reply(f"Summary ({len(results)} tool result(s)): {gist[:600]}")
    tool = tools[0]
    return tool_use_reply(tool["name"], placeholder_input(tool.get("input_schema") or {}))


def placeholder_input(schema: dict[str, Any]) -> dict[str, Any]:
    """The smallest input that fills a JSON schema's required properties."""
    props = schema.get("properties") or {}
    return {name: _placeholder(props.get(name) or {}) for name in schema.get("required") or []}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(text_of(b.get("text")) for b in content if isinstance(b, dict))
    return ""


def _placeholder(schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        return placeholder_input(schema)
    return {"integer": 1, "number": 1, "boolean": False, "array": []}.get(str(kind), "sandbox")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
