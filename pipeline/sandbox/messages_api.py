"""Enough of the Anthropic Messages API for the real `anthropic` SDK, with injectable faults,
outages (every request answered 529 or 429, with retry-after, for a while), replies cut off at
max_tokens, the prompt cache's usage fields, and whatever stop reason a
responder gives (refusal, pause_turn, stop_sequence)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.sandbox.base import SandboxServer, seconds_field
from pipeline.sandbox.prompt_cache import PromptCache, block_tokens, prefix_blocks
from pipeline.sandbox.rate_limits import RateLimits
from pipeline.sandbox.responders import Responder, content_blocks, default_responder, new_id
from pipeline.sandbox.transport import Hangup, Rejected, Request, Response

Fault = int | Literal["timeout", "disconnect"]
"""An HTTP error status to answer with, or a reply that never comes (timeout: after a pause)."""

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class MessagesSandbox(SandboxServer):
    """`POST /v1/messages` (non-streaming). Every request is logged, faults included.

    A reply longer than the request's max_tokens is cut off there, as the API does
    (`stop_reason: max_tokens`; a tool_use loses the parameter it was writing). Usage reports
    prompt-cache writes and reads for requests with `cache_control` breakpoints.

    Control: `POST /_control/faults {"faults": [429, 529, 500, 400, "timeout", "disconnect"],
    "timeout_seconds"?}` queues one fault per coming request; `POST /_control/latency
    {"seconds"}`; `POST /_control/outage {"status": 529 | 429 | 5xx, "seconds",
    "retry_after"?}` answers every request with that status (and a `retry-after` header) for
    that long (0: the provider answers again now); `GET /_control/stats` -> `{"requests",
    "faults_served", "faults_queued", "outage_seconds_left", "rate_limits", "rate_limited"}`;
    `POST /_control/rate_limits {"requests_per_minute"?, "input_tokens_per_minute"?,
    "output_tokens_per_minute"?, "burst_seconds"?}` puts a provider's limits in force
    (pipeline/sandbox/rate_limits.py: 429 with `retry-after` past them; `{}` lifts them).
    """

    service = "messages"

    def __init__(
        self,
        *,
        responder: Responder = default_responder,
        latency_seconds: float = 0.0,
        timeout_seconds: float = 5.0,
        log_path: str | os.PathLike[str] | None = None,
        prompt_cache: PromptCache | None = None,
        rate_limits: dict[str, float] | None = None,
    ) -> None:
        super().__init__(log_path=log_path)
        self.responder = responder
        self.prompt_cache = prompt_cache or PromptCache()
        self.delay_seconds = latency_seconds
        self.timeout_seconds = timeout_seconds
        """How long a "timeout" fault holds the request before hanging up."""
        self._faults: deque[Fault] = deque()
        self._requests = self._faults_served = 0
        self._outage: _Outage | None = None
        self._lock = threading.Lock()
        self.rate_limits = RateLimits()
        self.rate_limits.set(**(rate_limits or {}))
        self._responder_lock = threading.Lock()  # scripted responders need not be thread-safe
        self.route("POST", "/v1/messages", self._create)
        self.route("POST", "/_control/faults", self._queue_faults)
        self.route("POST", "/_control/latency", self._set_delay)
        self.route("POST", "/_control/outage", self._start_outage)
        self.route("POST", "/_control/rate_limits", self._set_rate_limits)
        self.route("GET", "/_control/stats", lambda _: Response(200, self.stats()))

    def inject(self, faults: Iterable[Fault]) -> None:
        queued = list(faults)
        for fault in queued:
            if not (
                fault in ("timeout", "disconnect") or (type(fault) is int and 400 <= fault < 600)
            ):
                raise ValueError(f"not a fault: {fault!r}")
        with self._lock:
            self._faults.extend(queued)

    def outage(self, status: int, seconds: float, retry_after: float | None = None) -> None:
        """Answer every request with `status` from now for `seconds` (a provider's bad hour);
        0 seconds ends the outage now."""
        if not (type(status) is int and (status == 429 or 500 <= status < 600)):
            raise ValueError(f"an outage answers 429 or 5xx, not {status!r}")
        if seconds < 0 or (retry_after is not None and retry_after < 0):
            raise ValueError("an outage lasts a non-negative number of seconds")
        with self._lock:
            self._outage = _Outage(status, time.monotonic() + seconds, retry_after)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            left = self._outage.seconds_left() if self._outage else 0.0
            return {
                "requests": self._requests,
                "faults_served": self._faults_served,
                "faults_queued": len(self._faults),
                "outage_seconds_left": round(left, 3),
                **self.rate_limits.stats(),
            }

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self._faults.clear()
            self._outage = None
        self.rate_limits.set()

    def error_body(self, status: int, message: str, extra: dict[str, Any]) -> Any:
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _create(self, request: Request) -> Response:
        with self._lock:
            self._requests += 1
            seq = self._requests
            outage = self._outage if self._outage and self._outage.seconds_left() else None
            fault = None if outage else self._faults.popleft() if self._faults else None
            if fault is not None or outage is not None:
                self._faults_served += 1
        body = request.body if isinstance(request.body, dict) else {}
        metadata, history = body.get("metadata"), body.get("messages")
        seen = {
            "seq": seq,
            "model": body.get("model"),
            "messages": len(history) if isinstance(history, list) else 0,
            "user_id": metadata.get("user_id") if isinstance(metadata, dict) else None,
        }
        if outage is not None:
            self.record(**seen, status=outage.status, fault="outage", stop_reason=None)
            down = f"the provider is down ({ERROR_TYPES.get(outage.status, 'api_error')})"
            return Response(
                outage.status, self.error_body(outage.status, down, {}), outage.headers()
            )
        if fault in ("timeout", "disconnect"):
            self.record(**seen, status=None, fault=fault, stop_reason=None)
            self.sleep(self.timeout_seconds if fault == "timeout" else 0)
            raise Hangup
        if isinstance(fault, int):
            self.record(**seen, status=fault, fault=fault, stop_reason=None)
            raise Rejected(fault, f"injected {ERROR_TYPES.get(fault, 'error')} ({fault})")
        try:
            _validate(request)
            limited = self.rate_limits.admit(sum(map(block_tokens, prefix_blocks(body))))
            if limited is not None:
                self.record(**seen, status=429, fault="rate_limit", stop_reason=None)
                return _rate_limited(*limited)
            with self._responder_lock:
                message = self._complete(self.responder(body), body)
        except Exception as e:  # a refusal, or a responder that failed: a 500 to the client
            status = e.status if isinstance(e, Rejected) else 500
            self.record(**seen, status=status, fault=None, stop_reason=None)
            raise
        self.record(
            **seen,
            status=200,
            fault=None,
            stop_reason=message["stop_reason"],
            max_tokens=body["max_tokens"],
            usage=message["usage"],
        )
        self.rate_limits.charge_output(message["usage"]["output_tokens"])
        return Response(200, message, {"request-id": new_id("req")})

    def _complete(self, reply: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        content = [dict(block) for block in reply.get("content") or []]
        for block in content:
            if block.get("type") == "tool_use":
                block.setdefault("id", new_id("toolu"))
        uses_tool = any(block.get("type") == "tool_use" for block in content)
        message = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": request["model"],
            "stop_reason": "tool_use" if uses_tool else "end_turn",
            "stop_sequence": None,
            **reply,
            "content": content,
        }
        output = _tokens(content)
        if output > request["max_tokens"]:
            message["content"] = cut_off(content, request["max_tokens"])
            message["stop_reason"], output = "max_tokens", request["max_tokens"]
        # The server counts, as the API does: a responder's own usage is not what was billed.
        message["usage"] = {**self.prompt_cache.usage(request), "output_tokens": output}
        return message

    def _queue_faults(self, request: Request) -> Response:
        body = request.json_object()
        faults = body.get("faults")
        if not isinstance(faults, list):
            raise Rejected(400, "'faults' must be a list")
        if "timeout_seconds" in body:
            self.timeout_seconds = seconds_field(body, "timeout_seconds")
        try:
            self.inject(faults)
        except ValueError as e:
            raise Rejected(400, str(e)) from None
        return Response(200, self.stats())

    def _set_rate_limits(self, request: Request) -> Response:
        try:
            self.rate_limits.set(**request.json_object())
        except (TypeError, ValueError) as e:
            raise Rejected(400, str(e)) from None
        return Response(200, self.stats())

    def _start_outage(self, request: Request) -> Response:
        try:
            self.outage(*_Outage.of(request.json_object()))
        except ValueError as e:
            raise Rejected(400, str(e)) from None
        return Response(200, self.stats())


@dataclass(frozen=True)
class _Outage:
    status: int
    until: float
    """time.monotonic() at which the provider answers again."""
    retry_after: float | None

    def seconds_left(self) -> float:
        return max(0.0, self.until - time.monotonic())

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": f"{self.retry_after:g}"}

    @classmethod
    def of(cls, body: dict[str, Any]) -> tuple[int, float, float | None]:
        status = body.get("status")
        if type(status) is not int:
            raise Rejected(400, "'status' must be an HTTP status (429 or 5xx)")
        after = seconds_field(body, "retry_after") if "retry_after" in body else None
        return status, seconds_field(body, "seconds"), after


def _rate_limited(limit: str, wait: float) -> Response:
    """The API's answer past a limit: 429, rate_limit_error, whole seconds in retry-after."""
    message = f"This request would exceed your organization's rate limit ({limit})"
    body = {"type": "error", "error": {"type": ERROR_TYPES[429], "message": message}}
    return Response(429, body, {"retry-after": str(max(1, math.ceil(wait)))})


def _validate(request: Request) -> None:
    """The checks of the real API that catch a runtime's mistakes in the history it rebuilds."""
    if not (request.header("x-api-key") or request.header("authorization")):
        raise Rejected(401, "x-api-key header is required")
    body = request.json_object()
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Rejected(400, "model: Field required")
    if isinstance(body.get("max_tokens"), bool) or not isinstance(body.get("max_tokens"), int):
        raise Rejected(400, "max_tokens: Field required")
    if body.get("stream"):
        raise Rejected(400, "stream: the sandbox answers non-streaming requests only")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected(400, "messages: at least one message is required")
    pending: set[str] = set()  # tool_use ids the next message must answer
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise Rejected(400, f"messages.{i}: role must be 'user' or 'assistant'")
        blocks = content_blocks(message)
        answered = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
        if answered - pending:
            raise Rejected(
                400,
                f"messages.{i}: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {', '.join(sorted(map(str, answered - pending)))}",
            )
        if pending - answered:
            raise Rejected(
                400,
                f"messages.{i - 1}: `tool_use` ids were found without "
                f"`tool_result` blocks immediately after: {', '.join(sorted(pending))}",
            )
        pending = {b["id"] for b in blocks if b.get("type") == "tool_use" and "id" in b}
    if pending:
        raise Rejected(
            400,
            f"messages.{len(messages) - 1}: `tool_use` ids were found without "
            f"`tool_result` blocks immediately after: {', '.join(sorted(pending))}",
        )


def cut_off(content: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
    """The blocks as far as `max_tokens` reaches. A text block ends mid-way; a tool_use keeps
    the parameters written in full (the API buffers each until it is complete), so a cut call
    can look valid."""
    room = max_tokens * 4  # characters
    kept: list[dict[str, Any]] = []
    for block in content:
        size = len(json.dumps(block))
        if size <= room:
            kept.append(block)
            room -= size
            continue
        if block.get("type") == "text":
            kept.append({**block, "text": block.get("text", "")[: max(0, room - 30)]})
        elif block.get("type") == "tool_use":
            written: dict[str, Any] = {}
            for name, value in (block.get("input") or {}).items():
                room -= len(json.dumps({name: value}))
                if room < 60:
                    break
                written[name] = value
            kept.append({**block, "input": written})
        break
    return kept


def _tokens(value: Any) -> int:
    """A rough, deterministic token count (about four characters a token)."""
    return max(1, len(json.dumps(value)) // 4)
