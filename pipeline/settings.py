"""Typed settings read from the environment; every knob the runtime has lives here."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import platformdirs

from pipeline.errors import PermanentError, SettingsError, redact_url
from pipeline.prices import DEFAULT_PRICES, ModelPrice, PriceTable, parse_model_prices

DEFAULT_MODEL = "claude-sonnet-4-5"
CONFIG_PREFIX = "NIGHTSHIFT_CONFIG_"
CONFIG_FILE_ENV = "NIGHTSHIFT_CONFIG_FILE"
_SECRET = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$")
"""Settings named like this (`acme.token`, `acme.api_key`) are secrets: redacted wherever
nightshift writes what a tool said (journal, actions, logs) and never shown."""
REDACTED = "[redacted]"
STEP_GIVE_UP_SECONDS = 10.0
"""Past its time limit and the lease, a step has given its run up (engine/time_limit.py)."""


def _postgres_url(name: str, raw: str) -> str:
    """Validate a PostgreSQL URL and pin SQLAlchemy to the psycopg 3 driver."""
    parts = urlsplit(raw)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("postgresql", "postgres") or not (parts.hostname or "host=" in parts.query):
        raise SettingsError(
            f"{name} must look like postgresql://user@host:5432/dbname (got a value with "
            f"scheme {parts.scheme or 'none'!r} and host {parts.hostname or 'none'!r})"
        )
    return "postgresql+psycopg" + raw[len(parts.scheme) :]


def _redis_url(name: str, raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise SettingsError(
            f"{name} must look like redis://host:6379/0 (got a value with scheme "
            f"{parts.scheme or 'none'!r} and host {parts.hostname or 'none'!r})"
        )
    return raw


def _number(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(
            f"{name} must be a number of seconds or a count (got {raw!r})"
        ) from None
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum:g} (got {raw!r})")
    return value


def _optional_number(env: Mapping[str, str], name: str) -> float | None:
    return _number(env, name, 0.0) if env.get(name) else None


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(name) or default
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise SettingsError(f"{name} must be on or off (got {raw!r})")


def _prices(env: Mapping[str, str]) -> PriceTable:
    input_price = _number(env, "NIGHTSHIFT_PRICE_INPUT_PER_MTOK", 3.0)
    base = ModelPrice.from_input_output(
        input_price, _number(env, "NIGHTSHIFT_PRICE_OUTPUT_PER_MTOK", 15.0)
    )
    default = ModelPrice(
        base.input,
        base.output,
        cache_write=_number(env, "NIGHTSHIFT_PRICE_CACHE_WRITE_PER_MTOK", base.cache_write),
        cache_read=_number(env, "NIGHTSHIFT_PRICE_CACHE_READ_PER_MTOK", base.cache_read),
    )
    raw = env.get("NIGHTSHIFT_MODEL_PRICES") or ""
    by_model = parse_model_prices("NIGHTSHIFT_MODEL_PRICES", raw) if raw.strip() else ()
    return PriceTable(default, by_model)


def _timezone(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name) or default
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"{name} must be an IANA timezone like Europe/Berlin (got {value!r})"
        ) from None
    return value


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, default)
    if not 0 < value <= 1:
        raise SettingsError(f"{name} must be a fraction above 0 and at most 1 (got {value:g})")
    return value


APPROVERS_PREFIX = "NIGHTSHIFT_APPROVERS_"


def approvers_variable(tool: str) -> str:
    """`set_price` -> `NIGHTSHIFT_APPROVERS_SET_PRICE`."""
    return APPROVERS_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", tool).upper()


def _approvers(env: Mapping[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    configured = []
    for name, raw in sorted(env.items()):
        if not name.startswith(APPROVERS_PREFIX):
            continue
        people = tuple(p.strip() for p in raw.split(",") if p.strip())
        if not people:
            raise SettingsError(
                f"{name} is empty: name at least one approver (comma-separated), or unset it "
                "to use the tool's own list"
            )
        configured.append((name, people))
    return tuple(configured)


def config_variable(name: str) -> str:
    """The environment variable of a tool setting: `acme.url` -> NIGHTSHIFT_CONFIG_ACME_URL."""
    return CONFIG_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


@dataclass(frozen=True, repr=False)
class ServiceConfig:
    """The settings of the services users' tools talk to (URLs, tokens), read once from
    NIGHTSHIFT_CONFIG_* variables and the TOML file named by NIGHTSHIFT_CONFIG_FILE; a tool
    reads them with `context.config("acme.url")`. The repr names settings, never values."""

    values: tuple[tuple[str, str, str], ...] = ()
    """(variable, value, where it came from); the environment's first."""

    def has(self, name: str) -> bool:
        """Whether `name` (`acme.url` or NIGHTSHIFT_CONFIG_ACME_URL) has a value."""
        variable = name if name.startswith(CONFIG_PREFIX) else config_variable(name)
        return any(var == variable and value for var, value, _ in self.values)

    def get(self, name: str, default: str | None = None) -> str:
        variable = config_variable(name)
        found = next((value for var, value, _ in self.values if var == variable), None)
        if found is not None:
            return found
        if default is not None:
            return default
        section, _, key = name.rpartition(".")
        where = f"[{section}] {key}" if section else key
        raise PermanentError(
            f"setting {name!r} is not configured: set {variable} or {where} "
            f"in the file named by {CONFIG_FILE_ENV}"
        )

    def names(self) -> list[str]:
        """The configured settings, as variables, with where each comes from."""
        return [f"{var} ({where})" for var, _, where in self.values]

    def redact(self, text: str) -> str:
        """`text` with every secret setting's value replaced by [redacted]."""
        for variable, value, _ in self.values:
            if len(value) >= 4 and _SECRET.search(variable[len(CONFIG_PREFIX) :]):
                text = text.replace(value, REDACTED)
        return text

    def __repr__(self) -> str:
        return f"ServiceConfig({', '.join(var for var, _, _ in self.values)})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServiceConfig:
        values = [
            (var, value, "environment")
            for var, value in sorted(env.items())
            if var.startswith(CONFIG_PREFIX) and var != CONFIG_FILE_ENV
        ]
        path = env.get(CONFIG_FILE_ENV)
        if path:
            known = {var for var, _, _ in values}
            values += [(v, value, path) for v, value in _config_file(path) if v not in known]
        return cls(tuple(values))


