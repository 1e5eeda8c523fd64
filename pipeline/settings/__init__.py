"""Every setting nightshift has, declared once (`declared.py`, each field a `setting(...)`:
its variable, type, default, bounds, whether it is a secret, one line of help): `Settings`,
its parsing, validation, the repr's redaction and docs/configuration.md's settings table all come
from the declaration. This package is the one place that reads the process environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.errors import SettingsError
from pipeline.prices import ModelPrice, PriceTable
from pipeline.process_wide import ProcessWide
from pipeline.rate_limits import RateLimit
from pipeline.settings import broker_urls
from pipeline.settings import options as o
from pipeline.settings.declared import (  # noqa: F401 (DEFAULT_MODEL, SECRET_ROW re-exported)
    DEFAULT_MODEL,
    SECRET_ROW,
    Declared,
)
from pipeline.settings.options import Option, option_of
from pipeline.settings.service_config import (
    CONFIG_PREFIX,
    ServiceConfig,
    approvers_from,
    approvers_variable,
    config_variable,  # noqa: F401 (re-exported: the name tools' settings go by)
)

STEP_GIVE_UP_SECONDS = 10.0
"""Past its time limit and the lease, a step has given its run up (engine/time_limit.py)."""


@dataclass(frozen=True)
class Settings(Declared):
    """Everything configurable: the declared settings (pipeline/settings/declared.py) and what
    follows from them."""

    environment: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The environment these settings were read from: `is_set` asks it about a variable a
    user's tool needs that nightshift does not declare."""

    def __post_init__(self) -> None:
        sentinel = self.broker_url is not None and broker_urls.is_sentinel(self.broker_url)
        if sentinel and not self.broker_sentinel_master:
            raise SettingsError(
                "NIGHTSHIFT_BROKER_URL names sentinels: set NIGHTSHIFT_BROKER_SENTINEL_MASTER to "
                "the master's name they monitor (their `sentinel monitor NAME ...` line)"
            )
        if self.broker_sentinel_master and not sentinel:
            raise SettingsError(
                "NIGHTSHIFT_BROKER_SENTINEL_MASTER is set but NIGHTSHIFT_BROKER_URL names no "
                f"sentinels (it must look like {broker_urls.SENTINELS_EXAMPLE})"
            )
        if (self.broker_sentinel_tls or self.broker_sentinel_tls_ca) and not sentinel:
            raise SettingsError(
                "NIGHTSHIFT_BROKER_SENTINEL_TLS(_CA) is set but NIGHTSHIFT_BROKER_URL names no "
                "sentinels (for TLS to one Redis use a rediss:// URL)"
            )
        if self.broker_sentinel_tls_ca and not self.broker_sentinel_tls:
            raise SettingsError(
                "NIGHTSHIFT_BROKER_SENTINEL_TLS_CA is set but NIGHTSHIFT_BROKER_SENTINEL_TLS is off"
            )
        if self.broker_sentinel_tls_ca and not self.broker_sentinel_tls_ca.is_file():
            raise SettingsError(
                f"NIGHTSHIFT_BROKER_SENTINEL_TLS_CA: no file {str(self.broker_sentinel_tls_ca)!r}"
            )
        if self.visibility_timeout <= self.step_hard_limit:
            raise SettingsError(
                "NIGHTSHIFT_VISIBILITY_TIMEOUT must be above NIGHTSHIFT_STEP_TIME_LIMIT plus the "
                f"lease and {STEP_GIVE_UP_SECONDS:g}s (the time an overrunning step takes to give "
                "up its lease), or Redis redelivers running steps "
                f"({self.visibility_timeout:g} <= {self.step_hard_limit:g})"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, option in _OPTIONS.items():
            raw = env.get(option.variable) or ""
            if raw:
                values[name] = option.parse(option.variable, raw)
        if "heartbeat_seconds" not in values:
            values["heartbeat_seconds"] = values.get("lease_seconds", cls.lease_seconds) / 3
        return cls(
            **values,
            approvers=approvers_from(env),
            config=ServiceConfig.from_env(env, values.get("config_file")),
            environment=dict(env),
        )

    def approvers_for(self, tool: str, declared: tuple[str, ...]) -> tuple[str, ...]:
        """Who may approve `tool`'s actions: the configured list, else the tool's own."""
        return dict(self.approvers).get(approvers_variable(tool), declared)

    def is_set(self, variable: str) -> bool:
        """Whether an environment variable a tool needs (`Tool.needs`) has a value here:
        nightshift's own through these settings, any other (a user's service) from the
        environment they were read from."""
        attribute = _ATTRIBUTE_OF.get(variable)
        if attribute is not None:
            return bool(getattr(self, attribute))
        if variable.startswith(CONFIG_PREFIX):
            return self.config.has(variable)  # from the environment or the config file
        return bool(self.environment.get(variable))

    def __repr__(self) -> str:
        """Secrets are left out and URLs lose their passwords and query strings: settings get
        logged and land in tracebacks."""
        shown = (
            f"{f.name}={o.shown_in_repr(getattr(self, f.name))}" for f in fields(self) if f.repr
        )
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
    def broker_sentinel_tls_options(self) -> dict[str, Any] | None:
        """redis-py's TLS keywords for the sentinels and the servers they name, or None when
        they speak plain Redis."""
        if not self.broker_sentinel_tls:
            return None
        return broker_urls.tls_options(self.broker_sentinel_tls_ca)

    @property
    def broker_sentinel_kwargs(self) -> dict[str, Any]:
        """redis-py's keywords for the sentinels themselves (not the servers they name): their
        own password, TLS."""
        watchers: dict[str, Any] = {}
        if self.broker_sentinel_password:
            watchers["password"] = self.broker_sentinel_password
        if self.broker_sentinel_tls_options:
            watchers.update(ssl=True, **self.broker_sentinel_tls_options)
        return watchers

    @cached_property
    def prices(self) -> PriceTable:
        """US dollars per million tokens by model, for recorded costs and money budgets."""
        default = ModelPrice.from_input_output(
            self.price_input_per_mtok,
            self.price_output_per_mtok,
            self.price_cache_write_per_mtok,
            self.price_cache_read_per_mtok,
        )
        return PriceTable(default, self.model_prices)

    def rate_limit_of(self, model: str) -> RateLimit | None:
        """The limits NIGHTSHIFT_MODEL_RATE_LIMITS sets for calls of `model`, if any."""
        return dict(self.model_rate_limits).get(model)

    @property
    def ready_file(self) -> Path:
        """Where this host's worker says it is ready (`nightshift ready` reads it)."""
        return self.worker_ready_file or self.data_dir / "worker.ready"

    @property
    def metrics_dir(self) -> Path:
        """Where worker processes keep their Prometheus counters (prometheus_client's
        multi-process mode) and `/metrics` reads them: PROMETHEUS_MULTIPROC_DIR, else here."""
        return self.prometheus_multiproc_dir or self.data_dir / "metrics"


def declared_options() -> dict[str, Option]:
    """Every declared setting by its field name, in the order of the table."""
    found = {f.name: option_of(f) for f in fields(Settings)}
    return {name: option for name, option in found.items() if option is not None}


_FAMILIES = ("approvers", "config")
"""Settings read from a family of variables (a prefix), not from the one their row names."""
_OPTIONS = {name: option for name, option in declared_options().items() if name not in _FAMILIES}
_ATTRIBUTE_OF = {option.variable: name for name, option in _OPTIONS.items()}
"""Variables tools may need that Settings reads (a test's Settings may differ from os.environ)."""


def settings_table() -> str:
    """docs/configuration.md's settings table (`python -m pipeline.settings` prints it)."""
    return o.markdown_table(list(declared_options().values()))


def child_environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child process starts with: this process's, with `overrides` on top."""
    return {**os.environ, **(overrides or {})}


SERVER_VARIABLES = ("PATH", "HOME", "TMPDIR", "TZ", "LD_LIBRARY_PATH")
"""What an embedded server keeps of this process's environment: where programs, libraries,
home and temporary files are, and the timezone initdb gives a new cluster."""


def server_environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment an embedded PostgreSQL or Redis starts with: SERVER_VARIABLES, a C
    locale (one every machine has), `overrides`, and nothing else. Never the API token, a
    webhook secret or a model key: the superuser of any database session can read the
    postmaster's environment (pg_read_binary_file('/proc/<pid>/environ')), and PG* variables
    (PGPORT, PGHOST...) would steer pg_ctl."""
    kept = {name: os.environ[name] for name in SERVER_VARIABLES if name in os.environ}
    return {**kept, "LC_ALL": "C", "LANG": "C", **(overrides or {})}


def use_environment(values: Mapping[str, str], *, only_unset: bool = False) -> Settings:
    """Set variables in this process's environment (the demo and the chaos harness configure
    themselves before they start what reads them) and read the settings again."""
    for name, value in values.items():
        if not (only_unset and name in os.environ):
            os.environ[name] = value
    get_settings.cache_clear()
    return get_settings()


get_settings: ProcessWide[Settings] = ProcessWide(Settings.from_env)
"""This process's settings, read from its environment once (`get_settings.cache_clear()` reads
them again); pipeline.testing puts a test's own in force (`get_settings.replaced_by`)."""
