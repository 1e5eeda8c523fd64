"""Where a missing setting comes from, for the lines that name one: the environment of every
worker; for a tool's own setting, also the file NIGHTSHIFT_CONFIG_FILE names; and, only for
the settings the sandbox provides, `nightshift sandbox up` for a trial (it cannot provide a
team's own tool's URL, so it is not suggested for one)."""

from __future__ import annotations

from pipeline.sandbox.background import VARIABLES as SANDBOX_VARIABLES
from pipeline.settings.service_config import CONFIG_FILE_ENV, CONFIG_PREFIX


def where_to_set(variable: str) -> str:
    """`set it in every worker's environment ...`, without a leading capital or a full stop."""
    where = "set it in every worker's environment"
    if variable.startswith(CONFIG_PREFIX):
        where += f" or in the TOML file {CONFIG_FILE_ENV} names"
    if variable in SANDBOX_VARIABLES.values():
        where += '; for a trial, eval "$(nightshift sandbox up)" sets it'
    return where