def _config_file(path: str) -> list[tuple[str, str]]:
    try:
        data = tomllib.loads(Path(path).expanduser().read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{CONFIG_FILE_ENV}={path} cannot be read: {exc}") from None

    def flatten(table: Mapping[str, object], prefix: str) -> list[tuple[str, str]]:
        found = []
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                found += flatten(value, f"{name}.")
            elif isinstance(value, str | int | float | bool):
                found.append(
                    (
                        config_variable(name),
                        str(value).lower() if isinstance(value, bool) else str(value),
                    )
                )
            else:
                raise SettingsError(f"{CONFIG_FILE_ENV}={path}: {name} must be a string or number")
        return found

    return flatten(data, "")


def _notify_secret(env: Mapping[str, str]) -> str | None:
    secret = env.get("NIGHTSHIFT_NOTIFY_SECRET") or None
    if secret is not None and len(secret) < 16:
        raise SettingsError("NIGHTSHIFT_NOTIFY_SECRET must be at least 16 characters long")
    return secret


@dataclass(frozen=True)
class Settings:
    """Everything configurable. URLs are None when the embedded default should be used."""

    database_url: str | None
    broker_url: str | None
    data_dir: Path
    lease_seconds: float = 15.0
    heartbeat_seconds: float = 5.0
    tick_seconds: float = 2.0
    schedule_check_seconds: float = 30.0
    """How often beat asks Postgres which schedule slots are due."""
    schedules_file: Path | None = None
    """JSON file of schedules that add to or override the shipped ones."""
    handoff_grace_seconds: float = 60.0
    """A run handed to the next step (no lease) is re-sent by the tick only after this long:
    shorter floods a long queue with duplicate step messages; it only matters after a crash
    between a checkpoint's commit and the send of the next step."""
    step_time_limit: float = 600.0
    """A step's time bound, enforced by the engine in every pool (pipeline/engine/time_limit.py)."""
    visibility_timeout: float = 3600.0
    service_retry_seconds: float = 300.0
    """A side effect whose service kept failing (nothing in flight) is tried again this much
    later, from a durable timer."""
    worker_lost_max_retries: int = 3
    worker_concurrency: int = 16
    worker_heartbeat_seconds: float = 10.0
    """How often a worker records that it is alive; one silent for three times this is gone."""
    queue: str = "nightshift"
    """The broker queue for steps; separate environments on one Redis use separate queues."""
    max_input_bytes: int = 64 * 1024
    artifact_threshold_bytes: int = 16 * 1024
    model_name: str = DEFAULT_MODEL
    model_timeout_seconds: float = 120.0
    max_tokens_cap: int = 8192
    """A reply cut off at max_tokens is asked again with twice the room, up to this."""
    prompt_caching: bool = True
    """Cache breakpoints on the stable prefix of every Anthropic request."""
    prices: PriceTable = DEFAULT_PRICES
    """US dollars per million tokens by model, for recorded costs and money budgets."""
    nightly_cost_cap_usd: float | None = None
    """Money over every batch of a night; reaching it stops all of them (reason nightly_budget)."""
    nightly_alert_fraction: float = 0.8
    """The share of the nightly cap at which one warning alert is raised."""
    night_timezone: str = "UTC"
    """A night runs from noon to noon here, named by its first day."""
    alert_webhook_url: str | None = None
    """Budget alerts are POSTed here as JSON (and always recorded in the alerts table)."""
    notify_secret: str | None = field(default=None, repr=False)
    """Signs the completion webhooks sent to runs' and batches' notify_url."""
    anthropic_base_url: str | None = None
    anthropic_api_key: str | None = field(default=None, repr=False)
    flower_basic_auth: str | None = field(default=None, repr=False)
    task_events: bool = False
    """Send Celery task events always (Flower turns them on by itself while it runs)."""
    crash_points: frozenset[str] = frozenset()
    pause_points: frozenset[str] = frozenset()
    """Tests only (NIGHTSHIFT_PAUSE_POINTS): crash points where the worker stops itself
    (SIGSTOP) instead of dying, so a test can act at that instant and then let it go on."""
    web_url: str | None = None
    email_url: str | None = None
    pricing_url: str | None = None
    githost_url: str | None = None
    email_mode: str = "keys"
    """How the deployed email API behaves: keys (honours Idempotency-Key), lookup (sends
    every request but can be asked what was sent under a key) or none (neither)."""
    email_key_retention_hours: float = 24.0
    max_emails_per_run: int = 50
    """Emails one run may send (NIGHTSHIFT_MAX_EMAILS_PER_RUN): a model talked into mailing
    everyone stops here. Counted from the run's recorded actions, so a replay or a crash
    cannot reset it."""
    approvers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Per tool (by `approvers_variable`), from NIGHTSHIFT_APPROVERS_<TOOL>: who may approve
    its actions, in place of the list the tool declares. A tuple so Settings stays hashable."""

    def approvers_for(self, tool: str, declared: tuple[str, ...]) -> tuple[str, ...]:
        """Who may approve `tool`'s actions: the configured list, else the tool's own."""
        return dict(self.approvers).get(approvers_variable(tool), declared)

    config: ServiceConfig = ServiceConfig()
    """Users' tools' own settings: `context.config("acme.url")`."""

    def is_set(self, variable: str) -> bool:
        """Whether an environment variable a tool needs (`Tool.needs`) has a value here:
        nightshift's own through these settings, any other (a user's service) from the
        environment."""
        attribute = _ATTRIBUTE_OF.get(variable)
        if attribute is not None:
            return bool(getattr(self, attribute))
        if variable.startswith(CONFIG_PREFIX):
            return self.config.has(variable)  # from the environment or the config file
        return bool(os.environ.get(variable))

    def __repr__(self) -> str:
        """Keys are left out and URLs lose their passwords and query strings: settings get
        logged and land in tracebacks."""
        shown = (f"{f.name}={_shown(getattr(self, f.name))}" for f in fields(self) if f.repr)
        return f"Settings({', '.join(shown)})"

    @property
    def embedded(self) -> bool:
        return self.database_url is None or self.broker_url is None

    @property
    def step_hard_limit(self) -> float:
        """Celery's task_time_limit (only the prefork pool has one): a backstop behind the
        engine's bound, which gives the run up first."""
        return self.step_time_limit + self.lease_seconds + STEP_GIVE_UP_SECONDS

    @property
    def control_queue(self) -> str:
        """The tick and the schedule check: never stuck behind a night's backlog of steps."""
        return f"{self.queue}-control"

    @property
    def metrics_dir(self) -> Path:
        """Where worker processes keep their Prometheus counters (prometheus_client's
        multi-process mode) and `/metrics` reads them: PROMETHEUS_MULTIPROC_DIR, else here."""
        configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        return Path(configured) if configured else self.data_dir / "metrics"

    @property
    def artifact_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        db = env.get("NIGHTSHIFT_DATABASE_URL") or None
        broker = env.get("NIGHTSHIFT_BROKER_URL") or None
        data_dir = env.get("NIGHTSHIFT_DATA_DIR") or platformdirs.user_data_dir("nightshift")
        lease = _number(env, "NIGHTSHIFT_LEASE_SECONDS", 15.0, minimum=1.0)
        step_limit = _number(env, "NIGHTSHIFT_STEP_TIME_LIMIT", 600.0, minimum=1.0)
        visibility = _number(env, "NIGHTSHIFT_VISIBILITY_TIMEOUT", 3600.0, minimum=1.0)
        backstop = step_limit + lease + STEP_GIVE_UP_SECONDS
        if visibility <= backstop:
            raise SettingsError(
                "NIGHTSHIFT_VISIBILITY_TIMEOUT must be above NIGHTSHIFT_STEP_TIME_LIMIT plus the "
                f"lease and {STEP_GIVE_UP_SECONDS:g}s (the time an overrunning step takes to give "
                f"up its lease), or Redis redelivers running steps ({visibility:g} <= {backstop:g})"
            )
        crash = env.get("NIGHTSHIFT_CRASH_POINTS", "")
        return cls(
            database_url=_postgres_url("NIGHTSHIFT_DATABASE_URL", db) if db else None,
            broker_url=_redis_url("NIGHTSHIFT_BROKER_URL", broker) if broker else None,
            data_dir=Path(data_dir).expanduser().resolve(),
            lease_seconds=lease,
            heartbeat_seconds=_number(env, "NIGHTSHIFT_HEARTBEAT_SECONDS", lease / 3, 0.1),
            tick_seconds=_number(env, "NIGHTSHIFT_TICK_SECONDS", 2.0, minimum=0.5),
            handoff_grace_seconds=_number(env, "NIGHTSHIFT_HANDOFF_GRACE_SECONDS", 60.0, 1.0),
            schedule_check_seconds=_number(env, "NIGHTSHIFT_SCHEDULE_CHECK_SECONDS", 30.0, 1.0),
            schedules_file=Path(env["NIGHTSHIFT_SCHEDULES_FILE"])
            if env.get("NIGHTSHIFT_SCHEDULES_FILE")
            else None,
            step_time_limit=step_limit,
            visibility_timeout=visibility,
            service_retry_seconds=_number(env, "NIGHTSHIFT_SERVICE_RETRY_SECONDS", 300.0, 1.0),
            worker_lost_max_retries=int(_number(env, "NIGHTSHIFT_WORKER_LOST_MAX_RETRIES", 3)),
            worker_concurrency=int(_number(env, "NIGHTSHIFT_WORKER_CONCURRENCY", 16, 1)),
            worker_heartbeat_seconds=_number(env, "NIGHTSHIFT_WORKER_HEARTBEAT_SECONDS", 10.0, 1),
            queue=env.get("NIGHTSHIFT_QUEUE") or "nightshift",
            max_input_bytes=int(_number(env, "NIGHTSHIFT_MAX_INPUT_BYTES", 64 * 1024, 1)),
            artifact_threshold_bytes=int(
                _number(env, "NIGHTSHIFT_ARTIFACT_THRESHOLD_BYTES", 16 * 1024, 1)
            ),
            model_name=env.get("NIGHTSHIFT_MODEL") or DEFAULT_MODEL,
            model_timeout_seconds=_number(env, "NIGHTSHIFT_MODEL_TIMEOUT", 120.0, minimum=0.1),
            max_tokens_cap=int(_number(env, "NIGHTSHIFT_MAX_TOKENS_CAP", 8192, minimum=1)),
            prompt_caching=_switch(env, "NIGHTSHIFT_PROMPT_CACHING", True),
            prices=_prices(env),
            nightly_cost_cap_usd=_optional_number(env, "NIGHTSHIFT_NIGHTLY_COST_CAP_USD"),
            nightly_alert_fraction=_fraction(env, "NIGHTSHIFT_NIGHTLY_ALERT_AT", 0.8),
            night_timezone=_timezone(env, "NIGHTSHIFT_NIGHT_TIMEZONE", "UTC"),
            alert_webhook_url=env.get("NIGHTSHIFT_ALERT_WEBHOOK_URL") or None,
            notify_secret=_notify_secret(env),
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            flower_basic_auth=env.get("NIGHTSHIFT_FLOWER_BASIC_AUTH") or None,
            task_events=_switch(env, "NIGHTSHIFT_TASK_EVENTS", False),
            crash_points=frozenset(p.strip() for p in crash.split(",") if p.strip()),
            pause_points=frozenset(
                p.strip() for p in env.get("NIGHTSHIFT_PAUSE_POINTS", "").split(",") if p.strip()
            ),
            web_url=env.get("NIGHTSHIFT_WEB_URL") or None,
            email_url=env.get("NIGHTSHIFT_EMAIL_URL") or None,
            pricing_url=env.get("NIGHTSHIFT_PRICING_URL") or None,
            githost_url=env.get("NIGHTSHIFT_GITHOST_URL") or None,
            email_mode=_choice(env, "NIGHTSHIFT_EMAIL_MODE", ("keys", "lookup", "none"), "keys"),
            email_key_retention_hours=_number(env, "NIGHTSHIFT_EMAIL_KEY_RETENTION_HOURS", 24.0),
            max_emails_per_run=int(_number(env, "NIGHTSHIFT_MAX_EMAILS_PER_RUN", 50)),
            approvers=_approvers(env),
            config=ServiceConfig.from_env(env),
        )


_ATTRIBUTE_OF = {
    "NIGHTSHIFT_WEB_URL": "web_url",
    "NIGHTSHIFT_EMAIL_URL": "email_url",
    "NIGHTSHIFT_PRICING_URL": "pricing_url",
    "NIGHTSHIFT_GITHOST_URL": "githost_url",
    "NIGHTSHIFT_ALERT_WEBHOOK_URL": "alert_webhook_url",
    "ANTHROPIC_API_KEY": "anthropic_api_key",
    "ANTHROPIC_BASE_URL": "anthropic_base_url",
}
"""Variables tools may need that Settings reads (a test's Settings may differ from os.environ)."""


def _shown(value: object) -> str:
    return repr(redact_url(value)) if isinstance(value, str) and "://" in value else repr(value)


@cache
def get_settings() -> Settings:
    return Settings.from_env()
