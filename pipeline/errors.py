"""One root exception for nightshift; the docstring is each error's default message. And what
a message may say: URLs without their credentials and query strings."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


class NightshiftError(Exception):
    """nightshift failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class SettingsError(NightshiftError):
    """A setting in the environment is missing or malformed."""


class DefinitionError(NightshiftError):
    """An agent or a tool is defined wrongly."""


class ServiceError(NightshiftError):
    """An embedded service could not be started or reached."""


class UnknownAgent(NightshiftError):
    """No agent is registered under that name."""


class UnknownAction(NightshiftError):
    """No action has that idempotency key."""


class NoModel(NightshiftError):
    """The agent has no script and no model is configured (ANTHROPIC_API_KEY)."""


class InvalidInput(NightshiftError):
    """The run's input does not match the agent's schema."""


class InputTooLarge(InvalidInput):
    """The run's input is larger than the configured limit."""


class RunNotFound(NightshiftError):
    """No run has that id."""


class StatusConflict(NightshiftError):
    """The record is not in a state that allows this transition."""


class DatabaseUnavailable(NightshiftError):
    """PostgreSQL could not be reached to claim the run: nothing was done."""


class NonDeterminism(NightshiftError):
    """The journal holds a different step than the code now asks for."""


class TemporaryError(NightshiftError):
    """A temporary failure that is worth retrying (timeout, connection, 429, 5xx)."""


class PermanentError(NightshiftError):
    """A failure that retrying cannot fix (400, 401, 403, 404, schema errors)."""


class LookupUnsupported(NightshiftError):
    """The service cannot say what happened under a key."""


class StopStep(BaseException):
    """The step must stop now.

    Derives from BaseException so that an agent's or tool's `except Exception` cannot swallow it.
    """


class LeaseLost(StopStep):
    """Another worker holds this run now; this step may not write anything more."""


class StepTimeUp(StopStep):
    """The step reached its time bound (NIGHTSHIFT_STEP_TIME_LIMIT) at a model or tool call:
    the run goes on in another attempt."""


class RunStopped(StopStep):
    """The run must stop now (cancelled, or past its deadline): no further model or tool call."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class NotConfigured(RunStopped):
    """A setting the run's tools cannot work without is not set where the worker runs.

    The run fails at once with reason `config`, before anything is sent; nothing about the
    action's key is recorded as failed, so setting the variable and starting again is enough.
    """

    def __init__(self, variables: str | tuple[str, ...], needed_by: str) -> None:
        names = (variables,) if isinstance(variables, str) else variables
        which = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        verb = "is" if len(names) == 1 else "are"
        them = "it" if len(names) == 1 else "them"
        super().__init__(
            "config",
            f"{which} {verb} not set where the worker runs: {needed_by} cannot work without "
            f"{them}; set {them} for the workers and start the run again",
        )
        self.variables = names


# -- URLs as they may be shown: credentials out of reprs, errors and the journal ---------------

HIDDEN = "***"
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
_WEB = frozenset({"http", "https", "ws", "wss"})


def redact_url(url: str) -> str:
    """`postgresql://app:s3cret@db/x?sslpassword=y` -> `postgresql://app:***@db/x?***`.

    A lone user name stays for databases and brokers (it says which account); on the web a
    lone user part is a token (`https://TOKEN@host`) and is hidden too.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        if has_password:
            userinfo = f"{user}:{HIDDEN}"
        elif parts.scheme.lower() in _WEB:
            userinfo = HIDDEN
        netloc = f"{userinfo}@{host}"
    query = HIDDEN if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_urls(text: str) -> str:
    """Every URL in a message (an HTTP error names the URL it failed on) redacted."""
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
