"""What beat fires, in an ops team's words. Beat is the clock; Postgres decides what really runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pipeline.settings import get_settings

_tick = get_settings().tick_seconds

beat_schedule: dict[str, dict[str, Any]] = {
    # The runtime's own heartbeat: resume runs that lost their worker, wake due timers.
    "nightshift-tick": {
        "task": "pipeline.tick",
        "schedule": timedelta(seconds=_tick),
        "options": {"expires": _tick * 2},
    },
}
