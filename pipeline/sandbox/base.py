"""The shared shape of the sandbox services: a JSON HTTP server on loopback with a delivery log."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Self

from pipeline.sandbox.transport import LoopbackServer, Rejected, Request, Response

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


Handler = Callable[[Request], Response]


class DeliveryLog:
    """Every side effect as one JSON line in a file (for other processes) and in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        line = (json.dumps(entry) + "\n").encode()
        with self._lock:
            # One write(2) with O_APPEND, so readers in other processes never see half a line.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            self._entries.append(entry)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a delivery log file; a missing file is an empty log."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class SandboxServer:
    """A loopback JSON service: routes by method and path, logs side effects, has a movable clock.

    Control endpoints every service has: `POST /_control/delay {"seconds"}` (pause before
    replying to a write, after its side effect is logged), `POST /_control/status-after-work
    {"status"}` (carry writes out, then answer them with that error; null to stop),
    `POST /_control/advance {"seconds"}` (move the service clock forward),
    `POST /_control/reset` (clear injected faults and delay), `GET /_control/deliveries` (the
    delivery log).
    """

    service: ClassVar[str] = "sandbox"

    def __init__(self, *, log_path: str | os.PathLike[str] | None = None) -> None:
        if log_path is None:
            log_dir = Path(tempfile.mkdtemp(prefix="nightshift-sandbox-"))
            log_path = log_dir / f"{self.service}.jsonl"
        self.log = DeliveryLog(Path(log_path))
        self.delay_seconds = 0.0
        self.status_after_work: int | None = None
        """Answer writes with this error status after doing them (a reply that lies)."""
        self._clock_offset = 0.0
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._stopping = threading.Event()
        self._httpd: LoopbackServer | None = None
        self._thread: threading.Thread | None = None
        self.route("POST", "/_control/delay", self._set_delay)
        self.route("POST", "/_control/status-after-work", self._set_status_after_work)
        self.route("POST", "/_control/advance", self._advance)
        self.route("POST", "/_control/reset", self._reset)
        self.route("GET", "/_control/deliveries", lambda _: Response(200, self.log.entries()))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1") -> Self:
        if self._httpd is not None:
            raise RuntimeError(f"{self.service} sandbox already started")
        self._httpd = LoopbackServer(self, host=host)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"sandbox-{self.service}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None or self._stopping.is_set():
            return
        self._stopping.set()  # wakes handlers sleeping in a delay or a fault
        httpd.shutdown()
        httpd.close_connections(timeout=5.0)
        httpd.server_close()
        thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError(f"{self.service} sandbox is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- for subclasses ----------------------------------------------------------------------

    def route(self, method: str, template: str, handler: Handler) -> None:
        """Register `handler` for `method` and a path like `/repos/{owner}/{repo}/pulls`."""
        pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        self._routes.append((method, re.compile(pattern), handler))

    def now(self) -> float:
        """The service clock: wall time plus however far `/_control/advance` moved it."""
        return time.time() + self._clock_offset

    def timestamp(self) -> str:
        return datetime.fromtimestamp(self.now(), UTC).isoformat()

    def record(self, **fields: Any) -> dict[str, Any]:
        """Append one side effect to the delivery log, stamped with the service and its clock."""
        return self.log.append({"service": self.service, **fields, "at": self.timestamp()})

    def sleep(self, seconds: float) -> None:
        """Sleep that `stop()` cuts short."""
        if seconds > 0:
            self._stopping.wait(seconds)

    def intercept(self, request: Request) -> Response | None:
        """Answer before routing (fault injection); None lets the request through."""
        return None

    def reset(self) -> None:
        """Clear injected faults and delays; data and the delivery log stay."""
        self.delay_seconds = 0.0
        self.status_after_work = None

    def error_body(self, status: int, message: str, extra: dict[str, Any]) -> Any:
        return {"error": message, **extra}

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, request: Request) -> Response:
        try:
            response = self.intercept(request) or self._route(request)
        except Rejected as e:
            response = Response(e.status, self.error_body(e.status, e.message, e.extra))
        if request.method in WRITE_METHODS and not request.path.startswith("/_control/"):
            self.sleep(self.delay_seconds)
            if self.status_after_work is not None and response.status < 400:
                message = "injected: the request was carried out, then this error was answered"
                return Response(
                    self.status_after_work, self.error_body(self.status_after_work, message, {})
                )
        return response

    def _route(self, request: Request) -> Response:
        path_matched = False
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path)
            if match is None:
                continue
            path_matched = True
            if method == request.method:
                return handler(replace(request, params=match.groupdict()))
        if path_matched:
            raise Rejected(405, f"{request.method} is not allowed on {request.path}")
        raise Rejected(404, f"no such resource: {request.path}")

    def _set_delay(self, request: Request) -> Response:
        self.delay_seconds = seconds_field(request.json_object())
        return Response(200, {"delay_seconds": self.delay_seconds})

    def _set_status_after_work(self, request: Request) -> Response:
        status = request.json_object().get("status")
        if status is not None and (type(status) is not int or not 400 <= status < 600):
            raise Rejected(400, "'status' must be an HTTP error status or null")
        self.status_after_work = status
        return Response(200, {"status_after_work": status})

    def _advance(self, request: Request) -> Response:
        self._clock_offset += seconds_field(request.json_object())
        return Response(200, {"now": self.timestamp()})

    def _reset(self, _: Request) -> Response:
        self.reset()
        return Response(200, {"reset": True})


def seconds_field(body: dict[str, Any], name: str = "seconds") -> float:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Rejected(400, f"{name!r} must be a non-negative number")
    return float(value)


def string_fields(body: dict[str, Any], *names: str) -> list[str]:
    """The named fields, each required to be a non-empty string."""
    missing = [n for n in names if not isinstance(body.get(n), str) or not body[n]]
    if missing:
        raise Rejected(400, f"missing or empty string field(s): {', '.join(missing)}")
    return [body[n] for n in names]
