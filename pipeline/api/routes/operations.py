"""/metrics (Prometheus) and /healthz (the database and the broker answer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from pipeline.api.guards import require_metrics_token
from pipeline.db import ping_broker, ping_database
from pipeline.settings import Settings, get_settings
from pipeline.views.gauges import DatabaseGauges

log = logging.getLogger("nightshift.api")
HEALTH_TIMEOUT_SECONDS = 2
"""/healthz answers within a few seconds even when a service's network is gone."""

router = APIRouter()


@router.get(
    "/metrics",
    tags=["operations"],
    dependencies=[Depends(require_metrics_token)],
    response_class=PlainTextResponse,
)
def metrics(accept: Annotated[str | None, Header()] = None) -> Response:
    """Counters, histograms and gauges in the Prometheus text format (or OpenMetrics, when
    the scraper asks for it): docs/metrics.md names each one."""

    encode, content_type = choose_encoder(accept or "")
    return Response(encode(registry_for(get_settings())), media_type=content_type)


def registry_for(settings: Settings) -> CollectorRegistry:
    """Every worker's counters (their multi-process files) and the database's gauges."""
    registry = CollectorRegistry(auto_describe=False)
    directory = settings.metrics_dir
    directory.mkdir(parents=True, exist_ok=True)
    MultiProcessCollector(registry, path=str(directory))
    registry.register(DatabaseGauges(settings))
    return registry


@router.get("/healthz", tags=["operations"])
def healthz() -> JSONResponse:
    """The database answers `select 1` and the broker answers PING; 503 if either does not."""
    checks = {
        "database": _check("database", ping_database),
        "broker": _check("broker", ping_broker),
    }
    healthy = all(v == "ok" for v in checks.values())
    body: dict[str, Any] = checks if healthy else {"error": "unhealthy", **checks}
    return JSONResponse(body, status_code=200 if healthy else 503)


def _check(name: str, probe: Callable[[float], None]) -> str:
    try:
        probe(HEALTH_TIMEOUT_SECONDS)
    except Exception as exc:  # any failure is "unhealthy"; the type is enough to act on
        log.warning("health check %s failed: %s", name, type(exc).__name__)
        return f"unavailable ({type(exc).__name__})"
    return "ok"
