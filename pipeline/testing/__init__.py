"""Test an agent in your own pytest, on the real step: no broker, no worker, no service URL.

    from pipeline.testing import run_agent

    run = run_agent(AGENT, {"team": "ops", "date": "2026-11-29"},
                    tools={"read_handover": {"title": "Handover", "body": "Primary: Priya."}})
    assert run.status == "succeeded" and "Mailed" in run.answer
    (digest,) = run.actions                  # the side effect, recorded and not sent
    assert digest.key == "oncall_digest:2026-11-29:ops" and digest.sends == 0

`run_agent` starts a run (`runs.start`, as `nightshift start` does; with `batch=`, as a night's
fan-out starts its synthesis) and runs its steps with the
code a worker runs (`engine/time_limit.py`'s `execute_bounded_step`, what the `pipeline.step`
task calls, and `engine/step.py`'s StepRunner): the claim and the lease, limits, budgets,
deadlines, required settings, the journal, the action protocol with its reconciliation, timers
and agent versions, on a PostgreSQL database of the run's own (`database.py`: a copy of a
template migrated once, on NIGHTSHIFT_DATABASE_URL's server or on an embedded one kept in the
temporary directory between sessions). There is no second step loop here: what a test swaps is
below the step (`pipeline.process_wide`): the settings (the test's `env=` and `config=`, never
the process environment), the registry (the test's agent, its tools stubbed) and the step queue
(`handoff.py`: the messages stay in the process, and each is run as a worker runs it, until
none is left: the run has ended or waits). tests/integration/test_parity.py runs every
registered agent both ways, on a worker and here, and finds them ending alike.

Each tool runs for real unless `tools=` stubs it: a stub is a value (the result) or a function
`(args, context)` with the arguments as the model sent them (`stand_ins.py`). A tool with a side
effect never runs: its stub, if it has one, stands in for the service (`context.idempotency_key`
set), once per key as the action protocol sends; without one the action is recorded and its
send answers `{"sent": false}`. A stand-in needs no setting (`needs` is for its service).
`replies=` are canned model replies in order, instead of the agent's script. A call that needs
an approval leaves the run waiting until `run.approve()` or `run.reject()` decides it through
`runs.decisions`, the API's own decision; an outcome a worker could not know waits for
`run.resolve(happened=...)`. `run.advance(hours=30)` moves the clock (`clock.py`: the run's
database's stored times move back, so PostgreSQL's now() and Python's agree), runs the tick and
goes on: timers, deadlines and key retention windows as a night would have them.

The idempotency key is computed twice for each call, as a worker does (proposal, send, every
replay): a key that differs between the two (a clock, a counter, a random id) is a
`KeyNotStable` failure, since a retried run could not be told from a new one.
"""

from pipeline.testing.agent_run import AgentRun, run_agent, tool_context
from pipeline.testing.records import Action, Call, KeyNotStable

__all__ = ["Action", "AgentRun", "Call", "KeyNotStable", "run_agent", "tool_context"]
