"""Profiling the engine in-process: a few steps under cProfile (no Celery, the scripted model),
read back as the phases of one step, counts per step and the functions with most own time."""

from __future__ import annotations

import cProfile
import pstats
import uuid
from collections.abc import Sequence
from pathlib import Path

from output import ms

PROFILED_STEPS = 5

# Phases of one step: (label, file suffix, function), cumulative time, nested as indented.
PHASES = [
    ("whole step (execute_step)", "pipeline/engine/step.py", "execute_step"),
    ("  claim + load: one round trip (step_sql.claim)", "pipeline/engine/step_sql.py", "claim"),
    ("  journal read into the cache (Journal.extended)", "pipeline/engine/journal.py", "extended"),
    ("  rebuild messages (Journal.messages)", "pipeline/engine/journal.py", "messages"),
    ("  cancel/deadline/budget checks (all)", "pipeline/engine/step.py", "_keep_going"),
    ("  model call + its check + journal write", "pipeline/engine/step.py", "_model_reply"),
    ("    of which the scripted model", "pipeline/engine/llm.py", "reply"),
    ("  tool call + journal write", "pipeline/engine/toolcalls.py", "run_tool_call"),
    ("  checkpoint", "pipeline/engine/step.py", "_checkpoint"),
]
# Counted per step (calls by the profiled thread; the heartbeat thread is not profiled).
COUNTS = [
    ("SQL statements through SQLAlchemy", "sqlalchemy/engine/base.py", "_execute_context"),
    ("psycopg executes (named statements and SQLAlchemy's)", "psycopg/cursor.py", "execute"),
    ("pipelined transactions (one round trip each)", "pipeline/statements.py", "pipelined"),
    ("pool pre-ping round trips", "postgresql/_psycopg_common.py", "do_ping"),
    ("commits through SQLAlchemy", "psycopg/connection.py", "commit"),
]


def profile_steps(run_id: uuid.UUID, steps: int = PROFILED_STEPS) -> pstats.Stats:
    """cProfile `steps` steps of `run_id` run in this process (no Celery, scripted model),
    after one unprofiled step that warms connections and caches."""
    from pipeline.engine.step import StepOutcome, execute_step

    execute_step(run_id, "bench:warm-up")
    profiler = cProfile.Profile()
    for _ in range(steps):
        profiler.enable()
        result = execute_step(run_id, "bench:profile")
        profiler.disable()
        if result.outcome is not StepOutcome.CONTINUE:
            raise RuntimeError(f"profiled step of run {run_id} ended with {result.outcome}")
    return pstats.Stats(profiler)


def _entries(stats: pstats.Stats, suffix: str, function: str) -> list[tuple[int, float]]:
    raw = stats.stats  # type: ignore[attr-defined]
    return [
        (row[1], row[3])
        for (path, _, name), row in raw.items()
        if name == function and path.endswith(suffix)
    ]


def phase_rows(profiles: Sequence[pstats.Stats], *, growth: bool = False) -> list[list[str]]:
    """One row per phase (ms per step) and per count, a column per profile."""
    rows = []
    for label, suffix, function in PHASES:
        each = [sum(t for _, t in _entries(p, suffix, function)) / PROFILED_STEPS for p in profiles]
        extra = [ms(each[-1] - each[0])] if growth else []
        rows.append([label, *map(ms, each), *extra])
    for label, suffix, function in COUNTS:
        each = [sum(n for n, _ in _entries(p, suffix, function)) / PROFILED_STEPS for p in profiles]
        rows.append([label, *(f"{n:g}" for n in each), *([""] if growth else [])])
    return rows


def top_functions(stats: pstats.Stats, count: int) -> list[list[str]]:
    """The functions with the most own time, per step."""
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda item: -item[1][2])[:count]
    return [
        [
            f"{Path(path).name}:{line} {name}",
            f"{row[1] / PROFILED_STEPS:g}",
            ms(row[2] / PROFILED_STEPS),
        ]
        for (path, line, name), row in rows
    ]
