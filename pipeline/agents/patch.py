"""The Patch agent: fixes a bug in a real git repository. It reads the code, runs the tests,
applies and tests its change in the issue's own worktree and branch, then asks a person;
only once approved does it commit, push the branch and open the pull request, once.

Push is part of the approved side effect: nothing leaves the worker before the approval, and
what is pushed is exactly the change the approver saw (its base commit and diff are the pull
request's arguments). Configuration (`context.config`, so the environment or the settings
file): NIGHTSHIFT_CONFIG_PATCH_GIT_URL (`patch.git_url`), the remote
with `{repo}` for owner/name (`https://github.com/{repo}.git`, `file:///srv/git/{repo}.git`);
NIGHTSHIFT_CONFIG_PATCH_TEST_COMMAND (default `python -m unittest`), run in the worktree with
no shell and a bare environment; NIGHTSHIFT_CONFIG_PATCH_TEST_TIMEOUT (seconds, default 300).
"""

from __future__ import annotations

import json
from typing import Any

from pipeline import (
    Agent,
    Conversation,
    PermanentError,
    SideEffect,
    ToolContext,
    text,
    tool,
    tool_use,
)
from pipeline.agents import gitwork
from pipeline.agents.services import GITHOST, find_pull_of_action, open_pull_request

REVIEWER = "reviewer@example.com"
"""Who approves pull requests unless NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST names others."""
GIT_URL = "NIGHTSHIFT_CONFIG_PATCH_GIT_URL"
TEST_COMMAND = "NIGHTSHIFT_CONFIG_PATCH_TEST_COMMAND"
TEST_TIMEOUT = "NIGHTSHIFT_CONFIG_PATCH_TEST_TIMEOUT"
PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 300}


def branch_for(issue: int) -> str:
    return f"patch/issue-{issue}"


def _config(context: ToolContext) -> gitwork.GitConfig:
    url = context.config("patch.git_url", "")
    if "{repo}" not in url:
        raise PermanentError(f"{GIT_URL} must name the remote with {{repo}} for owner/name")
    try:
        timeout = float(context.config("patch.test_timeout", "300"))
    except ValueError:
        raise PermanentError(f"{TEST_TIMEOUT} must be a number of seconds") from None
    command = context.config("patch.test_command", "python -m unittest")
    return gitwork.GitConfig(
        url_template=url,
        workdir=context.settings.data_dir / "patch",
        test_command=gitwork.test_command(command),
        test_timeout=timeout,
    )


def _repository(context: ToolContext) -> gitwork.Repository:
    """The run's own repository: the model cannot point a tool at another one."""
    return gitwork.Repository(_config(context), context.run_input["repo"])


def _branch(context: ToolContext) -> str:
    return branch_for(int(context.run_input["issue"]))


