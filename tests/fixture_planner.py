"""An agent that keeps its plan in the run's agent state: step 0 writes the plan, step 1 ticks
off every item (one call an item, in one reply), and its success check reads the state."""

from __future__ import annotations

from typing import Any

from pipeline import Agent, Conversation, PermanentError, ToolContext, text, tool, tool_use

ITEMS = ["draft", "review", "send"]


@tool
def write_plan(items: list[str], context: ToolContext) -> dict[str, Any]:
    """Keep the plan: the items to do, in order."""
    context.state.set("plan", items)
    context.state.set("done", [])
    return {"planned": len(items)}


@tool
def tick_off(item: str, context: ToolContext) -> dict[str, Any]:
    """Mark one item of the plan done."""
    plan = context.state.get("plan")
    if plan is None or item not in plan:
        raise PermanentError(f"{item!r} is not in the plan ({plan!r})")
    done = context.state.get("done", [])
    context.state.set("done", [*done, item])
    return {"done": len(done) + 1, "of": len(plan)}


def _plan_then_do(conversation: Conversation) -> list[dict[str, Any]]:
    turn = conversation.assistant_turns()
    if turn == 0:
        return [tool_use(0, 0, "write_plan", {"items": list(conversation.input["items"])})]
    if turn == 1:
        return [
            tool_use(1, index, "tick_off", {"item": item})
            for index, item in enumerate(conversation.input["items"])
        ]
    return [text("Every item is done.")]


def plan_done(conversation: Conversation) -> bool:
    """The success check: every item of the plan, done once, in order."""
    state = conversation.state
    return state.get("plan") is not None and state.get("done") == state.get("plan")


PLANNER = Agent(
    name="planner",
    system="You plan a short job, then do it item by item.",
    instructions="Write the plan with write_plan, then tick_off each item.",
    tools=(write_plan, tick_off),
    input_schema={
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string"}}},
        "required": ["items"],
    },
    script=_plan_then_do,
    check_success=plan_done,
)
