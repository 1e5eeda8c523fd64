"""cut_postgres: a worker host partitioned from PostgreSQL past the lease, then healed."""

from __future__ import annotations

from pipeline.chaos.faults.base import Partition


class CutPostgres(Partition):
    """Cut a worker host off from PostgreSQL for `hold` seconds (past the lease)."""

    name = "cut_postgres"
    draw_order = 6
    weight = 2
    service = "postgres"
