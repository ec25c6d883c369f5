"""Typed access to config.json values; every failure names the file and the key."""

from __future__ import annotations

import math
from typing import Any

from ovbuild.errors import ConfigError

_MISSING = object()


class ConfigReader:
    """Reads keys of one config dict (or a nested section of it) with type checks and precise errors."""

    def __init__(self, data: dict, path: str, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def where(self, key: str) -> str:
        return f"{self.path}: key '{self.prefix}{key}'"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def architecture(self) -> str | None:
        """`architectures[0]`, or None when absent."""
        archs = self.data.get("architectures")
        return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

    def section(self, key: str) -> ConfigReader | None:
        """A nested object such as `dflash_config`, or None when absent."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"{self.where(key)} must be an object")
        return ConfigReader(value, self.path, f"{self.prefix}{key}.")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise ConfigError(f"{self.where(key)} is missing")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            if value is default:
                return value
            raise ConfigError(f"{self.where(key)} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{self.where(key)} must be >= {minimum}, got {value}")
        return value

    def float(self, key: str, default: Any = _MISSING) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            if value is default:
                return value
            raise ConfigError(f"{self.where(key)} must be a finite number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where(key)} must be true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.where(key)} must be a string, got {value!r}")
        return value

    def int_list(self, key: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self.raw(key, default)
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{self.where(key)} must be a list of integers, got {value!r}")
        return tuple(value)


def merged_key(flat: ConfigReader, nested: ConfigReader | None, key: str) -> ConfigReader:
    """The reader to take `key` from: the nested section wins; a flat value that contradicts it is an error."""
    if nested is not None and nested.has(key):
        if flat.has(key) and flat.raw(key) != nested.raw(key):
            raise ConfigError(
                f"{flat.path}: key '{key}' = {flat.raw(key)!r} conflicts with "
                f"'{nested.prefix}{key}' = {nested.raw(key)!r}"
            )
        return nested
    return flat
