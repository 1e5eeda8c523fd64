"""The Patch agent: drafts a fix for a bug report, asks a person before opening the pull
request, waits with no process running, and opens exactly one pull request on approval."""

from __future__ import annotations

from typing import Any

from pipeline.agent import Agent, Block, Conversation, text, tool_use
from pipeline.agents.services import GITHOST, find_open_pull, open_pull_request
from pipeline.tools import SideEffect, ToolContext, tool

REVIEWER = "reviewer@example.com"
"""Who approves pull requests unless NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST names others."""


def branch_for(issue: int) -> str:
    return f"patch/issue-{issue}"


@tool(
    description="Draft a fix for the bug report: returns a unified diff and a short rationale.",
    schema={
        "type": "object",
        "properties": {"issue": {"type": "integer", "minimum": 1}},
        "required": ["issue"],
        "additionalProperties": False,
    },
)
def draft_fix(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    # Scripted: a real deployment would call a code model or a repository tool here.
    report = context.run_input
    diff = (
        f"--- a/{report.get('file', 'app.py')}\n+++ b/{report.get('file', 'app.py')}\n"
        f"@@ fix for #{args['issue']}: {report['title']} @@\n"
        "-    total = price * quantity\n+    total = round(price * quantity, 2)\n"
    )
    return {"diff": diff, "rationale": f"Round the total to cents ({report['title']})."}


def _pr_key(args: dict[str, Any], context: ToolContext) -> str:
    return f"pr:{args['repo']}:{args['branch']}"


def _lookup(key: str, context: ToolContext) -> dict[str, Any] | None:
    _, repo, branch = key.split(":", 2)
    return find_open_pull(repo, branch, context)


@tool(
    description="Open a pull request with the drafted fix. A person must approve it first.",
    schema={
        "type": "object",
        "properties": {
            "repo": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"},
            "branch": {"type": "string", "pattern": "^patch/issue-[0-9]+$"},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string"},
        },
        "required": ["repo", "branch", "title", "body"],
        "additionalProperties": False,
    },
    # The git host refuses a second open pull request for a branch and can be asked for it.
    side_effect=SideEffect(service="githost", key=_pr_key, lookup=_lookup),
    needs=(GITHOST,),
    requires_approval=True,
    # A code reviewer opens pull requests; a deployment names them on its workers with
    # NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST=reviewer@acme.example.
    approvers=(REVIEWER,),
)
def open_fix_pull_request(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return open_pull_request(context, args["repo"], args["branch"], args["title"], args["body"])


def script(conversation: Conversation) -> list[Block]:
    report = conversation.input
    step = conversation.assistant_turns()
    used = {block["name"] for block in conversation.tool_uses()}
    if "draft_fix" not in used:
        return [text("Drafting a fix."), tool_use(step, 0, "draft_fix", {"issue": report["issue"]})]
    if "open_fix_pull_request" not in used:
        pull = {
            "repo": report["repo"],
            "branch": branch_for(report["issue"]),
            "title": f"Fix #{report['issue']}: {report['title']}",
            "body": f"Fixes #{report['issue']}.\n\n{conversation.tool_results()[0]['content']}",
        }
        return [tool_use(step, 0, "open_fix_pull_request", pull)]
    outcome = conversation.tool_results()[-1]["content"]
    return [text(f"Done with issue #{report['issue']}: {outcome}")]


AGENT = Agent(
    name="patch",
    system="You fix small bugs. Draft a minimal fix, then open one pull request for review.",
    instructions="Draft a fix with draft_fix, then open a pull request with open_fix_pull_request.",
    tools=(draft_fix, open_fix_pull_request),
    input_schema={
        "type": "object",
        "properties": {
            "issue": {"type": "integer", "minimum": 1},
            "repo": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string", "maxLength": 20000},
            "file": {"type": "string", "maxLength": 200},
        },
        "required": ["issue", "repo", "title"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=8,
)
