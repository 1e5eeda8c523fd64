"""A receiver of completion webhooks that honours Idempotency-Key, for demo, tests and chaos.

`POST /hooks/{name}` with a JSON body and headers Idempotency-Key, X-Nightshift-Event and the
signature headers. The first request with a key is a delivery (logged, with whether its
signature verified); a later one with the same key is answered as the first was and logged as a
replay, not a delivery. Control: `POST /_control/fail {"times", "status"}` answers the next
`times` requests with `status` before looking at them (a receiver that is down).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pipeline.delivery.signatures import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from pipeline.errors import BadSignature
from pipeline.sandbox.base import SandboxServer
from pipeline.sandbox.transport import Rejected, Request, Response


class HookSandbox(SandboxServer):
    service = "hooks"

    def __init__(
        self, *, secret: str | None = None, log_path: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__(log_path=log_path)
        self.secret = secret
        self._answers: dict[str, dict[str, Any]] = {}
        self._failing: list[int] = []
        self._lock = threading.Lock()
        self.route("POST", "/hooks/{name}", self._receive)
        self.route("POST", "/_control/fail", self._fail)

    def deliveries(self, key: str | None = None) -> list[dict[str, Any]]:
        """Each event received for the first time under its key (or under `key`)."""
        return [
            e
            for e in self.log.entries()
            if e["action"] == "delivered" and (key is None or e["key"] == key)
        ]

    def requests(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every request that reached the receiver: deliveries, replays and refusals."""
        return [e for e in self.log.entries() if key is None or e.get("key") == key]

    def intercept(self, request: Request) -> Response | None:
        if request.path.startswith("/_control/"):
            return None
        with self._lock:
            if self._failing:
                status = self._failing.pop()
                self.record(action="refused", key=request.header("Idempotency-Key"), status=status)
                return Response(status, {"error": "the receiver is down (injected)"})
        return None

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self._failing.clear()

    def _receive(self, request: Request) -> Response:
        key = request.header("Idempotency-Key")
        if not key:
            raise Rejected(400, "Idempotency-Key is required")
        body = request.json_object()
        with self._lock:  # check and record together: two racing requests deliver once
            first = self._answers.get(key)
            if first is not None:
                self.record(action="replayed", key=key, event=body.get("event"))
                return Response(200, first, {"Idempotent-Replayed": "true"})
            entry = self.record(
                action="delivered",
                key=key,
                hook=request.params["name"],
                event=request.header("X-Nightshift-Event"),
                signature_ok=self._signed(request),
                body=body,
            )
            answer = {"received": key, "at": entry["at"]}
            self._answers[key] = answer
        return Response(200, answer)

    def _signed(self, request: Request) -> bool | None:
        """Whether the signature matches (None when this receiver was given no secret)."""
        if self.secret is None:
            return None
        try:
            verify(
                self.secret,
                request.header(TIMESTAMP_HEADER),
                request.header(SIGNATURE_HEADER),
                request.method,
                request.path,
                request.raw,
            )
        except BadSignature:
            return False
        return True

    def _fail(self, request: Request) -> Response:
        body = request.json_object()
        times, status = body.get("times"), body.get("status", 503)
        if not isinstance(times, int) or times < 0 or not isinstance(status, int):
            raise Rejected(400, "'times' must be a whole number and 'status' an HTTP status")
        with self._lock:
            self._failing = [status] * times
        return Response(200, {"failing": times, "status": status})
