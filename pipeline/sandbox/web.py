"""Read-only pages for agents: report sources, competitor prices and overdue invoices, with
injectable failures."""

from __future__ import annotations

import os
import threading
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.sandbox.base import SandboxServer
from pipeline.sandbox.transport import Rejected, Request, Response

DEFAULT_SOURCES: dict[str, dict[str, str]] = {
    "incidents": {
        "title": "Incidents, last 24 hours",
        "body": (
            "INC-4821 (SEV2, resolved 01:12 UTC): checkout API p99 latency rose to 2.4 s after a "
            "connection-pool exhaustion on payments-db-2; mitigated by failing over to the "
            "replica. Follow-up: raise pool size and add a saturation alert.\n"
            "INC-4822 (SEV3, resolved 05:40 UTC): delayed email notifications; the queue "
            "consumer was stuck on a malformed message, which was dead-lettered.\n"
            "No open incidents."
        ),
    },
    "deploys": {
        "title": "Deploys, last 24 hours",
        "body": (
            "14 production deploys, 1 rollback.\n"
            "search-api v2.31.0 rolled back at 16:05 UTC (error rate 3.1% above baseline); "
            "v2.31.1 with the fix shipped at 18:20 UTC.\n"
            "checkout v5.8.2, inventory v1.44.0 and web-frontend v9.2.0 shipped cleanly.\n"
            "Change freeze for the payments stack begins Friday 18:00 UTC."
        ),
    },
    "oncall": {
        "title": "On-call handover",
        "body": (
            "Primary: Priya Raman (platform). Secondary: Tomas Eriksen (payments).\n"
            "Pages overnight: 3 (2 actionable, 1 flapping disk alert on logs-07, silenced "
            "until the disk swap on Thursday).\n"
            "Watch: payments-db-2 connection saturation; certificate for api.internal "
            "expires in 9 days (ticket OPS-1177)."
        ),
    },
}

SKU_BASE_PRICES: dict[str, float] = {"sku-1": 19.99, "sku-2": 49.00, "sku-3": 129.00}

_ONE_PER_CLIENT: tuple[dict[str, str | float], ...] = tuple(
    {
        "client": client,
        "name": name,
        "email": f"accounts@{client}.example.com",
        "invoice": f"INV-2026-{1040 + i:04d}",
        "amount": round(480.0 + 137.5 * i, 2),
        "currency": "EUR",
        "due_date": f"2026-10-{10 + 2 * i:02d}",
    }
    for i, (client, name) in enumerate(
        [
            ("acme", "Acme Corporation"),
            ("globex", "Globex"),
            ("initech", "Initech"),
            ("umbrella", "Umbrella Health"),
            ("hooli", "Hooli"),
            ("stark", "Stark Industries"),
            ("wayne", "Wayne Enterprises"),
            ("wonka", "Wonka Confections"),
            ("tyrell", "Tyrell Corporation"),
            ("cyberdyne", "Cyberdyne Systems"),
        ]
    )
)
OVERDUE_INVOICES: tuple[dict[str, str | float], ...] = (
    *_ONE_PER_CLIENT,
    {**_ONE_PER_CLIENT[0], "invoice": "INV-2026-1050", "amount": 95.0, "due_date": "2026-11-02"},
)
"""The same eleven overdue invoices every time: one per client, and a second one for acme."""

_ADJECTIVES = [
    "Acme",
    "Blue",
    "Bright",
    "Cedar",
    "Delta",
    "Echo",
    "Granite",
    "Harbor",
    "Iron",
    "Juniper",
]
_NOUNS = ["Supply", "Goods", "Outfitters"]


def competitors(count: int = 30) -> list[dict[str, str]]:
    """The same `count` competitors every time: c01, c02, ... with names and home pages."""
    found = []
    for i in range(count):
        name = f"{_ADJECTIVES[i % len(_ADJECTIVES)]} {_NOUNS[i // len(_ADJECTIVES) % len(_NOUNS)]}"
        slug = name.lower().replace(" ", "-")
        found.append({"id": f"c{i + 1:02d}", "name": name, "url": f"https://{slug}.example.com"})
    return found


def competitor_price(competitor_id: str, sku: str) -> float:
    """A deterministic price within 15% either side of the SKU's base price."""
    spread = zlib.crc32(f"{competitor_id}/{sku}".encode()) % 3001 / 10000 - 0.15
    return round(SKU_BASE_PRICES[sku] * (1 + spread), 2)


