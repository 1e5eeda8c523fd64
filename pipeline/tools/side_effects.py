"""SideEffect: how a side-effecting tool talks to its service (idempotency key, whether the service
honours keys and for how long, lookup, namespace, per-run cap, check), and what a tool author
can get wrong in declaring one."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pipeline.settings import Settings
from pipeline.tools.arguments import takes
from pipeline.tools.context import ToolContext, ToolOutput

NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
MAX_SEND_TIMEOUT = timedelta(days=1)


KeyBuilder = Callable[[Any, ToolContext], str]
"""(arguments, context) -> what the action means, e.g. `2026-11-29:ops`."""
Lookup = Callable[[str, Any, ToolContext], "ToolOutput | None"]
"""(key, the action's stored arguments, context) -> the service's record of the action, or
None if nothing happened under the key. Raises LookupUnsupported when it cannot tell."""
Check = Callable[[Any, ToolContext], None]
"""(arguments, context) -> None, or PermanentError with the reason the model reads."""


@dataclass(frozen=True)
class SideEffect:
    """How a side-effecting tool talks to its service, for the action protocol."""

    service: str
    key: KeyBuilder
    """Builds the idempotency key from what the action means; the same meaning, the same key."""
    honours_keys: bool | Callable[[Settings], bool] = False
    """Whether the service, as deployed, replays a repeated key instead of acting twice."""
    key_retention: timedelta | Callable[[Settings], timedelta] | None = None
    """How long the service remembers a key (required with honours_keys; `timedelta.max` for
    a service that never forgets). After it, an unknown outcome is reconciled, not resent."""
    lookup: Lookup | None = None
    """Asks the service what happened under a key, given the key and the stored arguments."""
    namespace: str | None = None
    """Keys are `<namespace>:<key>`; by default the agent's name, so two agents cannot collide
    by accident. Agents that must share keys (one reminder per client, whichever agent sends
    it) name the same namespace."""
    per_run_cap: int | Callable[[Settings], int] | None = None
    """How many of this service's actions one run may record (an email cap, say): past it the
    call is refused with a permanent error and nothing is sent. Counted from the run's actions
    in the database, so a replay, a crash or a second worker cannot reset it."""
    check: Check | None = None
    """Refuses a call before its action is recorded: raise PermanentError saying why (a
    target outside the run's allowlist, an amount out of bounds). Nothing is saved, so nothing
    waits for approval. Asked only when the call would record a new action, never for one this
    run recorded already: a replayed step cannot refuse what an approver was shown."""
    send_timeout: timedelta | None = None
    """The longest one send may take, from request to reply (None: one lease,
    NIGHTSHIFT_LEASE_SECONDS). The step's lease is extended to cover it before the send, so no
    other worker can take the run over while the send may be in flight. Give the tool's client
    this timeout (`httpx.post(..., timeout=EFFECT.send_timeout.total_seconds())`): a send cut
    off by it becomes an unknown outcome, reconciled like a crash mid-send."""

    def honoured(self, settings: Settings) -> bool:
        return bool(
            self.honours_keys(settings) if callable(self.honours_keys) else self.honours_keys
        )

    def retention(self, settings: Settings) -> timedelta | None:
        """None: the service keeps no keys (or, misconfigured, says nothing): never resend."""
        value = self.key_retention(settings) if callable(self.key_retention) else self.key_retention
        return value if isinstance(value, timedelta) else None

    def send_seconds(self, settings: Settings) -> float:
        """How long one send may take: as declared, else one lease."""
        if self.send_timeout is None:
            return settings.lease_seconds
        return self.send_timeout.total_seconds()

    def cap(self, settings: Settings) -> int | None:
        return self.per_run_cap(settings) if callable(self.per_run_cap) else self.per_run_cap

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.service, str) or not self.service.strip():
            found.append("side effect needs a service name (e.g. service='email')")
        if not callable(self.key):
            found.append("side effect's key must be a function (args, context) -> str")
        elif not takes(self.key, 2):
            found.append("side effect's key must take (args, context)")
        if self.honours_keys is not False and self.key_retention is None:
            found.append(
                "honours_keys needs key_retention: how long the service remembers a key "
                "(e.g. timedelta(hours=24); timedelta.max if it never forgets)"
            )
        if self.honours_keys is False and self.key_retention is not None:
            found.append("key_retention is set but honours_keys is False; set honours_keys")
        if not isinstance(self.honours_keys, bool) and not callable(self.honours_keys):
            found.append("honours_keys must be a bool or a function of the settings")
        retention = self.key_retention
        if not (retention is None or callable(retention) or _positive(retention)):
            found.append("key_retention must be a positive timedelta or a function of the settings")
        if self.lookup is not None and (not callable(self.lookup) or not takes(self.lookup, 3)):
            found.append("lookup must take (key, args, context)")
        if self.namespace is not None and not NAMESPACE.match(str(self.namespace)):
            found.append(f"namespace {self.namespace!r} must match {NAMESPACE.pattern}")
        if self.check is not None and (not callable(self.check) or not takes(self.check, 2)):
            found.append("check must take (args, context)")
        timeout = self.send_timeout
        if not (timeout is None or (_positive(timeout) and timeout <= MAX_SEND_TIMEOUT)):
            found.append(
                "send_timeout must be a positive timedelta of at most a day "
                "(e.g. timedelta(seconds=60))"
            )
        cap = self.per_run_cap
        if not (cap is None or callable(cap) or (type(cap) is int and cap >= 0)):
            found.append("per_run_cap must be a count (0 or more) or a function of the settings")
        return found


def _positive(retention: object) -> bool:
    return isinstance(retention, timedelta) and retention > timedelta(0)
