"""Who a request speaks for: a person's token, the shared API token, or, when switched on, a
trusted reverse proxy's identity header. Never a name in the request body.

Identity is what approvals check (`approvers`) and what decisions, cancellations and retries
record; the shared API token speaks for no person (`NIGHTSHIFT_API_TOKEN`), so it can decide
only actions whose tool names no approvers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pipeline.api import tokens
from pipeline.api.base import ApiConfig
from pipeline.runs.decisions import Actor

log = logging.getLogger("nightshift.api")


def caller(
    config: ApiConfig,
    headers: Mapping[str, str],
    client_host: str | None,
    bearer: str | None,
) -> tokens.Authenticated | None:
    """The request's identity, or None when it proves none (the caller answers 401)."""
    proxied = proxy_identity(config, headers, client_host)
    if proxied is not None:
        return proxied
    if bearer:
        if config.token_matches(bearer):
            return tokens.Authenticated(Actor(tokens.API_TOKEN_IDENTITY, "NIGHTSHIFT_API_TOKEN"))
        # A wrong credential is refused even where no credential is needed: it is a mistake.
        return tokens.authenticate(bearer)
    if config.insecure_no_auth:
        anonymous = Actor(tokens.ANONYMOUS, "no authentication (--insecure-no-auth)")
        return tokens.Authenticated(anonymous)
    return None


def proxy_identity(
    config: ApiConfig, headers: Mapping[str, str], client_host: str | None
) -> tokens.Authenticated | None:
    """The identity header's value, on a request from a trusted proxy, when switched on."""
    if config.identity_header is None:
        return None
    value = headers.get(config.identity_header)
    if value is None:
        return None
    if client_host not in config.trusted_proxies:
        # Anyone can send the header: only the proxy's word counts.
        log.warning(
            "ignored %s from %s, which is not in NIGHTSHIFT_IDENTITY_PROXIES",
            config.identity_header,
            client_host,
        )
        return None
    identity = value.strip()
    if not identity or len(identity) > tokens.MAX_IDENTITY or not identity.isprintable():
        return None
    return tokens.Authenticated(Actor(identity, f"proxy header {config.identity_header}"))
