"""Settings come from the environment; bad values name the variable that is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import PermanentError, SettingsError
from pipeline.settings import Settings, approvers_variable, declared_options, settings_table


def test_defaults_leave_urls_unset_for_the_embedded_services(tmp_path) -> None:
    settings = Settings.from_env({"NIGHTSHIFT_DATA_DIR": str(tmp_path)})
    assert settings.database_url is None and settings.broker_url is None
    assert settings.embedded
    assert settings.data_dir == tmp_path
    assert settings.heartbeat_seconds == pytest.approx(settings.lease_seconds / 3)


def test_postgres_urls_are_pinned_to_psycopg() -> None:
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_DATABASE_URL": "postgresql://u@db:5432/x",
            "NIGHTSHIFT_BROKER_URL": "redis://r:6379/0",
        }
    )
    assert settings.database_url == "postgresql+psycopg://u@db:5432/x"
    assert not settings.embedded


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("NIGHTSHIFT_DATABASE_URL", "mysql://u@db/x"),
        ("NIGHTSHIFT_DATABASE_URL", "not a url"),
        ("NIGHTSHIFT_BROKER_URL", "amqp://guest@rabbit//"),
        ("NIGHTSHIFT_LEASE_SECONDS", "soon"),
        ("NIGHTSHIFT_TASK_EVENTS", "sometimes"),
        ("NIGHTSHIFT_MAX_EMAILS_PER_RUN", "lots"),
        ("NIGHTSHIFT_MAX_EMAILS_PER_RUN", "-1"),
        ("NIGHTSHIFT_API_MAX_BODY_BYTES", "12"),
        ("NIGHTSHIFT_RETENTION_DAYS", "soon"),
        ("NIGHTSHIFT_IDENTITY_HEADER", "Authorization"),
        ("NIGHTSHIFT_API_TOKEN", "short"),
        ("NIGHTSHIFT_NIGHT_TIMEZONE", "Mars/Olympus"),
    ],
)
def test_a_malformed_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable) as error:
        Settings.from_env({variable: value})
    assert "\n" not in str(error.value)


def test_the_visibility_timeout_must_exceed_the_step_time_limit() -> None:
    with pytest.raises(SettingsError, match="NIGHTSHIFT_VISIBILITY_TIMEOUT"):
        Settings.from_env(
            {"NIGHTSHIFT_STEP_TIME_LIMIT": "900", "NIGHTSHIFT_VISIBILITY_TIMEOUT": "600"}
        )


def test_secrets_stay_out_of_the_repr() -> None:
    settings = Settings.from_env({"ANTHROPIC_API_KEY": "sk-ant-secret-value"})
    assert "sk-ant-secret-value" not in repr(settings)


def test_approvers_are_configured_per_tool_and_replace_the_tools_own() -> None:
    env = {
        "NIGHTSHIFT_APPROVERS_SET_PRICE": "pricing@acme.example, cfo@acme.example",
        "NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST": "lead@acme.example",
    }
    settings = Settings.from_env(env)
    assert settings.approvers_for("set_price", ("pricing@example.com",)) == (
        "pricing@acme.example",
        "cfo@acme.example",
    )
    assert settings.approvers_for("open_fix_pull_request", ()) == ("lead@acme.example",)
    assert settings.approvers_for("send_report_email", ("x@example.com",)) == ("x@example.com",)
    assert approvers_variable("open-fix.pull_request") == (
        "NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST"
    )
    with pytest.raises(SettingsError, match="NIGHTSHIFT_APPROVERS_SET_PRICE is empty"):
        Settings.from_env({"NIGHTSHIFT_APPROVERS_SET_PRICE": " , "})
    hash(settings)  # model adapters are cached per settings


def test_a_run_sends_at_most_fifty_emails_unless_configured() -> None:
    assert Settings.from_env({}).max_emails_per_run == 50
    assert Settings.from_env({"NIGHTSHIFT_MAX_EMAILS_PER_RUN": "3"}).max_emails_per_run == 3


def test_task_events_are_off_unless_asked_for() -> None:
    assert not Settings.from_env({}).task_events
    assert Settings.from_env({"NIGHTSHIFT_TASK_EVENTS": "true"}).task_events
    assert not Settings.from_env({"NIGHTSHIFT_TASK_EVENTS": "off"}).task_events


def test_tool_settings_come_from_the_environment_first_then_the_config_file(tmp_path) -> None:
    config_file = tmp_path / "nightshift.toml"
    config_file.write_text(
        '[acme]\nurl = "https://file.example"\ntimeout = 5\n\n[acme.billing]\nregion = "eu"\n'
    )
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_DATA_DIR": str(tmp_path),
            "NIGHTSHIFT_CONFIG_ACME_URL": "https://env.example",
            "NIGHTSHIFT_CONFIG_FILE": str(config_file),
        }
    )
    assert settings.config.get("acme.url") == "https://env.example"
    assert settings.config.get("acme.timeout") == "5"
    assert settings.config.get("acme.billing.region") == "eu"
    assert settings.config.get("acme.retries", "3") == "3"


def test_a_missing_tool_setting_names_the_variable_and_the_file_entry(tmp_path) -> None:
    settings = Settings.from_env({"NIGHTSHIFT_DATA_DIR": str(tmp_path)})
    with pytest.raises(PermanentError) as error:
        settings.config.get("acme.url")
    assert str(error.value) == (
        "setting 'acme.url' is not configured: set NIGHTSHIFT_CONFIG_ACME_URL or [acme] url "
        "in the file named by NIGHTSHIFT_CONFIG_FILE"
    )


def test_an_unreadable_config_file_stops_the_program_with_one_line(tmp_path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[acme\n")
    with pytest.raises(SettingsError, match=r"NIGHTSHIFT_CONFIG_FILE=.*cannot be read") as error:
        Settings.from_env(
            {"NIGHTSHIFT_DATA_DIR": str(tmp_path), "NIGHTSHIFT_CONFIG_FILE": str(broken)}
        )
    assert "\n" not in str(error.value)


def test_secret_tool_settings_never_show_in_reprs_and_are_redacted_from_text(tmp_path) -> None:
    env = {
        "NIGHTSHIFT_DATA_DIR": str(tmp_path),
        "NIGHTSHIFT_CONFIG_ACME_TOKEN": "tok-s3cret-value",
        "NIGHTSHIFT_CONFIG_ACME_API_KEY": "key-0123456789",
        "NIGHTSHIFT_CONFIG_ACME_URL": "https://acme.example",
    }
    settings = Settings.from_env(env)
    assert "tok-s3cret-value" not in repr(settings)
    assert "https://acme.example" not in repr(settings.config)
    assert "NIGHTSHIFT_CONFIG_ACME_TOKEN" in repr(settings.config)
    said = "GET https://acme.example/x?token=tok-s3cret-value failed (key key-0123456789)"
    assert settings.config.redact(said) == (
        "GET https://acme.example/x?token=[redacted] failed (key [redacted])"
    )


def test_a_tool_setting_a_tool_needs_counts_as_set_from_the_file_or_the_environment(
    tmp_path,
) -> None:
    from pipeline.tools import tool

    @tool(description="Call Acme.", needs=("acme.url", "acme.token"))
    def call_acme(context) -> str:  # type: ignore[no-untyped-def]
        return ""

    config_file = tmp_path / "nightshift.toml"
    config_file.write_text('[acme]\nurl = "https://acme.example"\n')
    settings = Settings.from_env(
        {"NIGHTSHIFT_DATA_DIR": str(tmp_path), "NIGHTSHIFT_CONFIG_FILE": str(config_file)}
    )
    assert call_acme.needs == ("NIGHTSHIFT_CONFIG_ACME_URL", "NIGHTSHIFT_CONFIG_ACME_TOKEN")
    assert settings.is_set("NIGHTSHIFT_CONFIG_ACME_URL")
    assert not settings.is_set("NIGHTSHIFT_CONFIG_ACME_TOKEN")


def documented_settings_table() -> str:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    start = doc.index("<!-- settings table:")
    begin = doc.index("\n", start) + 1
    return doc[begin : doc.index("<!-- end of settings table -->", begin)]


def test_the_documented_table_is_the_declaration() -> None:
    # docs/configuration.md's table is generated (`python -m pipeline.settings`), so any change
    # to a setting's variable, default, help or secrecy that is not regenerated fails here.
    assert documented_settings_table() == settings_table(), (
        "docs/configuration.md's settings table differs from pipeline/settings: regenerate it with "
        "`python -m pipeline.settings` and paste it between the markers"
    )


def test_every_secret_is_left_out_of_the_repr() -> None:
    declared = declared_options().values()
    secrets = {option.variable: "s3cret-value-" + "x" * 16 for option in declared if option.secret}
    assert {"ANTHROPIC_API_KEY", "NIGHTSHIFT_API_TOKEN", "NIGHTSHIFT_NOTIFY_SECRET"} <= set(secrets)
    shown = repr(Settings.from_env(secrets))
    assert "s3cret-value" not in shown


def test_model_rate_limits_are_read_per_model_and_bad_ones_named() -> None:
    limits = '{"claude-x": {"requests_per_minute": 50, "output_tokens_per_minute": 8000}}'
    settings = Settings.from_env({"NIGHTSHIFT_MODEL_RATE_LIMITS": limits})
    limit = settings.rate_limit_of("claude-x")
    assert limit is not None
    assert limit.requests_per_minute == 50.0 and limit.output_tokens_per_minute == 8000.0
    assert limit.input_tokens_per_minute is None
    assert settings.rate_limit_of("claude-y") is None
    for bad, said in [
        ('{"claude-x": {"rpm": 5}}', "unknown limit 'rpm'"),
        ('{"claude-x": {"requests_per_minute": 0}}', "must be a positive number"),
        ('{"claude-x": {}}', "needs at least one of"),
        ("[50]", "keyed by model name"),
    ]:
        with pytest.raises(SettingsError, match=said):
            Settings.from_env({"NIGHTSHIFT_MODEL_RATE_LIMITS": bad})