@dataclass
class FailRule:
    status: int
    times: int
    """Failures left; -1 fails forever."""


class WebSandbox(SandboxServer):
    """`GET /sources/<name>`, `GET /competitors`, `GET /competitors/<id>/prices`,
    `GET /invoices/overdue`, `GET /invoices/<invoice>` (one invoice's record, with its status),
    `GET /clients/<client>/overdue` (a client's contact and overdue invoices).

    Control: `POST /_control/fail {"path", "status", "times"}` (times -1 = forever),
    `POST /_control/reset`, `GET /_control/stats` -> `{"requests": {path: count}}`.
    """

    service = "web"

    def __init__(
        self,
        *,
        sources: Mapping[str, Mapping[str, str]] | None = None,
        competitor_count: int = 30,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(log_path=log_path)
        self.sources = {k: dict(v) for k, v in (sources or DEFAULT_SOURCES).items()}
        self.competitors = competitors(competitor_count)
        self._fail_rules: dict[str, FailRule] = {}
        self._requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.route("GET", "/sources/{name}", self._source)
        self.route("GET", "/competitors", self._competitors)
        self.route("GET", "/competitors/{id}/prices", self._prices)
        self.route("GET", "/invoices/overdue", self._overdue)
        self.route("GET", "/invoices/{invoice}", self._invoice)
        self.route("GET", "/clients/{client}/overdue", self._client_overdue)
        self.route("POST", "/_control/fail", self._fail)
        self.route("GET", "/_control/stats", self._stats)

    def fail(self, path: str, status: int, times: int = 1) -> None:
        """Make the next `times` requests for `path` answer `status` (-1: until reset)."""
        with self._lock:
            self._fail_rules[path] = FailRule(status, times)

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self._fail_rules.clear()

    def requests(self) -> dict[str, int]:
        with self._lock:
            return dict(self._requests)

    def intercept(self, request: Request) -> Response | None:
        if request.path.startswith("/_control/"):
            return None
        with self._lock:
            self._requests[request.path] += 1
            rule = self._fail_rules.get(request.path)
            if rule is None or rule.times == 0:
                return None
            if rule.times > 0:
                rule.times -= 1
        raise Rejected(rule.status, f"injected failure for {request.path}")

    def _source(self, request: Request) -> Response:
        name = request.params["name"]
        page = self.sources.get(name)
        if page is None:
            raise Rejected(404, f"no source named {name!r}")
        return Response(200, {"name": name, "title": page["title"], "body": page["body"]})

    def _competitors(self, _: Request) -> Response:
        return Response(200, self.competitors)

    def _prices(self, request: Request) -> Response:
        cid = request.params["id"]
        if not any(c["id"] == cid for c in self.competitors):
            raise Rejected(404, f"no competitor {cid!r}")
        prices = [{"sku": sku, "price": competitor_price(cid, sku)} for sku in SKU_BASE_PRICES]
        return Response(
            200,
            {"competitor": cid, "currency": "USD", "as_of": self.timestamp(), "prices": prices},
        )

    def _overdue(self, _: Request) -> Response:
        return Response(200, {"as_of": self.timestamp(), "invoices": list(OVERDUE_INVOICES)})

    def _invoice(self, request: Request) -> Response:
        wanted = request.params["invoice"]
        record = next((i for i in OVERDUE_INVOICES if i["invoice"] == wanted), None)
        if record is None:
            raise Rejected(404, f"no invoice {wanted!r}")
        return Response(200, {**record, "status": "overdue"})

    def _client_overdue(self, request: Request) -> Response:
        wanted = request.params["client"]
        invoices = [i for i in OVERDUE_INVOICES if i["client"] == wanted]
        if not invoices:
            raise Rejected(404, f"no client {wanted!r} with overdue invoices")
        contact = {k: invoices[0][k] for k in ("client", "name", "email")}
        return Response(200, {**contact, "invoices": invoices})

    def _fail(self, request: Request) -> Response:
        body = request.json_object()
        path, status, times = body.get("path"), body.get("status"), body.get("times", 1)
        if not isinstance(path, str) or not path.startswith("/"):
            raise Rejected(400, "'path' must be an absolute path")
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise Rejected(400, "'status' must be an HTTP error status (400-599)")
        if not isinstance(times, int) or times < -1:
            raise Rejected(400, "'times' must be a count, or -1 for forever")
        self.fail(path, status, times)
        return Response(200, {"path": path, "status": status, "times": times})

    def _stats(self, _: Request) -> Response:
        return Response(200, {"requests": self.requests()})
