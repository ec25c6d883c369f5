"""Reading an image processor's settings the way published checkpoints write them: `preprocessor_config.json` (flat),
or `processor_config.json` with the settings under `image_processor`; and the placeholder token strings a tokenizer
declares in `tokenizer_config.json` (`extra_special_tokens`).

JSON is read here with the standard library rather than through `ovbuild.ir`, which would bring OpenVINO into a
package that serving uses without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ovbuild.errors import CheckpointError, ConfigError, UnsupportedError

PREPROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def read_json_object(path: Path) -> dict:
    """A JSON object from `path`; a malformed file raises an error naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def read_image_processor_settings(folder: Path) -> tuple[dict, Path]:
    """The image processor's settings of a checkpoint folder and the file they came from."""
    for name in PREPROCESSOR_FILES:
        path = Path(folder) / name
        if path.is_file():
            data = read_json_object(path)
            nested = data.get("image_processor")
            if isinstance(nested, dict):
                return nested, path
            return data, path
    raise CheckpointError(f"{folder}: no {' or '.join(PREPROCESSOR_FILES)} (the image processor's settings)")


def read_special_tokens(folder: Path) -> dict[str, str]:
    """`extra_special_tokens` of the folder's tokenizer_config.json (attribute name -> token string), or {}."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return {}
    found = read_json_object(path).get("extra_special_tokens")
    if not isinstance(found, dict):  # older files list them (no names), which tells nothing about roles
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def value(settings: dict, path: Path, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """`settings[key]` checked against `kind`, or `default` when absent; a wrong type names the file and key."""
    if key not in settings or settings[key] is None:
        return default
    got = settings[key]
    if isinstance(got, bool) and kind in (int, float, (int, float)):
        raise ConfigError(f"{path}: {key} must be a number, got {got!r}")
    if not isinstance(got, kind):
        raise ConfigError(f"{path}: {key} must be {getattr(kind, '__name__', kind)}, got {got!r}")
    return got


def positive(settings: dict, path: Path, key: str, default: int) -> int:
    """A positive integer setting."""
    got = value(settings, path, key, int, default)
    if got <= 0:
        raise ConfigError(f"{path}: {key} must be positive, got {got}")
    return got


def triple(settings: dict, path: Path, key: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
    """A per-channel mean or std: three numbers (std non-zero)."""
    got = value(settings, path, key, (list, tuple), default)
    if len(got) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in got):
        raise ConfigError(f"{path}: {key} must be three numbers, got {got!r}")
    if key.endswith("std") and any(v == 0 for v in got):
        raise ConfigError(f"{path}: {key} has a zero, got {got!r}")
    return tuple(float(v) for v in got)


def refuse_disabled_steps(settings: dict, path: Path) -> None:
    """ovbuild always resizes, rescales and normalises, as every published config asks; refuse a file that does not."""
    for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if settings.get(key) is False:
            raise UnsupportedError(f"{path}: {key} is false; ovbuild's processors always apply that step")
