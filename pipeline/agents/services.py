"""HTTP clients for the services agents act on: email, pricing and the git host.

Each send carries the action's idempotency key; each lookup asks what happened under one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx

from pipeline import (
    LookupUnsupported,
    NotConfigured,
    PermanentError,
    SideEffect,
    ToolContext,
    http_deadline,
)

SECONDS = 10.0
"""Each call's total deadline, connection to the answer's last byte (pipeline/http_deadline.py):
a service that answers a byte at a time holds a step no longer than one that does not answer."""


WEB = "NIGHTSHIFT_WEB_URL"
EMAIL = "NIGHTSHIFT_EMAIL_URL"
PRICING = "NIGHTSHIFT_PRICING_URL"
GITHOST = "NIGHTSHIFT_GITHOST_URL"


_SETTING = {WEB: "web_url", EMAIL: "email_url", PRICING: "pricing_url", GITHOST: "githost_url"}
"""Each service's variable and the Settings field that holds it."""


def service_url(context: ToolContext, variable: str) -> str:
    """The base URL of the service `variable` names (WEB, EMAIL, PRICING, GITHOST). Tools
    declare the variable in `needs`, so a worker without it fails the run before the first
    step; this is the backstop for one that did not."""
    url: str | None = getattr(context.settings, _SETTING[variable])
    if not url:
        raise NotConfigured(variable, f"the {context.agent} agent's tool")
    return url.rstrip("/")


def _key_header(context: ToolContext) -> dict[str, str]:
    return {"Idempotency-Key": context.idempotency_key} if context.idempotency_key else {}


def _send(context: ToolContext, method: str, url: str, body: dict[str, Any]) -> httpx.Response:
    """One keyed write: the action's idempotency key goes with it, so a resend is absorbed."""
    return http_deadline.request(method, url, SECONDS, json=body, headers=_key_header(context))


def _json(response: httpx.Response) -> dict[str, Any]:
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def read_json(context: ToolContext, variable: str, path: str) -> dict[str, Any]:
    """A JSON document from the service `variable` names (WEB, ...): a read, with no key."""
    return _json(http_deadline.request("GET", f"{service_url(context, variable)}{path}", SECONDS))


SUBJECT = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "pattern": "^[^\\x00-\\x1f\\x7f]*$",
    "description": "One line: no line breaks or other control characters.",
}
"""The schema of an email subject the model writes: no line break or other control character,
which would end the header and start one of the writer's (`Hi\\r\\nBcc: x@evil.example`)."""
_BREAKS_HEADER = re.compile("[\x00-\x1f\x7f]")


def send_email(context: ToolContext, to: str, subject: str, body: str) -> dict[str, Any]:
    """Send one email. `to` comes from the run's input, the deployment or a service's record,
    never from the model's arguments: a page the model read cannot add a recipient. A header
    field with a line break in it is refused, wherever its text came from: it could add one."""
    for field, text in (("to", to), ("subject", subject)):
        if _BREAKS_HEADER.search(text):
            raise PermanentError(
                f"the email's {field} holds a line break or another control character, which "
                "could start a header of its own (Bcc:); nothing was sent"
            )
    base = service_url(context, EMAIL)
    email = {"to": to, "subject": subject, "body": body}
    return _json(_send(context, "POST", f"{base}/emails", email))


def find_email(key: str, args: Any, context: ToolContext) -> dict[str, Any] | None:
    """The delivery made under `key`, None if none was; LookupUnsupported if it cannot say."""
    if context.settings.email_mode == "none":
        raise LookupUnsupported("the email API is configured without lookup")
    base = service_url(context, EMAIL)
    response = http_deadline.request("GET", f"{base}/emails", SECONDS, params={"key": key})
    if response.status_code == 404:
        raise LookupUnsupported(response.json().get("error", "lookup not supported"))
    response.raise_for_status()
    deliveries = response.json().get("deliveries") or []
    return dict(deliveries[0]) if deliveries else None


def email_effect(
    key: Callable[[Any, ToolContext], str], namespace: str | None = None
) -> SideEffect:
    """An email send as the deployed email API (NIGHTSHIFT_EMAIL_MODE) handles it, at most
    NIGHTSHIFT_MAX_EMAILS_PER_RUN of them a run; keys under `namespace` (default: the agent's
    name)."""
    return SideEffect(
        service="email",
        key=key,
        namespace=namespace,
        honours_keys=lambda settings: settings.email_mode == "keys",
        key_retention=lambda settings: timedelta(hours=settings.email_key_retention_hours),
        lookup=find_email,
        per_run_cap=lambda settings: settings.max_emails_per_run,
    )


def open_pull_request(
    context: ToolContext, repo: str, branch: str, title: str, body: str
) -> dict[str, Any]:
    """Open a pull request; one already open for the branch is the result, not an error."""
    base = service_url(context, GITHOST)
    pull = {"branch": branch, "title": title, "body": body}
    response = _send(context, "POST", f"{base}/repos/{repo}/pulls", pull)
    if response.status_code == 409 and "pull" in response.json():
        return {**response.json()["pull"], "already_open": True}
    return _json(response)


def find_open_pull(key: str, args: Any, context: ToolContext) -> dict[str, Any] | None:
    """The open pull request for the action's repo and branch (the git host's own key)."""
    repo, branch = args["repo"], args["branch"]
    base = service_url(context, GITHOST)
    pulls_of = f"{base}/repos/{repo}/pulls"
    query = {"branch": branch, "state": "open"}
    response = http_deadline.request("GET", pulls_of, SECONDS, params=query)
    response.raise_for_status()
    pulls = response.json()
    return dict(pulls[0]) if pulls else None


def read_prices(context: ToolContext, skus: list[str]) -> dict[str, dict[str, Any]]:
    """Our price book's {price, currency} for each SKU we sell (one we do not is left out)."""
    base = service_url(context, PRICING)
    prices: dict[str, dict[str, Any]] = {}
    with http_deadline.client(SECONDS) as client:
        for sku in skus:
            response = client.get(f"{base}/prices/{sku}")
            if response.status_code == 404:
                continue
            response.raise_for_status()
            book = response.json()
            prices[sku] = {"price": book["price"], "currency": book["currency"]}
    return prices


def set_price(context: ToolContext, sku: str, price: float, currency: str) -> dict[str, Any]:
    base = service_url(context, PRICING)
    change = {"price": price, "currency": currency}
    return _json(_send(context, "PUT", f"{base}/prices/{sku}", change))


def find_price_change(key: str, args: Any, context: ToolContext) -> dict[str, Any] | None:
    base = service_url(context, PRICING)
    response = http_deadline.request("GET", f"{base}/changes", SECONDS, params={"key": key})
    response.raise_for_status()
    changes = response.json().get("changes") or []
    return dict(changes[0]) if changes else None
