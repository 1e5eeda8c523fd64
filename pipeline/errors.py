"""nightshift's errors, in two roots; the docstring is each error's default message. And what a
message may say: URLs without their credentials and query strings.

NightshiftError (an Exception) is the root of every error. Each error derives from one base that
says what the caller can do: NotFound (Gone), Invalid (TooLarge, Malformed, UnsupportedMediaType),
Conflict, Refused, Unauthenticated, Unavailable, Misconfigured or Failed; the API answers each
base with one status (pipeline/api/base.py, the only place statuses come from). Every error the
runtime (layers 1 to 4) raises is defined here; an edge (api, cli, chaos, processes, sandbox,
testing) or an agent keeps an error only it raises beside the code that raises it, derived from
a base here. tests/unit/test_error_hierarchy.py keeps it so.

StopStep (a BaseException) is the root of the stop signals: LeaseLost, StepTimeUp (and its
Stuck), RunStopped, and ParkRun (in pipeline/engine/actions.py: it carries a Wait of
pipeline.keys, a layer above this one). They end a step past any `except Exception` in an agent
or a tool; only the engine raises and catches them."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit


class NightshiftError(Exception):
    """nightshift failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


# -- the bases: what the caller can do about it (the API answers each with one status) -------


class NotFound(NightshiftError):
    """Nothing has that name or id."""


class Gone(NotFound):
    """It existed, but is gone (deleted by retention, or lost)."""


class Invalid(NightshiftError):
    """What was given is wrong: fix it and ask again."""


class TooLarge(Invalid):
    """What was given is larger than the limit."""


class TooSlow(Invalid):
    """What was being sent did not arrive in time."""


class Malformed(Invalid):
    """What was sent cannot be read at all (not JSON, not a form, a header that is no number)."""


class UnsupportedMediaType(Invalid):
    """What was sent is not of a type this accepts (its Content-Type)."""


class Conflict(NightshiftError):
    """The record is not in a state that allows this, or disagrees with what was given."""


class Refused(NightshiftError):
    """The caller may not do this."""


class Unauthenticated(NightshiftError):
    """The request proves no one (a missing or wrong credential or signature)."""

    scheme: str | None = None
    """The credential that would prove someone, when one would (an HTTP answer names it in
    WWW-Authenticate)."""


class Unavailable(NightshiftError):
    """Something this needs is not there now (a service, a setting, a model): not the caller's
    mistake; it may work later, or on a deployment that has it."""


class Misconfigured(NightshiftError):
    """nightshift, an agent or a schedule is set up wrongly: the deployment must change."""


class Failed(NightshiftError):
    """An operation failed in a way none of the other bases describes."""


# -- the errors ----------------------------------------------------------------------------


class SettingsError(Misconfigured):
    """A setting in the environment is missing or malformed."""


class DefinitionError(Misconfigured):
    """An agent or a tool is defined wrongly."""


class ServiceError(Failed):
    """An embedded service could not be started or reached.

    Failed rather than Unavailable: its message quotes the service's log, which is for the
    operator (the API logs it and answers 500 without it)."""


class UnknownAgent(Invalid):
    """No agent is registered under that name.

    Invalid rather than NotFound: the name is a field of what the caller sent (a run's
    `agent`), so the API answers 422 like any other field it cannot accept."""


class UnknownAction(NotFound):
    """No action has that idempotency key."""


class UnknownBatch(NotFound):
    """No batch has that id."""


class UnknownBulkOperation(NotFound):
    """No bulk operation has this id."""


class UnknownArtifact(NotFound):
    """The run has no artifact with that id."""


class UnknownSchedule(NotFound):
    """No schedule has that name."""


class UnknownToken(NotFound):
    """No token has that id or prefix."""


class UnknownEventSource(NotFound):
    """No agent takes events from that source."""


class RunNotFound(NotFound):
    """No run has that id."""


class NoModel(Unavailable):
    """The agent has no script and no model is configured (ANTHROPIC_API_KEY)."""


class InvalidInput(Invalid):
    """The run's input does not match the agent's schema."""


class NothingMatched(InvalidInput):
    """A bulk operation's filter matched nothing to act on: no operation was made."""


class InputTooLarge(TooLarge, InvalidInput):
    """The run's input is larger than the configured limit."""


class StatusConflict(Conflict):
    """The record is not in a state that allows this transition."""


class DatabaseUnavailable(Unavailable):
    """PostgreSQL could not be reached to claim the run: nothing was done."""


class NonDeterminism(Conflict):
    """The journal holds a different step than the code now asks for."""


class TemporaryError(Unavailable):
    """A temporary failure that is worth retrying (timeout, connection, 429, 5xx)."""


class PermanentError(Failed):
    """A failure that retrying cannot fix (400, 401, 403, 404, schema errors)."""


class LookupUnsupported(Failed):
    """The service cannot say what happened under a key."""


