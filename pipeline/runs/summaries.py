"""One line a person reads for a journal entry: the timeline's text, and all that retention
keeps of a compacted entry."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from pipeline.keys import EntryKind, entry_kind


def summarize(key: str, payload: dict[str, Any]) -> str:
    """One line a person can read for a journal entry."""
    if payload.get("compacted"):  # retention kept only this line
        return str(payload.get("summary", ""))
    kind = entry_kind(key)
    if kind is EntryKind.TIMER:
        return f"waits (no process) until {payload.get('wake_at')}"
    if kind is EntryKind.MODEL:
        parts = []
        for block in payload.get("content", []):
            if block["type"] == "tool_use":
                parts.append(f"asks {block['name']}({json.dumps(block['input'])[:60]})")
            elif block["type"] == "text" and block.get("text"):
                parts.append(repr(block["text"][:60]))
        usage = payload.get("usage", {})
        tokens = f"[{usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)} tok]"
        return f"model {tokens} " + "; ".join(parts)
    if kind is EntryKind.CUT:
        out = (payload.get("usage") or {}).get("output_tokens", 0)
        return f"reply cut off at max_tokens={payload.get('max_tokens')} ({out} tok); asked again"
    if kind is EntryKind.TOOL:
        status = "error" if payload.get("is_error") else "ok"
        line = f"{payload.get('name')} -> {status}: {str(payload.get('content'))[:70]!r}"
        kept = payload.get("state")  # the agent state the call left (engine/state_replay.py)
        return line if kept is None else f"{line}; state: {', '.join(sorted(kept)) or 'empty'}"
    return str(payload.get("text", ""))[:90]


def outline(key: str, step_name: str, payload: dict[str, Any]) -> str:
    """A journal entry's line without any text the run carried (what the model wrote, the
    arguments it asked with, what a tool returned): what retention keeps of it."""
    if payload.get("outline"):  # already outlined
        return str(payload.get("summary", ""))
    if payload.get("compacted"):  # compacted before outlines: its summary quoted the text
        return step_name
    kind = entry_kind(key)
    if kind is EntryKind.MODEL:
        content = payload.get("content", [])
        asked = [block["name"] for block in content if block["type"] == "tool_use"]
        usage = payload.get("usage", {})
        tokens = f"[{usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)} tok]"
        return f"model {tokens}" + (f"; asks {', '.join(asked)}" if asked else "")
    if kind is EntryKind.TOOL:
        return f"{payload.get('name')} -> {'error' if payload.get('is_error') else 'ok'}"
    if kind in (EntryKind.TIMER, EntryKind.CUT):
        return summarize(key, payload)  # times and token counts only
    return step_name  # a note or a once(): its text is the run's


def describe(key: str, payload: dict[str, Any]) -> str:
    """All of a journal entry a person can read, newlines kept: what the model wrote and the
    arguments it asked with, or the tool's whole result (the timeline's expanded entry)."""
    if payload.get("compacted"):
        return str(payload.get("summary", ""))
    kind = entry_kind(key)
    if kind in (EntryKind.MODEL, EntryKind.CUT):
        parts = []
        for block in payload.get("content", []):
            if block["type"] == "text" and block.get("text"):
                parts.append(block["text"])
            elif block["type"] == "tool_use":
                arguments = json.dumps(block["input"], indent=2, ensure_ascii=False)
                parts.append(f"asks {block['name']} with\n{arguments}")
        return "\n\n".join(parts)
    if kind is EntryKind.TOOL:
        content = payload.get("content")
        text = content if isinstance(content, str) else json.dumps(content, indent=2)
        with contextlib.suppress(ValueError):  # a JSON result reads better indented
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        return ("error: " if payload.get("is_error") else "") + text
    if kind is EntryKind.TIMER:
        return f"waits (no process) until {payload.get('wake_at')}"
    return str(payload.get("text", ""))
