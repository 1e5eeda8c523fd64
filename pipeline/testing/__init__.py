"""Test an agent in your own pytest: no PostgreSQL, no Redis, no worker, no service URL.

    from pipeline.testing import run_agent

    run = run_agent(AGENT, {"team": "ops", "date": "2026-11-29"},
                    tools={"read_handover": {"title": "Handover", "body": "Primary: Priya."}})
    assert run.status == "succeeded" and "Mailed" in run.answer
    (digest,) = run.actions                  # the side effect, recorded and not sent
    assert digest.key == "oncall_digest:2026-11-29:ops" and digest.sends == 0

`run_agent` runs the agent's script (or `replies=`, canned model replies) step by step until
the run ends or parks. Each tool runs for real unless `tools=` stubs it: a stub is a value
(the result) or a function `(args, context)` with the arguments as the model sent them. A tool
with a side effect is never run: its action is recorded under its idempotency key, and its
stub, if it has one, stands in for the service (`context.idempotency_key` set), at most once
per key. A call that needs an approval parks the run (`status == "waiting"`) until the test
calls `run.approve()` or `run.reject()`, which go on with the run. `run.calls` are the tool
calls with their validated arguments and what the model got back, `run.actions` the side
effects, `run.journal` the run's journal entries.

It is the engine's own step logic, not a second one. The step's decisions are made by the
functions the worker calls (`pipeline/engine/dispatch.py`: which tool a call names, the refusal
of an unknown tool or invalid arguments, the idempotency key and its check, what an action
records, which calls wait for approval, a per-run cap, a rejection's text, a result's journal
entry and artifact, the run's answer), called in StepRunner._step's order (`run.py`), on the
engine's own `Journal` kept in memory (the conversation
the model sees is rebuilt by `Journal.messages`, replays go through `Journal.replay`), with the
engine's scripted model, stop reasons (`engine/stops.py`), retries (`pipeline/retry.py`, with no
waiting), `once` store (`JournalOnce`) and approver check (`runs/decisions.py`). What only a
database gives is left out: leases and fences, budgets and deadlines, `needs` (a stub needs
nothing), sends that fail and their reconciliation (a stub's temporary error leaves the action
`outcome_unknown` and the run `needs_attention`), and timers (a timer's wake time is recorded in
`run.timers` and the run goes straight on). Artifacts are kept in `run.artifacts`, by name.

The idempotency key is computed twice for each call, as a worker does (proposal, send, every
replay): a key that differs between the two (a clock, a counter, a random id) is a
`KeyNotStable` failure, since a retried run could not be told from a new one.
"""

from pipeline.testing.records import Action, Call, KeyNotStable
from pipeline.testing.run import AgentRun, run_agent, tool_context

__all__ = ["Action", "AgentRun", "Call", "KeyNotStable", "run_agent", "tool_context"]
