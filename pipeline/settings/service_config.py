"""The settings of users' tools (`context.config("acme.url")`), from NIGHTSHIFT_CONFIG_*
variables and the TOML file named by NIGHTSHIFT_CONFIG_FILE, and who may approve a tool's
actions (NIGHTSHIFT_APPROVERS_<TOOL>): the two families of variables whose names are not known
in advance."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PermanentError, SettingsError

CONFIG_PREFIX = "NIGHTSHIFT_CONFIG_"
CONFIG_FILE_ENV = "NIGHTSHIFT_CONFIG_FILE"
_SECRET = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS?)$")
"""Settings named like this (`acme.token`, `acme.api_key`) are secrets: redacted wherever
nightshift writes what a tool said (journal, actions, logs) and never shown."""
REDACTED = "[redacted]"

APPROVERS_PREFIX = "NIGHTSHIFT_APPROVERS_"


def approvers_variable(tool: str) -> str:
    """`set_price` -> `NIGHTSHIFT_APPROVERS_SET_PRICE`."""
    return APPROVERS_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", tool).upper()


def approvers_from(env: Mapping[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
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
    def from_env(cls, env: Mapping[str, str], path: Path | None) -> ServiceConfig:
        """The NIGHTSHIFT_CONFIG_* variables, then what the file at `path` adds."""
        values = [
            (var, value, "environment")
            for var, value in sorted(env.items())
            if var.startswith(CONFIG_PREFIX) and var != CONFIG_FILE_ENV
        ]
        if path is not None:
            known = {var for var, _, _ in values}
            values += [(v, value, str(path)) for v, value in _config_file(path) if v not in known]
        return cls(tuple(values))


def _config_file(path: Path) -> list[tuple[str, str]]:
    try:
        data = tomllib.loads(path.read_text())
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
