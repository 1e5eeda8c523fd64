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
    service_replayed,
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
    """One keyed write: the action's idempotency key goes with it, so a resend is absorbed
    (and said to be, when the service answers `Idempotent-Replayed: true` as Stripe does)."""
    response = http_deadline.request(method, url, SECONDS, json=body, headers=_key_header(context))
    if response.is_success and response.headers.get("Idempotent-Replayed", "").lower() == "true":
        service_replayed()
    return response


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


def _githost(context: ToolContext, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One call of the git host's REST API (GitHub's, which Gitea and Forgejo also serve), with
    NIGHTSHIFT_GITHOST_TOKEN as a bearer token when set (in the header only: never in a URL,
    so never in an error or a log line)."""
    headers = {"Accept": "application/vnd.github+json", **kwargs.pop("headers", {})}
    token = context.settings.githost_token
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{service_url(context, GITHOST)}{path}"
    return http_deadline.request(method, url, SECONDS, headers=headers, **kwargs)


def _pull(pull: dict[str, Any]) -> dict[str, Any]:
    """What the run keeps of a pull request the host returned: its number, state, page, branch."""
    return {
        "number": pull["number"],
        "state": pull["state"],
        "url": pull.get("html_url") or pull.get("url"),
        "branch": pull["head"]["ref"],
        "title": pull.get("title"),
    }


def _already_exists(response: httpx.Response) -> bool:
    """The host's answer that the branch has an open pull request: GitHub's 422 Validation
    Failed "A pull request already exists for owner:branch.", Gitea's and Forgejo's 409 "pull
    request already exists for these targets [...]"."""
    if response.status_code not in (409, 422):
        return False
    try:
        answer = response.json()
    except ValueError:
        return False
    errors = answer.get("errors") if isinstance(answer, dict) else None
    texts = [str(answer.get("message", ""))] if isinstance(answer, dict) else []
    texts += [str(e.get("message", "")) for e in errors or () if isinstance(e, dict)]
    return any("pull request already exists" in t.lower() for t in texts)


def open_pull_request(
    context: ToolContext, repo: str, branch: str, base: str, title: str, body: str
) -> dict[str, Any]:
    """Open a pull request of `branch` into `base` (`POST /repos/{owner}/{repo}/pulls`); one
    already open for the branch (GitHub's 422, Gitea's 409) is the result, not an error."""
    pull = {"title": title, "head": branch, "base": base, "body": body}
    headers = _key_header(context)
    response = _githost(context, "POST", f"/repos/{repo}/pulls", json=pull, headers=headers)
    if _already_exists(response):
        existing = find_pull(context, repo, branch, state="open")
        if existing is not None:
            return {**existing, "already_open": True}
    return _pull(_json(response))


def find_pull(
    context: ToolContext, repo: str, branch: str, *, state: str = "all"
) -> dict[str, Any] | None:
    """The newest pull request of `branch` in `repo`, None if there is none. The host is asked
    by head (`?head=owner:branch`, GitHub's filter) and its answer checked by head as well:
    Gitea's and Forgejo's list does not filter by head."""
    owner = repo.split("/", 1)[0]
    query = {"head": f"{owner}:{branch}", "state": state, "sort": "created",
             "direction": "desc", "per_page": "100"}  # fmt: skip
    response = _githost(context, "GET", f"/repos/{repo}/pulls", params=query)
    response.raise_for_status()
    pulls = [p for p in response.json() if p.get("head", {}).get("ref") == branch]
    return _pull(pulls[0]) if pulls else None


def find_pull_of_action(key: str, args: Any, context: ToolContext) -> dict[str, Any] | None:
    """The lookup of a pull request's side effect: the one of the action's repo and branch,
    open or closed (the host's own key is the branch, not our idempotency key)."""
    return find_pull(context, args["repo"], args["branch"])


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
