"""Prometheus counters and histograms, updated where things happen (steps, model and tool
calls, action states, run ends, takeovers), through prometheus_client.

Workers write them to files in PROMETHEUS_MULTIPROC_DIR (prometheus_client's multi-process
mode; `nightshift worker` sets it to NIGHTSHIFT_DATA_DIR/metrics when it is unset) and the API's
`/metrics` adds up every process's files. Ratios are PromQL over these (docs/metrics.md).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# Seconds: a step and a model call take from milliseconds (scripted) to minutes (a long
# model reply); time to resume is a lease (15 s) plus a tick or two.
_SHORT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_RESUME = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800)

STEPS = Counter(
    "nightshift_steps", "Step tasks, by agent and outcome (continue, stopped, skipped, ...).",
    ["agent", "outcome"],
)  # fmt: skip
STEP_SECONDS = Histogram(
    "nightshift_step_seconds", "Wall time of a claimed step, claim to hand-off.", ["agent"],
    buckets=_SHORT,
)  # fmt: skip
MODEL_CALLS = Counter(
    "nightshift_model_calls", "Model calls by agent and result (ok, error, replayed from the "
    "journal).", ["agent", "result"],
)  # fmt: skip
MODEL_SECONDS = Histogram(
    "nightshift_model_call_seconds", "Model call time, retries included.", ["agent"],
    buckets=_SHORT,
)  # fmt: skip
MODEL_TOKENS = Counter(
    "nightshift_model_tokens", "Model tokens by agent and kind (input, output).",
    ["agent", "kind"],
)  # fmt: skip
FLOW_WAITS = Counter(
    "nightshift_flow_waits", "Model calls whose turn had not come (their run parked until it "
    "did), by kind (max_concurrent_runs, rate_limit) and what was busy (the agent, the model).",
    ["kind", "on"],
)  # fmt: skip
TOOL_CALLS = Counter(
    "nightshift_tool_calls", "Tool calls by agent, tool and result (ok, error, replayed).",
    ["agent", "tool", "result"],
)  # fmt: skip
TOOL_SECONDS = Histogram(
    "nightshift_tool_call_seconds", "Tool call time (a side effect's whole protocol).",
    ["agent", "tool"], buckets=_SHORT,
)  # fmt: skip
ACTIONS = Counter(
    "nightshift_action_transitions", "Side effects entering a state in a worker (attempted, "
    "confirmed, outcome_unknown, failed, intended again for a resend).", ["state"],
)  # fmt: skip
DUPLICATES_ABSORBED = Counter(
    "nightshift_duplicates_absorbed", "Sends of an action its service already had, by service "
    "and how it told: replayed (its answer to the resend said so: Idempotent-Replayed, a 409 "
    "on the key) or lookup (asked after an unknown outcome, it had the key done).",
    ["service", "how"],
)  # fmt: skip
RUNS_FINISHED = Counter(
    "nightshift_runs_finished", "Runs that ended, by agent, status and stop reason.",
    ["agent", "status", "reason"],
)  # fmt: skip
VERSION_CHANGES = Counter(
    "nightshift_run_version_changes", "Steps that ran a run under another agent version than "
    "its last step (a new release resumed it), by agent.", ["agent"],
)  # fmt: skip
NON_DETERMINISM = Counter(
    "nightshift_non_determinism", "Replayed journal entries the agent's current version no "
    "longer matches (a tool gone, arguments its schema refuses, a side effect's service "
    "changed), by agent and kind.", ["agent", "kind"],
)  # fmt: skip
RESUMPTIONS = Counter(
    "nightshift_resumptions", "Takeovers: a run whose worker was lost, claimed again, by cause.",
    ["cause"],
)  # fmt: skip
TIME_TO_RESUME = Histogram(
    "nightshift_time_to_resume_seconds", "From a lost lease's expiry (or a lost message's last "
    "write) to the claim that resumed the run.", buckets=_RESUME,
)  # fmt: skip


def resumed(cause: str, seconds: float) -> None:
    RESUMPTIONS.labels(cause).inc()
    TIME_TO_RESUME.observe(max(seconds, 0.0))