@tool(
    description="List the repository's files at the current base commit.",
    schema={"type": "object", "properties": {}, "additionalProperties": False},
    needs=(GIT_URL,),
)
def list_files(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    repository = _repository(context)
    with repository.locked():
        base = repository.fetch()
        return {"base": base, "files": repository.files(base)[:2000]}


@tool(
    description="Read one file of the repository (a path relative to its root) at the base.",
    schema={
        "type": "object",
        "properties": {"path": PATH_SCHEMA},
        "required": ["path"],
        "additionalProperties": False,
    },
    needs=(GIT_URL,),
)
def read_file(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    repository = _repository(context)
    with repository.locked():
        base = repository.fetch()
        return {"path": args["path"], "base": base, "content": repository.read(base, args["path"])}


@tool(
    description="Run the repository's tests on the base commit, unchanged.",
    schema={"type": "object", "properties": {}, "additionalProperties": False},
    needs=(GIT_URL,),
)
def run_tests(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    repository = _repository(context)
    with repository.locked():
        base = repository.fetch()
        tree = repository.worktree(_branch(context), base)
        return {"base": base, **repository.run_tests(tree).as_dict()}


@tool(
    description=(
        "Apply a change in the issue's worktree and run the tests on it. Each edit replaces "
        "`old` (text that occurs exactly once in the file) with `new`; an empty `old` creates "
        "a new file. Returns the base commit, the change as a unified diff (`patch`) and the "
        "test result. Nothing leaves this machine."
    ),
    schema={
        "type": "object",
        "properties": {
            "edits": {
                "type": "array",
                "minItems": 1,
                "maxItems": 20,
                "items": {
                    "type": "object",
                    "properties": {
                        "path": PATH_SCHEMA,
                        "old": {"type": "string", "maxLength": 20000},
                        "new": {"type": "string", "maxLength": 20000},
                    },
                    "required": ["path", "old", "new"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["edits"],
        "additionalProperties": False,
    },
    needs=(GIT_URL,),
)
def propose_fix(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    repository = _repository(context)
    edits = [gitwork.Edit(e["path"], e["old"], e["new"]) for e in args["edits"]]
    with repository.locked():
        base = repository.fetch()
        tree = repository.worktree(_branch(context), base)
        patch = repository.apply_edits(tree, edits)
        tests = repository.run_tests(tree)
    return {"base": base, "patch": patch, "tests": tests.as_dict()}


def _pr_key(args: dict[str, Any], context: ToolContext) -> str:
    """One pull request per repository and branch: `patch:acme/shop:patch/issue-7`, both from
    the run's issue (its input), never from the model's arguments: a model that names another
    issue's branch cannot take that issue's key."""
    return f"{context.run_input['repo']}:{_branch(context)}"


def _check_pull_request(args: dict[str, Any], context: ToolContext) -> None:
    """Before the pull request is recorded for approval: it is for this run's repository and
    issue branch (a reviewer is never asked to open one for another issue)."""
    ours = (context.run_input["repo"], _branch(context))
    if (args["repo"], args["branch"]) != ours:
        raise PermanentError(
            f"refused: this run may open a pull request only for {ours[1]} of {ours[0]}, "
            f"not {args['branch']} of {args['repo']}; nothing was proposed"
        )


@tool(
    description=(
        "Commit the tested change, push the issue's branch and open a pull request. A person "
        "must approve it first. `base` and `patch` are exactly what propose_fix returned for "
        "the change whose tests passed."
    ),
    schema={
        "type": "object",
        "properties": {
            "repo": {"type": "string", "pattern": gitwork.REPO_NAME.pattern},
            "branch": {"type": "string", "pattern": gitwork.BRANCH.pattern},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string", "maxLength": 20000},
            "base": {"type": "string", "pattern": gitwork.SHA.pattern},
            "patch": {"type": "string", "minLength": 1, "maxLength": gitwork.MAX_PATCH_BYTES},
        },
        "required": ["repo", "branch", "title", "body", "base", "patch"],
        "additionalProperties": False,
    },
    # The git host refuses a second open pull request for a branch (GitHub's 422) and can be
    # asked for the one of a branch.
    side_effect=SideEffect(
        service="githost", key=_pr_key, lookup=find_pull_of_action, check=_check_pull_request
    ),
    needs=(GITHOST, GIT_URL),
    requires_approval=True,
    # A code reviewer opens pull requests; a deployment names them on its workers with
    # NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST=reviewer@acme.example.
    approvers=(REVIEWER,),
)
def open_fix_pull_request(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    _check_pull_request(args, context)  # an action an older release recorded unchecked
    repository = _repository(context)
    with repository.locked():
        repository.fetch()
        tree = repository.worktree(args["branch"], args["base"])
        repository.apply_patch(tree, args["patch"])
        commit = repository.commit(tree, args["base"], f"{args['title']}\n\n{args['body']}\n")
        repository.push(commit, args["branch"])
    into = repository.default_branch
    pull = open_pull_request(
        context, args["repo"], args["branch"], into, args["title"], args["body"]
    )
    return {**pull, "commit": commit}


# -- the scripted model: a real change for the demo repository's seeded bug -------------------


def _results(conversation: Conversation) -> dict[str, dict[str, Any]]:
    """The latest result of each tool, by tool name."""
    names = {block["id"]: block["name"] for block in conversation.tool_uses()}
    return {names.get(r["tool_use_id"], ""): r for r in conversation.tool_results()}


def _rounding_fix(source: str) -> tuple[str, str] | None:
    """The demo's bug: a money total that is not rounded to cents."""
    for line in source.splitlines():
        if "price * quantity" in line and "round(" not in line:
            return line, line.replace("price * quantity", "round(price * quantity, 2)")
    return None


def script(conversation: Conversation) -> list[dict[str, Any]]:
    report = conversation.input
    step = conversation.assistant_turns()
    results = _results(conversation)
    path = report.get("file", "shop/cart.py")

    def call(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        return [tool_use(step, 0, name, args)]

    if "read_file" not in results:
        return [text(f"Reading {path}."), *call("read_file", {"path": path})]
    if "run_tests" not in results:
        return call("run_tests", {})
    if "propose_fix" not in results:
        read = _json_result(results["read_file"])
        fix = _rounding_fix(read.get("content", "")) if read else None
        if fix is None:
            return [text(f"I could not find the bug of issue #{report['issue']} in {path}.")]
        edit = {"path": path, "old": fix[0], "new": fix[1]}
        return [text("Rounding the total to cents."), *call("propose_fix", {"edits": [edit]})]
    proposed = _json_result(results["propose_fix"])
    if "open_fix_pull_request" not in results:
        if not proposed or not proposed["tests"]["passed"]:
            return [text("The change did not make the tests pass; I stop here.")]
        pull = {
            "repo": report["repo"],
            "branch": branch_for(report["issue"]),
            "title": f"Fix #{report['issue']}: {report['title']}",
            "body": f"Fixes #{report['issue']}: round the total to cents. The tests pass.",
            "base": proposed["base"],
            "patch": proposed["patch"],
        }
        return call("open_fix_pull_request", pull)
    outcome = results["open_fix_pull_request"]["content"]
    return [text(f"Done with issue #{report['issue']}: {outcome}")]


def _json_result(result: dict[str, Any]) -> dict[str, Any] | None:
    """A tool result's JSON object, or None for an error or other text."""
    if result.get("is_error"):
        return None
    try:
        parsed = json.loads(result["content"])
    except (TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


AGENT = Agent(
    name="patch",
    system=(
        "You fix small bugs in a git repository. Read the code, run the tests, make the "
        "smallest change that fixes the bug and makes the tests pass, then open one pull "
        "request for review with exactly the base and patch that propose_fix returned."
    ),
    instructions=(
        "Find the bug with list_files and read_file, see it fail with run_tests, fix it with "
        "propose_fix until the tests pass, then open a pull request with open_fix_pull_request."
    ),
    tools=(list_files, read_file, run_tests, propose_fix, open_fix_pull_request),
    input_schema={
        "type": "object",
        "properties": {
            "issue": {"type": "integer", "minimum": 1, "maximum": 999_999_999},
            "repo": {"type": "string", "pattern": gitwork.REPO_NAME.pattern},
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string", "maxLength": 20000},
            "file": {"type": "string", "maxLength": 200},
        },
        "required": ["issue", "repo", "title"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=12,
    max_tokens=4096,
)
