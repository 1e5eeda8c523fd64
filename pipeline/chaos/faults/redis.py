"""redis: restart the broker."""

from __future__ import annotations

from pipeline.chaos.faults.base import ServerRestart


class RedisRestart(ServerRestart):
    """Restart Redis, cleanly (term: the append-only file synced) or like a crash (kill), down
    `hold` seconds."""

    name = "redis"
    draw_order = 2
    weight = 1
    server = "redis"
    modes = ("term", "term", "kill")
