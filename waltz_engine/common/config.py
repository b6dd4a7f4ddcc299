"""YAML configuration shared by every process (reference §0.3).

Keys are dot-delimited and any nesting is equivalent: ``a.b.c: v`` ≡ ``a: {b: {c: v}}`` ≡
``a.b: {c: v}``. Values may be written as strings and are parsed per key by the typed getters.
Unknown keys are ignored, as in the original, but :meth:`Config.warn_unknown_keys` lets a
process point them out. A missing required key is a one-line :class:`ConfigError` naming the
key and the file.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from waltz_engine.common.address import MAX_PORT, MIN_PORT, is_port
from waltz_engine.common.errors import WaltzError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

T = TypeVar("T")

# Where `waltz dev up` keeps a local cluster, and the client config it writes there: the
# config every cluster command falls back to when given none.
DEV_CLUSTER_DIRECTORY = ".waltz-dev"
DEV_CLIENT_CONFIG_NAME = "client.yml"
# How alike (difflib's ratio) an unknown key must be to a known one to be suggested for it.
SUGGESTION_CUTOFF = 0.8


def dev_client_config_path() -> Path:
    """``.waltz-dev/client.yml`` (what ``waltz dev up`` writes) in the current directory."""
    return Path(DEV_CLUSTER_DIRECTORY) / DEV_CLIENT_CONFIG_NAME


def find_dev_client_config(start: Path | None = None) -> Path | None:
    """The nearest dev cluster's client config: in ``start`` (default: the current directory) or
    the first directory above it holding ``.waltz-dev/client.yml``, so a command or a client run
    from a subdirectory of the project finds the cluster ``waltz dev up`` started at its top."""
    here = (start if start is not None else Path.cwd()).absolute()
    for directory in (here, *here.parents):
        candidate = directory / dev_client_config_path()
        if candidate.is_file():
            return candidate if directory != Path.cwd() else dev_client_config_path()
    return None


def resolve_config_path(path: Path | None) -> Path | None:
    """``path``, else the nearest dev cluster's client config (:func:`find_dev_client_config`)."""
    if path is not None:
        return path
    return find_dev_client_config()


class ConfigError(WaltzError):
    """A configuration file cannot be read, or a key is missing or has a bad value."""


