"""A broker through Redis Sentinel: the URL forms, the master's name, and what Celery is given."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

import celeryconfig
from pipeline.errors import SettingsError
from pipeline.settings import Settings
from pipeline.settings.broker_urls import sentinels_of

SENTINELS = "sentinel://:masterpw@s1:26379/2;sentinel://s2:26380;sentinel://s3"


def test_a_sentinel_url_names_every_sentinel_and_the_masters_credentials() -> None:
    sentinels = sentinels_of(SENTINELS)
    assert sentinels.addresses == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (sentinels.db, sentinels.username, sentinels.password) == (2, None, "masterpw")
    assert str(sentinels) == "s1:26379, s2:26380, s3:26379"


def test_celery_is_given_the_master_name_and_the_sentinels_password() -> None:
    # given a sentinel URL, the master's name and the sentinels' own password
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_BROKER_URL": SENTINELS,
            "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "nightshift",
            "NIGHTSHIFT_BROKER_SENTINEL_PASSWORD": "sentinelpw",
        }
    )
    # when Celery's settings are made from them
    conf = celeryconfig.from_settings(settings)
    # then the broker and the result backend both go through the sentinels to that master
    assert conf["broker_url"] == conf["result_backend"] == SENTINELS
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"]):
        assert options["master_name"] == "nightshift"
        assert options["sentinel_kwargs"] == {"password": "sentinelpw"}
        assert options["visibility_timeout"] == settings.visibility_timeout
    assert "masterpw" not in repr(settings) and "sentinelpw" not in repr(settings)


def test_a_plain_redis_url_gives_celery_no_sentinel_options() -> None:
    conf = celeryconfig.from_settings(Settings.from_env({"NIGHTSHIFT_BROKER_URL": "redis://r/0"}))
    assert "master_name" not in conf["broker_transport_options"]


def test_through_sentinel_over_tls_celery_verifies_the_servers_and_the_sentinels(
    tmp_path: Path,
) -> None:
    # given sentinels and servers on TLS, with a CA of the operator's
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_BROKER_URL": SENTINELS,
            "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "nightshift",
            "NIGHTSHIFT_BROKER_SENTINEL_PASSWORD": "sentinelpw",
            "NIGHTSHIFT_BROKER_SENTINEL_TLS": "1",
            "NIGHTSHIFT_BROKER_SENTINEL_TLS_CA": str(ca),
        }
    )
    # when Celery's settings are made from them
    conf = celeryconfig.from_settings(settings)
    # then the servers the sentinels name are reached over verified TLS, by the broker and the
    # result backend alike
    verified = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    assert conf["broker_use_ssl"] == conf["redis_backend_use_ssl"] == verified
    # and so are the sentinels themselves, with their password
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"]):
        assert options["sentinel_kwargs"] == {"password": "sentinelpw", "ssl": True, **verified}


def test_without_tls_celery_is_given_no_tls_options() -> None:
    conf = celeryconfig.from_settings(
        Settings.from_env(
            {"NIGHTSHIFT_BROKER_URL": SENTINELS, "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "m"}
        )
    )
    assert conf["broker_use_ssl"] is None and conf["redis_backend_use_ssl"] is None
    assert "sentinel_kwargs" not in conf["broker_transport_options"]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"NIGHTSHIFT_BROKER_URL": SENTINELS}, "set NIGHTSHIFT_BROKER_SENTINEL_MASTER"),
        (
            {"NIGHTSHIFT_BROKER_URL": "redis://r/0", "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "m"},
            "names no sentinels",
        ),
        ({"NIGHTSHIFT_BROKER_URL": "sentinel://s1;redis://r"}, "sentinel://host:26379"),
        ({"NIGHTSHIFT_BROKER_URL": "sentinel://s1:x"}, "sentinel://host:26379"),
        ({"NIGHTSHIFT_BROKER_URL": "sentinel://s1/zero"}, "database"),
        ({"NIGHTSHIFT_BROKER_URL": "sentinel://s1?ssl_cert_reqs=required"}, "TLS"),
        ({"NIGHTSHIFT_BROKER_URL": "amqp://guest@rabbit//"}, "Redis Sentinel"),
        (
            {"NIGHTSHIFT_BROKER_URL": "redis://r/0", "NIGHTSHIFT_BROKER_SENTINEL_TLS": "1"},
            "names no sentinels",
        ),
        (
            {
                "NIGHTSHIFT_BROKER_URL": SENTINELS,
                "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "m",
                "NIGHTSHIFT_BROKER_SENTINEL_TLS": "1",
                "NIGHTSHIFT_BROKER_SENTINEL_TLS_CA": "/nonexistent/ca.crt",
            },
            "no file '/nonexistent/ca.crt'",
        ),
        (
            {
                "NIGHTSHIFT_BROKER_URL": SENTINELS,
                "NIGHTSHIFT_BROKER_SENTINEL_MASTER": "m",
                "NIGHTSHIFT_BROKER_SENTINEL_TLS_CA": "/etc/hostname",
            },
            "NIGHTSHIFT_BROKER_SENTINEL_TLS is off",
        ),
    ],
)
def test_a_broker_setting_that_cannot_work_is_one_line_at_start(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(SettingsError, match=says) as error:
        Settings.from_env(env)
    assert "\n" not in str(error.value)
