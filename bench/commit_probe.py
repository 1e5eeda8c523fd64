"""What a failover forgets: a probe that commits numbered rows one after the other and
remembers which commits PostgreSQL acknowledged, to compare with what the promoted standby
kept. The failover test and bench/async_failover.py use it; it writes a table of its own,
never nightshift's."""

from __future__ import annotations

import threading
import time

import psycopg

from pipeline.settings import postgres_urls


class CommitProbe:
    """Commits numbered rows one after the other on its own connection (reconnecting through
    the failover) and remembers which commits PostgreSQL acknowledged."""

    def __init__(self, url: str) -> None:
        self.conninfo = postgres_urls.conninfo(url)
        self.acknowledged: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        with psycopg.connect(self.conninfo, autocommit=True) as connection:
            connection.execute("CREATE TABLE commit_probe (n integer PRIMARY KEY)")

    def __enter__(self) -> CommitProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=2) as conn:
                    while not self._stop.is_set():
                        n += 1
                        conn.execute("INSERT INTO commit_probe VALUES (%s)", (n,))
                        self.acknowledged.append((n, time.monotonic()))
                        time.sleep(0.02)
            except psycopg.Error:
                time.sleep(0.05)

    def kept(self) -> set[int]:
        with psycopg.connect(self.conninfo) as connection:
            return {n for (n,) in connection.execute("SELECT n FROM commit_probe")}
