"""The chaos harness's fault schedule: drawn up front from the seed alone (the same seed gives
the same faults), and the log of how each fault fared when it fired."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from pipeline.chaos.faults import describe, registered
from pipeline.chaos.faults.base import Fault, FaultRecord


def plan_faults(
    seed: int, duration: float, rate: float, weights: Mapping[str, float], lease_seconds: float
) -> list[Fault]:
    """The whole schedule, from the seed alone: the same seed gives the same faults.

    `rate` faults a minute; every kind with a positive weight appears at least once (when
    there are enough faults), the rest are drawn by weight. Times are spread over the run,
    after a short warm-up and before the very end.
    """
    rng = random.Random(seed)
    count = max(1, round(rate * duration / 60))
    kinds = [k for k in registered() if weights.get(k, 0) > 0]
    drawn = kinds[:count] + rng.choices(
        kinds, [weights[k] for k in kinds], k=max(0, count - len(kinds))
    )
    rng.shuffle(drawn)
    start, end = min(10.0, duration * 0.05), duration * 0.97
    times = sorted(rng.uniform(start, end) for _ in drawn)
    faults = []
    for index, (at, kind) in enumerate(zip(times, drawn, strict=True)):
        pick = rng.random()
        got = registered()[kind].draw(rng, lease_seconds)
        hold, delay = round(got.hold, 3), round(got.delay, 3)
        faults.append(Fault(index, round(at, 3), kind, round(pick, 6), hold, got.mode, delay))
    return faults


def schedule_hash(faults: list[Fault]) -> str:
    text = json.dumps([asdict(f) for f in faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_schedule(path: Path, faults: list[Fault]) -> None:
    """One line per planned fault."""
    path.write_text("\n".join(describe(f) for f in faults) + "\n")


def write_fault_log(path: Path, records: list[FaultRecord]) -> None:
    """One line per fault as it fired: when, what it hit, which runs."""
    lines = []
    for r in records:
        outcome = "injected" if r.injected else "not injected"
        lines.append(
            f"{r.wall} {describe(r.fault)} fired +{r.fired_at:.1f}s {outcome}: {r.target or '-'}"
            + (f" runs={','.join(r.affected)}" if r.affected else "")
            + (f" [{r.note}]" if r.note else "")
        )
    path.write_text("\n".join(lines) + "\n")
