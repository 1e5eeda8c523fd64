"""postgres: restart PostgreSQL."""

from __future__ import annotations

from pipeline.chaos.faults.base import ServerRestart


class PostgresRestart(ServerRestart):
    """Restart PostgreSQL, fast (sessions terminated) or immediate (a crash, WAL replayed), down
    `hold` seconds."""

    name = "postgres"
    draw_order = 3
    weight = 1
    server = "postgres"
    modes = ("fast", "fast", "immediate")
