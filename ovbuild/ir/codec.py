"""One codec for every rt_info record: a key is declared once (its path and how its value reads), a record is a frozen
dataclass whose fields name their keys, and writing and reading both walk those fields.

Values are written as strings (lists comma-joined); a key an older export did not write reads back as the field's
`absent` value (None unless declared). Errors name the IR file (or the model) and the key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import openvino as ov

from ovbuild.errors import ExportError
from ovbuild.ir.rt_info import get_rt_info, set_rt_info


class Where:
    """The IR a value came from, as errors name it."""

    def __init__(self, model: ov.Model, path: str | Path | None):
        self.text = str(path) if path is not None else f"IR '{model.get_friendly_name()}'"


def _int(text: str, key: str, where: Where) -> int:
    try:
        return int(text)
    except ValueError:
        raise ExportError(f"{where.text}: rt_info '{key}' = {text!r} is not an integer") from None


def _float(text: str, key: str, where: Where) -> float:
    try:
        return float(text)
    except ValueError:
        raise ExportError(f"{where.text}: rt_info '{key}' = {text!r} is not a number") from None


def _bool(text: str, key: str, where: Where) -> bool | None:
    if text == "":
        return None
    if text not in ("True", "False"):
        raise ExportError(f"{where.text}: rt_info '{key}' = {text!r} is not True or False")
    return text == "True"


def _ints(text: str, key: str, where: Where) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        raise ExportError(f"{where.text}: rt_info '{key}' = {text!r} is not a list of integers") from None


def _strs(text: str, key: str, where: Where) -> tuple[str, ...]:
    return tuple(text.split(","))


def _stem(text: str, key: str, where: Where) -> str:
    """A file stem of the same folder (never a path: a hostile IR must not point outside its folder)."""
    if not text or "/" in text or "\\" in text or text.startswith("."):
        raise ExportError(f"{where.text}: rt_info '{key}' = {text!r} is not a file name of the folder")
    return text


def _locators(text: str, key: str, where: Where) -> dict[int, str]:
    """The layer -> producer map of GenAI's locator JSON."""
    try:
        return {int(i): entry["producer"] for i, entry in json.loads(text)["layers"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ExportError(f"{where.text}: rt_info '{key}' is not GenAI's locator JSON") from None


def locators_json(producers: dict[int, str]) -> str:
    """GenAI's locator JSON: layer id -> producing node (friendly name) and output index."""
    layers = {str(i): {"producer": name, "output_index": 0} for i, name in sorted(producers.items())}
    return json.dumps({"layers": layers}, separators=(",", ":"))


@dataclass(frozen=True)
class Kind:
    """How a value is written and read back; blank_is_absent: an empty string reads as absent unless required."""

    read: Callable[[str, str, Where], Any]
    write: Callable[[Any], object] = lambda value: value
    blank_is_absent: bool = False


STR = Kind(lambda text, key, where: text)
INT = Kind(_int, blank_is_absent=True)
FLOAT = Kind(_float, blank_is_absent=True)
BOOL = Kind(_bool)
INTS = Kind(_ints, write=list)
STRS = Kind(_strs, write=list)
STEM = Kind(_stem)
LOCATORS = Kind(_locators, write=lambda value: locators_json(value or {}))


@dataclass(frozen=True)
class Key:
    """One rt_info key: its slash path, how its value reads, and the paths older exports wrote it under (read when
    the path is absent, never written)."""

    path: str
    kind: Kind = STR
    formerly: tuple[str, ...] = ()

    def read(self, model: ov.Model, where: Where, required: bool = False) -> Any:
        """The typed value, None when absent (an error when `required`)."""
        text = get_rt_info(model, self.path)
        for path in self.formerly:
            text = get_rt_info(model, path) if text is None else text
        if text is None:
            if required:
                raise ExportError(f"{where.text}: no rt_info '{self.path}' (not an ovbuild export, or a damaged one)")
            return None
        if text == "" and self.kind.blank_is_absent and not required:
            return None
        return self.kind.read(text, self.path, where)


@dataclass(frozen=True)
class Spec:
    """A record field's key; when it is written (None or SET: whenever it is not None, else also only where a
    function of the record says so); what it reads as when absent; whether it must be there."""

    key: Key
    when: Callable[[Any], bool] | str | None = None
    absent: Any = None
    required: bool = False


def rt(key: Key, default: Any = dataclasses.MISSING, *, when=None, absent=None, required=False, **kw) -> Any:
    """A record field stored under `key` (see Spec)."""
    return dataclasses.field(default=default, metadata={"rt": Spec(key, when, absent, required)}, **kw)


def part(record: type[Record], default: Any = dataclasses.MISSING) -> Any:
    """A field holding another record (or None), whose keys this record writes and reads along with its own."""
    return dataclasses.field(default=default, metadata={"part": record})


SET = "set"  # `when` of a field that is optional: written when not None (as every field), absent reads as None


class Record:
    """Base of the rt_info records (frozen dataclasses): `to_rt_info` and `from_model` from the fields' keys.
    FIXED: (key, value or function of the record, when) written along with the fields."""

    FIXED: ClassVar[tuple[tuple[Key, Any, Callable[[Any], bool] | None], ...]] = ()

    def to_rt_info(self) -> dict[str, object]:
        info: dict[str, object] = {}
        for key, value, when in self.FIXED:
            if when is None or when(self):
                info[key.path] = value(self) if callable(value) else value
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "part" in f.metadata:
                info |= value.to_rt_info() if value is not None else {}
                continue
            spec: Spec = f.metadata["rt"]
            if value is not None and (spec.when in (None, SET) or spec.when(self)):
                info[spec.key.path] = spec.key.kind.write(value)
        return info

    @classmethod
    def from_model(cls, model: ov.Model, path: str | Path | None = None):
        """The record as `model` (read from `path`, named in errors) holds it."""
        where, values = Where(model, path), {}
        for f in dataclasses.fields(cls):
            if "part" in f.metadata:
                values[f.name] = f.metadata["part"].from_model(model, path)
                continue
            spec: Spec = f.metadata["rt"]
            value = spec.key.read(model, where, spec.required)
            values[f.name] = spec.absent if value is None else value
        return cls(**values)


def write_rt_info(model: ov.Model, *records: Record) -> None:
    """Write the rt_info of every record into `model`."""
    for record in records:
        set_rt_info(model, record.to_rt_info())
