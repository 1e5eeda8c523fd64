"""An email service in three flavours of idempotency, to test sends that must happen once."""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from pipeline.sandbox.base import SandboxServer, string_fields
from pipeline.sandbox.transport import Rejected, Request, Response

EmailMode = Literal["keys", "no-keys-lookup", "no-keys"]
"""keys: honours Idempotency-Key within the retention window; no-keys-lookup: sends every
request but can say what was sent under a key; no-keys: sends every request, no lookup."""

MODES: tuple[str, ...] = get_args(EmailMode)


@dataclass(frozen=True)
class _HeldKey:
    first_at: float
    request: tuple[str, str, str]
    reply: dict[str, Any]


class EmailSandbox(SandboxServer):
    """`POST /emails {"to","subject","body"}` (header `Idempotency-Key`), `GET /emails?key=K`.

    Control: `POST /_control/mode {"mode"}`, plus the base controls (`delay`, `advance`, ...).
    Each delivery is logged before any delay, so a client killed mid-reply still leaves a trace.
    """

    service = "email"

    def __init__(
        self,
        *,
        mode: EmailMode = "keys",
        retention_seconds: float = 24 * 3600,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown email mode {mode!r}; expected one of {MODES}")
        super().__init__(log_path=log_path)
        self.mode = mode
        self.retention_seconds = retention_seconds
        self._keys: dict[str, _HeldKey] = {}
        self._lock = threading.Lock()
        self.route("POST", "/emails", self._send)
        self.route("GET", "/emails", self._lookup)
        self.route("POST", "/_control/mode", self._set_mode)

    def deliveries(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every email actually sent, or those sent with Idempotency-Key `key`."""
        return [e for e in self.log.entries() if key is None or e["key"] == key]

    def _send(self, request: Request) -> Response:
        fields = string_fields(request.json_object(), "to", "subject", "body")
        to, subject, body = fields
        key = request.header("Idempotency-Key") or None
        honour_key = self.mode == "keys" and key is not None
        # One lock around check-and-send, so two racing requests with one key send one email.
        with self._lock:
            held = self._keys.get(key) if honour_key and key else None
            if held and self.now() - held.first_at < self.retention_seconds:
                if held.request != (to, subject, body):
                    raise Rejected(422, "Idempotency-Key reused with a different request")
                return Response(200, held.reply, {"Idempotent-Replayed": "true"})
            message_id = f"em_{uuid.uuid4().hex[:16]}"
            entry = self.record(message_id=message_id, to=to, subject=subject, key=key)
            reply = {"message_id": message_id, "to": to, "subject": subject, "sent_at": entry["at"]}
            if honour_key and key:
                self._keys[key] = _HeldKey(self.now(), (to, subject, body), reply)
        return Response(200, reply)

    def _lookup(self, request: Request) -> Response:
        if self.mode == "no-keys":
            raise Rejected(404, "lookup not supported")
        key = request.query.get("key")
        if not key:
            raise Rejected(400, "query parameter 'key' is required")
        return Response(200, {"key": key, "deliveries": self.deliveries(key)})

    def _set_mode(self, request: Request) -> Response:
        mode = request.json_object().get("mode")
        if mode not in MODES:
            raise Rejected(400, f"'mode' must be one of {', '.join(MODES)}")
        self.mode = cast(EmailMode, mode)
        return Response(200, {"mode": self.mode})
