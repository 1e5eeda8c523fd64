"""An agent whose tool kills its pool child slowly, once a run: first the child's files close (as
a dying process's do, before its parent can reap it), and DYING_SECONDS later the process ends.
For the prefork pool's tests; registered through NIGHTSHIFT_AGENTS like a user's own, so a
worker imports it before its pool forks: each pool child then writes down, as it starts, the
modules it was forked with that a step may need (in POOL_CHILDREN_DIR, when that is set)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init

from pipeline import Agent, ToolContext, text, tool, tool_use
from pipeline.agent_definition import Block, Conversation

FIRST_FILE = 3
"""stdin, stdout and stderr stay open (the worker's log): every file after them closes."""


@tool(
    description="Count the input's letters (the first call of a run kills its process).",
    schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
        "additionalProperties": False,
    },
)
def count_letters(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    died = Path(os.environ["DYING_DIR"]) / str(context.run_id)
    if not died.exists():
        seconds = float(os.environ["DYING_SECONDS"])
        died.write_text(f"{time.time() + seconds}")  # when this process ends
        os.closerange(FIRST_FILE, os.sysconf("SC_OPEN_MAX"))
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGKILL)
    return {"letters": len(args["word"])}


def _count_script(conversation: Conversation) -> list[Block]:
    if not conversation.tool_results():
        return [tool_use(0, 0, "count_letters", {"word": conversation.input["word"]})]
    return [text("Counted.")]


DIES_SLOWLY = Agent(
    name="dies_slowly",
    system="You count letters.",
    instructions="Count the input's letters with the count_letters tool, then say you did.",
    tools=(count_letters,),
    input_schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
    },
    script=_count_script,
)


@worker_process_init.connect
def _note_what_the_child_started_with(**_: Any) -> None:
    if "POOL_CHILDREN_DIR" in os.environ:
        noted = Path(os.environ["POOL_CHILDREN_DIR"]) / str(os.getpid())
        written = noted.with_suffix(".writing")  # renamed once whole: a reader sees all or none
        written.write_text(json.dumps({"anthropic": "anthropic" in sys.modules}))
        written.rename(noted)