class NotConfigured(Unavailable):
    """A setting the run's tools cannot work without is not set where the worker runs.

    An error a tool raises (or the engine, before the first step, for a tool's `needs`): the
    engine turns it into the stop signal RunStopped with reason `config`, so the run fails at
    once, before anything is sent; nothing about the action's key is recorded as failed, so
    setting the variable and starting again is enough.
    """

    def __init__(self, variables: str | tuple[str, ...], needed_by: str) -> None:
        names = (variables,) if isinstance(variables, str) else variables
        which = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        verb = "is" if len(names) == 1 else "are"
        them = "it" if len(names) == 1 else "them"
        super().__init__(
            f"{which} {verb} not set where the worker runs: {needed_by} cannot work without "
            f"{them}; set {them} for the workers and start the run again"
        )
        self.variables = names

    def stop(self) -> RunStopped:
        """The stop signal that ends the run: reason `config`, this message."""
        return RunStopped("config", str(self))


class ArtifactTooLarge(TooLarge):
    """Over NIGHTSHIFT_ARTIFACT_MAX_BYTES: nothing is kept, and the model is told so."""


class AgentStateTooLarge(PermanentError):
    """Over NIGHTSHIFT_AGENT_STATE_MAX_BYTES: the change is refused and the state stays as it
    was; a tool that does not catch it fails with this error, which the model reads."""


class BadSignature(Unauthenticated):
    """The webhook's signature or timestamp is missing or wrong."""


class RegistryError(Misconfigured):
    """An agent could not be registered."""


class DecisionConflict(StatusConflict):
    """A different decision was already made for this action."""


class NotAnApprover(Refused):
    """This person is not among the action's approvers."""


class TargetRefused(InvalidInput):
    """The URL is not one nightshift may send to."""


class TargetUnresolved(Unavailable):
    """The URL's host does not resolve now (maybe later: nothing was sent)."""


class IdempotencyConflict(Conflict):
    """This idempotency key already started a run with a different request."""


class ScheduleError(Misconfigured):
    """The schedule definition is invalid."""


class OnceOutsideStep(Misconfigured):
    """once() works only inside a tool called by a run's step (and not inside a side effect's
    send, which the action protocol already makes happen once)."""


class AmbiguousRunId(Conflict):
    """That prefix is the start of more than one run id."""


# -- the second root: stop signals ---------------------------------------------------------


class StopStep(BaseException):
    """The step must stop now: the root of the stop signals, the engine's own control flow
    (nothing an agent or a tool raises, except through NotConfigured).

    Derives from BaseException so that an agent's or tool's `except Exception` cannot swallow it.
    """


class LeaseLost(StopStep):
    """Another worker holds this run now; this step may not write anything more."""


class StepTimeUp(StopStep):
    """The step reached its time bound (NIGHTSHIFT_STEP_TIME_LIMIT) at a model or tool call:
    the run goes on in another attempt."""


class Stuck(StepTimeUp):
    """The work did not return in time (stuck in a call that never reached a time check)."""


class RunStopped(StopStep):
    """The run must stop now (cancelled, past its deadline or a budget, a setting missing): no
    further model or tool call."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# -- URLs as they may be shown: credentials out of reprs, errors and the journal ---------------

HIDDEN = "***"
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
_WEB = frozenset({"http", "https", "ws", "wss"})
_TOKEN_LIKE = re.compile(r"[\w-]{16,}", re.ASCII)
_CHARACTER_CLASSES = ("[a-z]", "[A-Z]", "[0-9]")


def redact_url(url: str) -> str:
    """`postgresql://app:s3cret@db/x?sslpassword=y` -> `postgresql://app:***@db/x?***`.

    A lone user name stays for databases and brokers (it says which account); on the web a
    lone user part is a token (`https://TOKEN@host`) and is hidden too, and so is a path
    segment that may be one (`https://hooks.slack.com/services/T0/B0/***`). A list of
    sentinels (`sentinel://:pw@a:26379;sentinel://:pw@b:26379`) is redacted address by address.
    """
    if url.startswith("sentinel://") and ";" in url:
        return ";".join(redact_url(piece) for piece in url.split(";"))
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
    path = parts.path
    if parts.scheme.lower() in _WEB:
        path = "/".join(_hidden_if_secret(segment) for segment in path.split("/"))
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def _hidden_if_secret(segment: str) -> str:
    """A web path segment that may be a credential (a Slack or Discord hook's secret, a token;
    an id too) hidden: 16 or more letters, digits, `_` or `-`, of two classes or more among
    lower case, upper case and digits. Words (`/hooks/nightly-ops`) stay."""
    if not _TOKEN_LIKE.fullmatch(segment):
        return segment
    classes = sum(1 for pattern in _CHARACTER_CLASSES if re.search(pattern, segment))
    return HIDDEN if classes >= 2 else segment


def redact_urls(text: str) -> str:
    """Every URL in a message (an HTTP error names the URL it failed on) redacted."""
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
