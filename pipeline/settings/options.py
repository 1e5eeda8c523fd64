"""How one setting is declared (`setting(...)`: its variable, default, bounds, whether it is a
secret, one line of help) and the parsers that turn a variable's text into its value. Every
parser fails with one line that names the variable."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import Field, dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import platformdirs

from pipeline.errors import SettingsError, redact_url
from pipeline.prices import parse_model_prices

Parse = Callable[[str, str], Any]
"""(variable, its non-empty text) -> the value."""

OPTION = "nightshift.option"
MIN_SECRET_LENGTH = 16


@dataclass(frozen=True)
class Option:
    """One environment variable: what docs/configuration.md's table shows of it."""

    variable: str
    help: str
    parse: Parse
    shown_default: str
    secret: bool = False


def setting(
    variable: str,
    default: Any,
    help: str,
    *,
    parse: Parse | None = None,
    shown: str | None = None,
    secret: bool = False,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A `Settings` field read from `variable`; unset or empty, it keeps `default` (or what
    `factory` makes). `shown` is the default as people read it, when it is not the value
    itself; a secret never shows in a repr."""
    option = Option(
        variable,
        help,
        parse or parser_for(default),
        shown if shown is not None else show(default),
        secret,
    )
    metadata = {OPTION: option}
    if factory is not None:
        return field(default_factory=factory, repr=not secret, metadata=metadata)
    return field(default=default, repr=not secret, metadata=metadata)


def option_of(declared: Field[Any]) -> Option | None:
    found: Option | None = declared.metadata.get(OPTION)
    return found


def show(default: Any) -> str:
    if default is None or default == frozenset():
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, str):
        return f"`{default}`"
    return str(default)


def parser_for(default: Any) -> Parse:
    """A plain setting's parser follows its default: a switch, a count, seconds, text."""
    if isinstance(default, bool):
        return switch
    if isinstance(default, int):
        return count()
    if isinstance(default, float):
        return number()
    return text


def text(name: str, raw: str) -> str:
    return raw


def path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def directory(name: str, raw: str) -> Path:
    return Path(raw).expanduser().resolve()


def number(minimum: float = 0.0) -> Parse:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(
                f"{name} must be a number of seconds or a count (got {raw!r})"
            ) from None
        if value < minimum:
            raise SettingsError(f"{name} must be at least {minimum:g} (got {raw!r})")
        return value

    return parse


def count(minimum: int = 0) -> Parse:
    as_number = number(minimum)

    def parse(name: str, raw: str) -> int:
        return int(as_number(name, raw))

    return parse


def tokens(name: str, raw: str) -> int:
    value = number()(name, raw)
    if value < 1 or value != int(value):
        raise SettingsError(f"{name} must be a whole number of tokens (got {raw!r})")
    return int(value)


def fraction(name: str, raw: str) -> float:
    value = number()(name, raw)
    if not 0 < value <= 1:
        raise SettingsError(f"{name} must be a fraction above 0 and at most 1 (got {value:g})")
    return value


def switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise SettingsError(f"{name} must be on or off (got {value!r})")


def choice(*choices: str) -> Parse:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"{name} must be one of {', '.join(choices)} (got {raw!r})")
        return raw

    return parse


def secret(name: str, raw: str) -> str:
    if len(raw) < MIN_SECRET_LENGTH:
        raise SettingsError(f"{name} must be at least {MIN_SECRET_LENGTH} characters long")
    return raw


def names(name: str, raw: str) -> frozenset[str]:
    """A comma-separated list."""
    return frozenset(item.strip() for item in raw.split(",") if item.strip())


def timezone(name: str, raw: str) -> str:
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"{name} must be an IANA timezone like Europe/Berlin (got {raw!r})"
        ) from None
    return raw


def model_prices(name: str, raw: str) -> tuple[Any, ...]:
    return parse_model_prices(name, raw) if raw.strip() else ()


_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_NOT_IDENTITY_HEADERS = {"authorization", "cookie", "host", "content-type", "content-length"}


def identity_header(name: str, raw: str) -> str:
    if not _HEADER_NAME.fullmatch(raw) or raw.lower() in _NOT_IDENTITY_HEADERS:
        raise SettingsError(
            f"{name} must name the header your proxy sets to the signed-in person, e.g. "
            f"X-Forwarded-Email (got {raw[:60]!r})"
        )
    return raw


_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$)({_LABEL}\.)*{_LABEL}\.?")


def destinations(name: str, raw: str) -> frozenset[str]:
    """`public`, networks and host names (pipeline/runs/outbound.py)."""
    entries = frozenset(item.strip().lower() for item in raw.split(",") if item.strip())
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if entry != "public" and not _HOST_NAME.fullmatch(entry):
                raise SettingsError(
                    f"{name}: {entry[:60]!r} is neither 'public', a network "
                    "(10.1.2.0/24, 127.0.0.1) nor a host name"
                ) from None
    return entries


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("nightshift")).resolve()


def shown_in_repr(value: object) -> str:
    """URLs lose their passwords and query strings."""
    return repr(redact_url(value)) if isinstance(value, str) and "://" in value else repr(value)


def markdown_table(options: list[Option]) -> str:
    """docs/configuration.md's settings table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{o.variable}` | {o.shown_default} | {o.help} |" for o in options]
    return "\n".join(rows) + "\n"
