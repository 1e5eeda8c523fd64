"""The approvals the chaos harness fires, the workload's and the webhook faults', as a person's
would be: signed, with the approver's token, to the API's approval webhook."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from sqlalchemy import text

from pipeline.chaos.common import ChaosError, WebhookUnavailable
from pipeline.chaos.webhook import ApprovalWebhook, Delivery
from pipeline.db import transaction


def pending_approvals() -> list[str]:
    """Keys of the actions waiting for a person's approval, oldest first."""

    query = text(
        "SELECT idempotency_key FROM actions WHERE state = 'pending_approval' ORDER BY created_at"
    )
    with transaction() as session:
        return list(session.scalars(query))


def as_shown(key: str) -> tuple[str, str] | None:
    """The run and `args_hash` of `key`'s action, which a person reads before deciding (the
    webhook applies a decision only to the action they name); None if no action has the key."""
    query = text("SELECT run_id::text, args_hash FROM actions WHERE idempotency_key = :key")
    with transaction() as session:
        row = session.execute(query, {"key": key}).one_or_none()
    return None if row is None else (row[0], row[1] or "")


APPROVER = "chaos-approver@example.com"
"""Named as the approver of every approval-requiring tool on the harness's workers."""


class Approvals:
    """Every approval the harness fires (the workload's and the webhook faults'), sent as a
    person's would be: signed, with the approver's token, to the API's approval webhook. It
    checks that exactly one delivery per action came back as the first decision, and that a
    delivery sent twice was refused the second time (a replay)."""

    def __init__(self, webhook: ApprovalWebhook) -> None:
        self.webhook = webhook
        self.lock = threading.Lock()
        self.firsts: Counter[str] = Counter()
        self.calls = 0
        self.concurrent = 0
        """Approvals fired from two threads at the same instant."""
        self.replays_refused = 0
        self.replays_accepted = 0
        """The same signed delivery accepted more than once: the replay cache failed."""
        self.errors: list[str] = []
        self.log: list[str] = []
        """One line per call: wall-clock time, key, outcome (written to approvals.txt)."""

    def fire(self, key: str, times: int = 1, same: bool = False) -> list[Delivery | Exception]:
        """Approve `key` from `times` threads at the same instant: with `same`, one signed
        delivery sent `times` times (a sender's retry, a captured request replayed); else each
        signed apart (two buttons pressed).

        Returns each delivery's answer, or the exception it raised.
        """
        with self.lock:
            self.calls += times
            note = f"chaos harness approval {self.calls}"
        seen = as_shown(key)
        if seen is None:
            gone: list[Delivery | Exception] = [ChaosError(f"no action has key {key!r}")] * times
            self._count(key, times, same, gone)
            return gone
        signed = self.webhook.request(key, note, *seen)
        deliveries = [
            signed if same or i == 0 else self.webhook.request(key, f"{note}.{i}", *seen)
            for i in range(times)
        ]
        barrier = threading.Barrier(times)
        results: list[Delivery | Exception] = [WebhookUnavailable("not sent")] * times

        def call(i: int) -> None:
            barrier.wait()
            try:
                results[i] = self.webhook.send(*deliveries[i])
            except Exception as exc:  # reported, not raised: the harness keeps going
                results[i] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(times)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._count(key, times, same, results)
        return results

    def _count(self, key: str, times: int, same: bool, results: list[Delivery | Exception]) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        accepted = 0
        with self.lock:
            self.concurrent += times > 1
            for result in results:
                if isinstance(result, Exception):
                    outcome = f"{type(result).__name__}: {str(result).splitlines()[0][:200]}"
                    self.errors.append(f"{key}: {outcome}")
                elif result.replay:
                    self.replays_refused += 1
                    outcome = "refused as a replay"
                else:
                    accepted += 1
                    self.firsts[key] += result.first
                    outcome = f"first={result.first} state={result.state}"
                self.log.append(f"{now} {key} x{times}{' same' if same else ''}: {outcome}")
            self.replays_accepted += same and accepted > 1

    def doubled(self) -> list[str]:
        """Actions approved as the first decision more than once: single use was broken."""
        with self.lock:
            return sorted(key for key, count in self.firsts.items() if count > 1)
