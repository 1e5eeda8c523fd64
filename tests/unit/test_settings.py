"""Settings come from the environment; bad values name the variable that is wrong."""

from __future__ import annotations

import pytest

from pipeline.errors import SettingsError
from pipeline.settings import Settings, approvers_variable


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


def test_task_events_are_off_unless_asked_for() -> None:
    assert not Settings.from_env({}).task_events
    assert Settings.from_env({"NIGHTSHIFT_TASK_EVENTS": "true"}).task_events
    assert not Settings.from_env({"NIGHTSHIFT_TASK_EVENTS": "off"}).task_events
