"""cut_redis: a worker host partitioned from Redis past the lease, then healed."""

from __future__ import annotations

from pipeline.chaos.faults.base import Partition


class CutRedis(Partition):
    """Cut a worker host off from Redis for `hold` seconds (past the lease)."""

    name = "cut_redis"
    draw_order = 7
    weight = 1.5
    service = "redis"
