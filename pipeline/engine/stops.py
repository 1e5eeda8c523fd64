"""What a model reply's `stop_reason` means for the step.

- `end_turn`, `stop_sequence`: the turn is complete; with no tool call it is the final answer.
- `tool_use`: run the tools. `pause_turn`: the API paused a long turn; its content is sent
  back as-is in the next step, and the model continues it.
- `max_tokens`: cut off, so never acted on, not even its tool calls (a tool_use cut mid-JSON
  can look complete: the API drops the parameter it was writing). The step asks again with
  twice the room, up to the cap; past the cap the run fails with reason `truncated`.
- `refusal`: the run fails with reason `refusal`; `model_context_window_exceeded`: with reason
  `context_window` (more room cannot help); anything else: `model_error`.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import RunStopped

COMPLETE = frozenset({"end_turn", "stop_sequence", "tool_use", "pause_turn"})
CUT_OFF = "max_tokens"


def is_cut_off(reply: dict[str, Any]) -> bool:
    return reply.get("stop_reason") == CUT_OFF


def room_for(first: int, cap: int, attempt: int) -> int | None:
    """max_tokens for a step's `attempt`-th call (0 = the first): doubling from the agent's
    max_tokens up to the cap; None once a call at the cap was cut off too."""
    cap = max(cap, first)
    room = first
    for _ in range(attempt):
        if room >= cap:
            return None
        room = min(room * 2, cap)
    return room


def cut_off_stop(step: int, room: int) -> RunStopped:
    return RunStopped(
        "truncated",
        f"the model's reply in step {step} was cut off at max_tokens={room} "
        "(NIGHTSHIFT_MAX_TOKENS_CAP); nothing in it was acted on",
    )


def stop_for_reply(reply: dict[str, Any]) -> RunStopped | None:
    """Why the run must end on this (complete, journaled) reply, if it must."""
    reason = reply.get("stop_reason")
    if reason in COMPLETE:
        return None
    if reason == "refusal":
        details = reply.get("stop_details") or {}
        why = details.get("explanation") or details.get("category") or "no explanation given"
        return RunStopped("refusal", f"the model declined to continue: {why}")
    if reason == "model_context_window_exceeded":
        return RunStopped(
            "context_window", "the conversation no longer fits in the model's context window"
        )
    return RunStopped(
        "model_error", f"the model stopped for a reason nightshift does not know: {reason!r}"
    )
