"""The declaration table: one `setting(...)` per variable nightshift reads (its type,
default, bounds, whether it is a secret, one line of help), in the order
docs/configuration.md's table lists them. `Settings` (pipeline/settings/__init__.py) adds what is
derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pipeline.settings.options as o
from pipeline.prices import ModelPrice
from pipeline.rate_limits import RateLimit, parse_rate_limits
from pipeline.settings.broker_urls import broker_url
from pipeline.settings.options import setting
from pipeline.settings.postgres_urls import postgres_url
from pipeline.settings.service_config import (
    APPROVERS_PREFIX,
    CONFIG_FILE_ENV,
    CONFIG_PREFIX,
    ServiceConfig,
)

DEFAULT_MODEL = "claude-sonnet-4-5"
SECRET_ROW = "16+ characters"
LEASE_SECONDS = 15.0
"""The lease's default; the heartbeat's follows it (a third of the lease)."""


@dataclass(frozen=True)
class Declared:
    """Every declared setting, a field each. URLs are None when the embedded default should
    be used."""

    # fmt: off
    database_url: str | None = setting(
        "NIGHTSHIFT_DATABASE_URL", None,
        "PostgreSQL, e.g. `postgresql://user:pw@db:5432/nightshift`; several hosts, a pooler "
        "and the other forms: docs/operations.md, *PostgreSQL URLs*",
        parse=postgres_url, shown="embedded",
    )
    database_direct_url: str | None = setting(
        "NIGHTSHIFT_DATABASE_DIRECT_URL", None,
        "PostgreSQL itself when `NIGHTSHIFT_DATABASE_URL` goes through a pooler: the LISTEN of "
        "live waits (`start --wait`, `wait`, the API's `?wait=`) needs a session of its own",
        parse=postgres_url, shown="the database URL",
    )
    broker_url: str | None = setting(
        "NIGHTSHIFT_BROKER_URL", None,
        "Redis for Celery, e.g. `redis://redis:6379/0` (`rediss://` for TLS), or its sentinels, "
        "`sentinel://s1:26379;sentinel://s2:26379` (docs/redis-sentinel.md)",
        parse=broker_url, shown="embedded",
    )
    broker_sentinel_master: str | None = setting(
        "NIGHTSHIFT_BROKER_SENTINEL_MASTER", None, parse=o.text,
        help="the master's name the sentinels know (their `sentinel monitor NAME ...`); "
        "required with a `sentinel://` broker URL",
    )
    broker_sentinel_password: str | None = setting(
        "NIGHTSHIFT_BROKER_SENTINEL_PASSWORD", None, parse=o.text, secret=True,
        help="the sentinels' own password, when they have one (the master's goes in the URL)",
    )
    broker_sentinel_tls: bool = setting(
        "NIGHTSHIFT_BROKER_SENTINEL_TLS", False, parse=o.switch,
        help="through Sentinel, the sentinels and the Redis servers they name speak TLS only "
        "(their `tls-port`); their certificates are verified (docs/redis-sentinel.md)",
    )
    broker_sentinel_tls_ca: Path | None = setting(
        "NIGHTSHIFT_BROKER_SENTINEL_TLS_CA", None, parse=o.path, shown="the system's CAs",
        help="the CA file (PEM) the sentinels' and servers' certificates are verified against",
    )
    data_dir: Path = setting(
        "NIGHTSHIFT_DATA_DIR", None, "embedded services, beat's file, metrics",
        parse=o.directory, shown="`~/.local/share/nightshift`", factory=o.default_data_dir,
    )
    queue: str = setting(
        "NIGHTSHIFT_QUEUE", "nightshift",
        "broker queue; separate environments on one Redis use separate queues",
    )
    lease_seconds: float = setting(
        "NIGHTSHIFT_LEASE_SECONDS", LEASE_SECONDS,
        "how long a step's lease lives without a heartbeat; a dead worker's run resumes after it",
        parse=o.number(1.0),
    )
    heartbeat_seconds: float = setting(
        "NIGHTSHIFT_HEARTBEAT_SECONDS", LEASE_SECONDS / 3,
        "how often a working step renews its lease", parse=o.number(0.1), shown="lease / 3",
    )
    tick_seconds: float = setting(
        "NIGHTSHIFT_TICK_SECONDS", 2.0, parse=o.number(0.5),
        help="how often beat's tick resumes orphaned runs and wakes due timers",
    )
    handoff_grace_seconds: float = setting(
        "NIGHTSHIFT_HANDOFF_GRACE_SECONDS", 60.0, parse=o.number(1.0),
        help="a run handed to its next step is re-sent by the tick only after this long (a crash "
        "between a checkpoint and the send): shorter floods a long queue with duplicate step "
        "messages",
    )
    schedule_check_seconds: float = setting(
        "NIGHTSHIFT_SCHEDULE_CHECK_SECONDS", 30.0, parse=o.number(1.0),
        help="how often beat asks Postgres which schedule slots are due",
    )
    schedules_file: Path | None = setting(
        "NIGHTSHIFT_SCHEDULES_FILE", None, parse=o.path,
        help="JSON file adding to or overriding the shipped schedules (`docs/schedules.md`)",
    )
    step_time_limit: float = setting(
        "NIGHTSHIFT_STEP_TIME_LIMIT", 600.0,
        "the most one step may take, in any pool: past it the step gives its run up to another "
        "attempt, which replays what was journaled (Celery's own limit, prefork only, is a "
        "backstop behind it)",
        parse=o.number(1.0),
    )
    service_retry_seconds: float = setting(
        "NIGHTSHIFT_SERVICE_RETRY_SECONDS", 300.0,
        "a side effect whose service kept failing (nothing in flight) is tried again this much "
        "later, from a durable timer",
        parse=o.number(1.0),
    )
    visibility_timeout: float = setting(
        "NIGHTSHIFT_VISIBILITY_TIMEOUT", 3600.0, parse=o.number(1.0),
        help="Redis visibility timeout; must exceed the step time limit plus the lease and 10 s",
    )
    worker_heartbeat_seconds: float = setting(
        "NIGHTSHIFT_WORKER_HEARTBEAT_SECONDS", 10.0,
        "how often a worker records that it is alive (`worker_heartbeats`); `runs`, `show` and "
        "the status page say when none is",
        parse=o.number(1.0),
    )
    worker_ready_file: Path | None = setting(
        "NIGHTSHIFT_WORKER_READY_FILE", None, parse=o.path, shown="`DATA_DIR/worker.ready`",
        help="the file a worker keeps fresh while PostgreSQL answers its heartbeats, and removes "
        "when it does not: `nightshift ready` reads it (a supervisor's or Kubernetes' readiness "
        "probe); several workers on one host each need their own",
    )
    worker_concurrency: int = setting(
        "NIGHTSHIFT_WORKER_CONCURRENCY", 16, "steps in flight per worker process (threads)",
        parse=o.count(1),
    )
    db_pool_size: int = setting(
        "NIGHTSHIFT_DB_POOL_SIZE", 10, parse=o.count(1),
        help="database connections a process keeps; its threads (any `--concurrency`) wait for one "
        "instead of opening more",
    )
    unknown_agent_seconds: float = setting(
        "NIGHTSHIFT_UNKNOWN_AGENT_SECONDS", 120.0, parse=o.number(1.0),
        help="how long a step, or a `start_run`/`start_from_event`, of an agent its worker lacks "
        "is handed on (about once a second) for a worker that has it, before the run fails "
        "`unknown_agent` (a start: the caller's `.get()` raises why): longer than a rolling "
        "deploy takes to start its new workers",
    )
    worker_lost_max_retries: int = setting(
        "NIGHTSHIFT_WORKER_LOST_MAX_RETRIES", 3, "re-sends of a step whose pool process died"
    )
    max_input_bytes: int = setting(
        "NIGHTSHIFT_MAX_INPUT_BYTES", 64 * 1024, parse=o.count(1),
        help="largest run input a caller may give (a batch's synthesis, whose input is every "
        "child's outcome, is not held to it)",
    )
    artifact_threshold_bytes: int = setting(
        "NIGHTSHIFT_ARTIFACT_THRESHOLD_BYTES", 16 * 1024, parse=o.count(1),
        help="tool outputs larger than this are kept as artifacts (in PostgreSQL)",
    )
    artifact_max_bytes: int = setting(
        "NIGHTSHIFT_ARTIFACT_MAX_BYTES", 4 * 1024 * 1024, parse=o.count(1),
        help="largest artifact kept; a larger report is refused and the model is told why",
    )
    agent_state_max_bytes: int = setting(
        "NIGHTSHIFT_AGENT_STATE_MAX_BYTES", 64 * 1024, parse=o.count(1),
        help="largest agent state (a run's plan and facts, as compact JSON); a tool's change "
        "past it is refused (the tool's error) and the state stays as it was",
    )
    anthropic_api_key: str | None = setting(
        "ANTHROPIC_API_KEY", None, parse=o.text, secret=True,
        help="set: the real Messages API through the `anthropic` SDK; unset: the scripted model",
    )
    anthropic_base_url: str | None = setting(
        "ANTHROPIC_BASE_URL", None, "another Messages API endpoint (the tests use a local one)",
        parse=o.text, shown="SDK default",
    )
    model_name: str = setting("NIGHTSHIFT_MODEL", DEFAULT_MODEL, "model name")
    model_timeout_seconds: float = setting(
        "NIGHTSHIFT_MODEL_TIMEOUT", 120.0,
        "seconds before a model call counts as timed out (and is retried)",
        parse=o.number(0.1),
    )
    web_url: str | None = setting(
        "NIGHTSHIFT_WEB_URL", None, "the web the shipped agents read", parse=o.text
    )
    email_url: str | None = setting(
        "NIGHTSHIFT_EMAIL_URL", None, "the email API the shipped agents send through",
        parse=o.text,
    )
    pricing_url: str | None = setting(
        "NIGHTSHIFT_PRICING_URL", None, "the price book the shipped agents propose prices to",
        parse=o.text,
    )
    githost_url: str | None = setting(
        "NIGHTSHIFT_GITHOST_URL", None, "the git host Patch reads issues from and opens pull "
        "requests on, through GitHub's REST API (GitHub: `https://api.github.com`; Gitea and "
        "Forgejo: `https://host/api/v1`)",
        parse=o.text,
    )
    githost_token: str | None = setting(
        "NIGHTSHIFT_GITHOST_TOKEN", None, parse=o.text, secret=True,
        help="the git host's token, sent as `Authorization: Bearer`; unset: no header",
    )
    email_mode: str = setting(
        "NIGHTSHIFT_EMAIL_MODE", "keys",
        "how your email API behaves: `keys` (honours `Idempotency-Key`), `lookup` (can be asked "
        "what was sent under a key), `none`",
        parse=o.choice("keys", "lookup", "none"),
    )
    email_key_retention_hours: float = setting(
        "NIGHTSHIFT_EMAIL_KEY_RETENTION_HOURS", 24.0,
        "how long the email API remembers a key; later, nightshift reconciles instead of "
        "resending",
    )
    max_emails_per_run: int = setting(
        "NIGHTSHIFT_MAX_EMAILS_PER_RUN", 50,
        "emails one run may send; the call past it is refused (a permanent error the model "
        "sees) and nothing is sent. Counted from the run's recorded actions, so a replay or a "
        "crash cannot reset it",
    )
    model_outage_horizon_seconds: float = setting(
        "NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS", 4 * 3600.0, parse=o.number(1.0),
        help=(
            "how long an outage of the model provider the runs wait out, from its start; "
            "past it the waiting runs fail `model_unavailable` (a run's own deadline, if "
            "sooner, ends it `deadline`)"
        ),
    )
    model_probe_max_seconds: float = setting(
        "NIGHTSHIFT_MODEL_PROBE_MAX_SECONDS", 60.0, parse=o.number(1.0),
        help=(
            "during an outage one run probes the model, ~5 s after it began, then backing"
            " off (doubling, jittered, never before a reply's `retry-after`) up to this "
            "between probes"
        ),
    )
    model_resume_per_second: float = setting(
        "NIGHTSHIFT_MODEL_RESUME_PER_SECOND", 5.0, parse=o.number(0.1),
        help=(
            "once a probe got a reply, the runs that waited are woken at about this rate "
            "(so many per tick)"
        ),
    )
    model_rate_limits: tuple[tuple[str, RateLimit], ...] = setting(
        "NIGHTSHIFT_MODEL_RATE_LIMITS", (), parse=parse_rate_limits, shown="unset",
        help='your provider\'s limits per model, JSON: `{"claude-sonnet-4-5": '
        '{"requests_per_minute": 50, "input_tokens_per_minute": 30000, '
        '"output_tokens_per_minute": 8000}}`; every worker of every host paces its calls of '
        "that model (with the same API key) under them together, a run waiting its turn parked "
        "with reason `rate_limit` (docs/flow-control.md)",
    )
    max_tokens_cap: int = setting(
        "NIGHTSHIFT_MAX_TOKENS_CAP", 8192,
        "a reply cut off at `max_tokens` is never acted on: the step asks again with twice the "
        "room, up to this; past it the run fails with reason `truncated`",
        parse=o.count(1),
    )
    prompt_caching: bool = setting(
        "NIGHTSHIFT_PROMPT_CACHING", True,
        "cache breakpoints on the system prompt and the last two turns of every Anthropic "
        "request",
    )
    price_input_per_mtok: float = setting(
        "NIGHTSHIFT_PRICE_INPUT_PER_MTOK", 3.0,
        "US dollars per million input tokens for any model `NIGHTSHIFT_MODEL_PRICES` does not "
        "name",
    )
    price_output_per_mtok: float = setting(
        "NIGHTSHIFT_PRICE_OUTPUT_PER_MTOK", 15.0, "the same for output tokens"
    )
    price_cache_write_per_mtok: float | None = setting(
        "NIGHTSHIFT_PRICE_CACHE_WRITE_PER_MTOK", None, "the same for prompt-cache writes",
        parse=o.number(), shown="1.25x input",
    )
    price_cache_read_per_mtok: float | None = setting(
        "NIGHTSHIFT_PRICE_CACHE_READ_PER_MTOK", None, "the same for prompt-cache reads",
        parse=o.number(), shown="0.1x input",
    )
    model_prices: tuple[tuple[str, ModelPrice], ...] = setting(
        "NIGHTSHIFT_MODEL_PRICES", (),
        'per model, JSON: `{"claude-haiku-4-5": {"input": 1, "output": 5, "cache_write": 1.25, '
        '"cache_read": 0.1}}`; a reply\'s model takes the longest name it starts with',
        parse=o.model_prices, shown="unset",
    )
    nightly_cost_cap_usd: float | None = setting(
        "NIGHTSHIFT_NIGHTLY_COST_CAP_USD", None, parse=o.number(),
        help="money over every run of a night (noon to noon in `NIGHTSHIFT_NIGHT_TIMEZONE`), "
        "whatever started it: batch, schedule, `.delay()`, API, event; reaching it stops them "
        "all (reason `nightly_budget`)",
    )
    nightly_token_cap: int | None = setting(
        "NIGHTSHIFT_NIGHTLY_TOKEN_CAP", None, parse=o.tokens,
        help="tokens (input, cache writes and reads, output) over every run of a night, "
        "likewise; either cap may be set, or both",
    )
    nightly_alert_fraction: float = setting(
        "NIGHTSHIFT_NIGHTLY_ALERT_AT", 0.8, parse=o.fraction,
        help="share of the nightly cap at which one warning alert is raised",
    )
    night_timezone: str = setting(
        "NIGHTSHIFT_NIGHT_TIMEZONE", "UTC", parse=o.timezone,
        help="a night runs from noon to noon here and is named by its first day",
    )
    agents: str = setting(
        "NIGHTSHIFT_AGENTS", "", shown="unset",
        help="more agents as `module:ATTR,...`, besides the `nightshift.agents` entry points "
        "(docs/agents.md)",
    )
    shipped_agents: frozenset[str] = setting(
        "NIGHTSHIFT_SHIPPED_AGENTS", frozenset(), parse=o.names, shown="none",
        help="which of nightshift's own agents (and so their schedules) this deployment runs: "
        "`all`, or names (`nightly_report,patch`); the demo turns on what it runs "
        "(docs/nightly-jobs.md)",
    )
    config_file: Path | None = setting(
        CONFIG_FILE_ENV, None, parse=o.path,
        help='a TOML file with the same settings as tables (`[acme]` `url = "..."`); the '
        "environment wins",
    )
    config: ServiceConfig = setting(
        f"{CONFIG_PREFIX}<SERVICE>_<SETTING>", ServiceConfig(), shown="unset",
        help='your tools\' own settings: `context.config("acme.url")` reads '
        "`NIGHTSHIFT_CONFIG_ACME_URL`; names ending in `token`, `secret`, `password`, `key` "
        "are secrets, redacted from the journal and logs",
    )
    alert_webhook_url: str | None = setting(
        "NIGHTSHIFT_ALERT_WEBHOOK_URL", None, parse=o.text,
        help="budget alerts are POSTed here as JSON, like completion webhooks: retried, once per "
        "`Idempotency-Key`, signed when `NIGHTSHIFT_NOTIFY_SECRET` is set (they are always in the "
        "`alerts` table and the log)",
    )
    flower_basic_auth: str | None = setting(
        "NIGHTSHIFT_FLOWER_BASIC_AUTH", None, parse=o.text, secret=True,
        help="`user:password` for Flower; `nightshift flower` refuses to start without it",
    )
    task_events: bool = setting(
        "NIGHTSHIFT_TASK_EVENTS", False,
        "send Celery task events always, task-sent included; unset, workers send them only "
        "while Flower runs (it turns them on)",
    )
    api_url: str | None = setting(
        "NIGHTSHIFT_API_URL", None, parse=o.text,
        help="where `pipeline.api.client` (`wait_for_run`) finds the HTTP API, e.g. "
        "`http://localhost:8000`; it sends `NIGHTSHIFT_API_TOKEN`",
    )
    api_token: str | None = setting(
        "NIGHTSHIFT_API_TOKEN", None,
        f"the shared operator token for the HTTP API ({SECRET_ROW}); it names no person, so it "
        "cannot sign in to the status page nor approve an action whose tool names approvers; "
        "`nightshift api` refuses to start without it unless `--insecure-no-auth`",
        parse=o.secret, secret=True,
    )
    identity_header: str | None = setting(
        "NIGHTSHIFT_IDENTITY_HEADER", None, parse=o.identity_header,
        help="switched on: the header a reverse proxy sets to the signed-in person (e.g. "
        "`X-Forwarded-Email`), trusted on requests from `NIGHTSHIFT_IDENTITY_PROXIES`",
    )
    identity_proxies: frozenset[str] = setting(
        "NIGHTSHIFT_IDENTITY_PROXIES", frozenset({"127.0.0.1", "::1"}),
        "the proxy addresses whose identity header counts",
        parse=o.names, shown="`127.0.0.1,::1`",
    )
    forwarded_allow_ips: frozenset[str] = setting(
        "NIGHTSHIFT_FORWARDED_ALLOW_IPS", frozenset(), parse=o.names,
        help="reverse proxies (addresses or networks) in front of the API whose `X-Forwarded-For`/"
        "`-Proto` are believed; unset, a request's address is its socket's",
    )
    approvers: tuple[tuple[str, tuple[str, ...]], ...] = setting(
        f"{APPROVERS_PREFIX}<TOOL>", (), shown="the tool's own list",
        help="on the workers: who may approve that tool's actions, comma-separated, e.g. "
        "`NIGHTSHIFT_APPROVERS_SET_PRICE=pricing@acme.example`; the shipped defaults are "
        "`pricing@example.com` (`set_price`) and `reviewer@example.com` "
        "(`open_fix_pull_request`)",
    )
    """Per tool (by `approvers_variable`): in place of the list the tool declares. A tuple so
    Settings stays hashable."""
    approval_webhook_secret: str | None = setting(
        "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET", None,
        f"HMAC secret of the approval webhook ({SECRET_ROW}); unset: the webhook answers 503",
        parse=o.secret, secret=True,
    )
    event_webhook_secret: str | None = setting(
        "NIGHTSHIFT_EVENT_WEBHOOK_SECRET", None, parse=o.secret, secret=True,
        help=f"HMAC secret of the event webhook ({SECRET_ROW}, a different value)",
    )
    notify_secret: str | None = setting(
        "NIGHTSHIFT_NOTIFY_SECRET", None, parse=o.secret, secret=True,
        help="signs the completion webhooks sent to a run's or batch's `notify_url` "
        f"({SECRET_ROW}); a `notify_url` is refused without it",
    )
    notify_allowed: frozenset[str] = setting(
        "NIGHTSHIFT_NOTIFY_ALLOWED", frozenset({"public"}), parse=o.destinations, shown="`public`",
        help="where a `notify_url` may point, comma-separated: `public` (any address that is not "
        "private, loopback, link-local or reserved), networks (`10.1.2.0/24`, `127.0.0.1`) and "
        "host names; checked at start (422) and, resolved again, at every delivery",
    )
    metrics_token: str | None = setting(
        "NIGHTSHIFT_METRICS_TOKEN", None, "a read-only bearer token for `GET /metrics`",
        parse=o.secret, secret=True,
    )
    session_secret: str | None = setting(
        "NIGHTSHIFT_SESSION_SECRET", None, parse=o.secret, secret=True,
        help=f"signs status-page sessions ({SECRET_ROW}; set the same value on every API host "
        "behind one name); unset, a key made in `NIGHTSHIFT_DATA_DIR/secrets/session.key`",
    )
    prometheus_multiproc_dir: Path | None = setting(
        "PROMETHEUS_MULTIPROC_DIR", None, parse=o.path, shown="`NIGHTSHIFT_DATA_DIR/metrics`",
        help="where workers keep their Prometheus counters and `/metrics` reads them "
        "(`docs/metrics.md`)",
    )
    api_max_body_bytes: int = setting(
        "NIGHTSHIFT_API_MAX_BODY_BYTES", 1024 * 1024, "larger request bodies get 413",
        parse=o.count(1024),
    )
    api_body_seconds: float = setting(
        "NIGHTSHIFT_API_BODY_SECONDS", 30.0, parse=o.number(1.0),
        help="a request body must arrive whole within this many seconds of its headers, or the "
        "API answers 408 and closes the connection (a slow sender holds nothing longer)",
    )
    api_anonymous_uploads: int = setting(
        "NIGHTSHIFT_API_ANONYMOUS_UPLOADS", 16, parse=o.count(1),
        help="request bodies the API reads at once from callers that prove no one (no valid "
        "token, proxy identity or session: the event webhook's senders, attackers); more get "
        "503 at once, their connection closed",
    )
    retention_days: float = setting(
        "NIGHTSHIFT_RETENTION_DAYS", 30.0,
        "finished runs older than this are compacted by the daily retention: their personal data "
        "is redacted (`docs/security.md`)",
        parse=o.number(1.0),
    )
    retention_delete_days: float = setting(
        "NIGHTSHIFT_RETENTION_DELETE_DAYS", 365.0,
        "compacted runs older than this (counted from their compaction) are deleted, unless an "
        "obligation is still open",
        parse=o.number(1.0),
    )
    max_wait_days: float = setting(
        "NIGHTSHIFT_MAX_WAIT_DAYS", 30.0, parse=o.number(1.0),
        help="a run parked this long with no deadline (an approval nobody gives, a timer further "
        "off) is ended, reason `expired`",
    )
    crash_points: frozenset[str] = setting(
        "NIGHTSHIFT_CRASH_POINTS", frozenset(), parse=o.names,
        help="tests and chaos runs only: named points where the worker kills itself",
    )
    pause_points: frozenset[str] = setting(
        "NIGHTSHIFT_PAUSE_POINTS", frozenset(),
        "tests only: crash points where the worker stops itself (SIGSTOP) instead of dying, so "
        "a test can act at that instant and then let it go on",
        parse=o.names,
    )
    # fmt: on
