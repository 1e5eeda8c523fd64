"""A price book that honours idempotency keys forever, to test price changes that happen once."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.sandbox.base import SandboxServer
from pipeline.sandbox.transport import Rejected, Request, Response

DEFAULT_PRICES: dict[str, float] = {"sku-1": 19.99, "sku-2": 49.00, "sku-3": 129.00}


@dataclass(frozen=True)
class _HeldKey:
    request: tuple[str, float, str]
    reply: dict[str, Any]


class PricingSandbox(SandboxServer):
    """`PUT /prices/<sku> {"price", "currency"}` (header `Idempotency-Key`, no expiry),
    `GET /prices/<sku>`, `GET /changes` and `GET /changes?key=K`.
    """

    service = "pricing"

    def __init__(
        self,
        *,
        prices: Mapping[str, float] | None = None,
        currency: str = "USD",
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(log_path=log_path)
        start = DEFAULT_PRICES if prices is None else prices
        self._prices: dict[str, dict[str, Any]] = {
            sku: {"sku": sku, "price": price, "currency": currency, "updated_at": None}
            for sku, price in start.items()
        }
        self._keys: dict[str, _HeldKey] = {}
        self._lock = threading.Lock()
        self.route("PUT", "/prices/{sku}", self._set_price)
        self.route("GET", "/prices/{sku}", self._get_price)
        self.route("GET", "/changes", self._changes)

    def price(self, sku: str) -> dict[str, Any] | None:
        with self._lock:
            current = self._prices.get(sku)
            return dict(current) if current else None

    def changes(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every price change applied, or those applied with Idempotency-Key `key`."""
        return [e for e in self.log.entries() if key is None or e["key"] == key]

    def _set_price(self, request: Request) -> Response:
        sku = request.params["sku"]
        body = request.json_object()
        price, currency = body.get("price"), body.get("currency", "USD")
        if isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
            raise Rejected(400, "'price' must be a non-negative number")
        if not isinstance(currency, str) or len(currency) != 3:
            raise Rejected(400, "'currency' must be a three-letter code")
        key = request.header("Idempotency-Key") or None
        with self._lock:
            held = self._keys.get(key) if key else None
            if held:
                if held.request != (sku, price, currency):
                    raise Rejected(422, "Idempotency-Key reused with a different request")
                return Response(200, held.reply, {"Idempotent-Replayed": "true"})
            previous = self._prices.get(sku)
            entry = self.record(
                change_id=f"pc_{uuid.uuid4().hex[:16]}",
                sku=sku,
                price=price,
                currency=currency,
                previous=previous["price"] if previous else None,
                key=key,
            )
            self._prices[sku] = {
                "sku": sku,
                "price": price,
                "currency": currency,
                "updated_at": entry["at"],
            }
            reply = {k: v for k, v in entry.items() if k != "service"}
            if key:
                self._keys[key] = _HeldKey((sku, price, currency), reply)
        return Response(200, reply)

    def _get_price(self, request: Request) -> Response:
        current = self.price(request.params["sku"])
        if current is None:
            raise Rejected(404, f"no price for {request.params['sku']!r}")
        return Response(200, current)

    def _changes(self, request: Request) -> Response:
        key = request.query.get("key")
        return Response(200, {"key": key, "changes": self.changes(key)})