def flatten(tree: Mapping[Any, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """Nested mappings → one level of dotted keys; the same key spelled twice is an error."""
    flat: dict[str, Any] = {}
    for raw_key, value in tree.items():
        key = f"{prefix}{raw_key}"
        nested = flatten(value, source, f"{key}.") if isinstance(value, Mapping) else {key: value}
        for nested_key, nested_value in nested.items():
            if nested_key in flat:
                raise ConfigError(f"{source}: key '{nested_key}' is given more than once")
            flat[nested_key] = nested_value
    return flat


def _parse_int(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    number = value if isinstance(value, int) else int(str(value).strip(), 10)
    if not low <= number <= high:
        raise ValueError(f"{number} is out of range [{low}, {high}]")
    return number


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError("expected true or false")
    return text == "true"


def _parse_str(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        raise ValueError("expected a single value")
    return str(value)


class Config:
    """A flat, read-only view of one YAML configuration."""

    def __init__(self, values: Mapping[Any, Any], source: str = "<config>") -> None:
        self.source = source
        # A key with no value (`key:`) is treated as absent, like an unset key.
        self._values = {k: v for k, v in flatten(values, source).items() if v is not None}

    @classmethod
    def from_yaml(cls, text: str, source: str = "<config>") -> Config:
        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" (line {where.line + 1})" if where is not None else ""
            raise ConfigError(f"{source}: not valid YAML{line}") from None
        if tree is None:
            tree = {}
        if not isinstance(tree, Mapping):
            raise ConfigError(f"{source}: expected a mapping of keys to values at the top level")
        return cls(tree, source)

    @classmethod
    def load(cls, path: Path | str) -> Config:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{file}: config file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{file}: cannot read config file ({e})") from None
        return cls.from_yaml(text, str(file))

    def keys(self) -> list[str]:
        return sorted(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def _typed(self, key: str, parse: Callable[[Any], T], what: str) -> T | None:
        if key not in self._values:
            return None
        try:
            return parse(self._values[key])
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{self.source}: key '{key}' must be {what} ({e})") from None

    def _required(self, key: str, value: T | None) -> T:
        if value is None:
            raise ConfigError(f"{self.source}: missing required key '{key}'")
        return value

    def optional_str(self, key: str) -> str | None:
        return self._typed(key, _parse_str, "a string")

    def optional_int(self, key: str) -> int | None:
        return self._typed(key, lambda v: _parse_int(v, INT32_MIN, INT32_MAX), "a 32-bit integer")

    def optional_long(self, key: str) -> int | None:
        return self._typed(key, lambda v: _parse_int(v, INT64_MIN, INT64_MAX), "a 64-bit integer")

    def optional_bool(self, key: str) -> bool | None:
        return self._typed(key, _parse_bool, "true or false")

    def optional_uuid(self, key: str) -> uuid.UUID | None:
        return self._typed(key, lambda v: uuid.UUID(str(v).strip()), "a UUID")

    def require_str(self, key: str) -> str:
        return self._required(key, self.optional_str(key))

    def require_int(self, key: str) -> int:
        return self._required(key, self.optional_int(key))

    def require_long(self, key: str) -> int:
        return self._required(key, self.optional_long(key))

    def require_bool(self, key: str) -> bool:
        return self._required(key, self.optional_bool(key))

    def require_uuid(self, key: str) -> uuid.UUID:
        return self._required(key, self.optional_uuid(key))

    def get_str(self, key: str, default: str) -> str:
        value = self.optional_str(key)
        return default if value is None else value

    def get_int(self, key: str, default: int) -> int:
        value = self.optional_int(key)
        return default if value is None else value

    def get_long(self, key: str, default: int) -> int:
        value = self.optional_long(key)
        return default if value is None else value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.optional_bool(key)
        return default if value is None else value

    def get_positive(self, key: str, default: int, *, long: bool = False) -> int:
        value = self.get_long(key, default) if long else self.get_int(key, default)
        if value <= 0:
            raise ConfigError(f"{self.source}: key '{key}' must be positive, got {value}")
        return value

    def get_not_negative(self, key: str, default: int, *, long: bool = False) -> int:
        value = self.get_long(key, default) if long else self.get_int(key, default)
        if value < 0:
            raise ConfigError(f"{self.source}: key '{key}' must not be negative, got {value}")
        return value

    def unknown_keys(self, known: Iterable[str], known_prefixes: Iterable[str] = ()) -> list[str]:
        """Keys that are neither in ``known`` nor under one of ``known_prefixes`` (e.g. ``server.ssl.``)."""
        known_set = set(known)
        prefixes = tuple(known_prefixes)
        return [k for k in self.keys() if k not in known_set and not k.startswith(prefixes)]

    def warn_unknown_keys(
        self, known: Iterable[str], warn: Callable[[str], None], known_prefixes: Iterable[str] = ()
    ) -> list[str]:
        """Call ``warn`` with one line per unknown key (they are still ignored) and return them;
        a key close to a known one (a misspelling, most often) gets "did you mean ...?"."""
        known_list = list(known)
        unknown = self.unknown_keys(known_list, known_prefixes)
        for key in unknown:
            close = difflib.get_close_matches(key, known_list, n=1, cutoff=SUGGESTION_CUTOFF)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            warn(f"{self.source}: unknown config key '{key}' (ignored{hint})")
        return unknown


def require_ports(config: Config, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, int]:
    """The listening ports a node's config names: each in range, all different (the original's
    UniqueValidator). Optional keys that are absent are left out of the result."""
    ports = {key: config.require_int(key) for key in required}
    for key in optional:
        value = config.optional_int(key)
        if value is not None:
            ports[key] = value
    for key, port in ports.items():
        if not is_port(port):
            raise ConfigError(
                f"{config.source}: key '{key}' must be a port in [{MIN_PORT}, {MAX_PORT}], got {port}"
            )
    if len(set(ports.values())) != len(ports):
        raise ConfigError(f"{config.source}: {', '.join(repr(k) for k in ports)} must all be different ports")
    return ports
