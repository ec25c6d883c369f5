"""IR files on disk: their names in an exported folder, saving a built model, and reading one back with what the IR
format drops restored; the process-wide Core every reader and compiler shares; the folder's JSON files."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import openvino as ov

from ovbuild.errors import CheckpointError, ConfigError, ExportError
from ovbuild.ir.records import HeadGeometry

MODEL_STEM = "openvino_model"  # the main IR of every folder: a target, or a draft's backbone
MODEL_FILE = f"{MODEL_STEM}.xml"
MARKOV_HEAD_STEM = "openvino_markov_head_model"  # a draft's Markov head, named by its backbone's rt_info
VISION_STEM = "openvino_vision_model"  # a vision-language target's vision tower, beside its openvino_model.xml
VISION_FILE = f"{VISION_STEM}.xml"
TOKENIZER_IRS = ("openvino_tokenizer.xml", "openvino_detokenizer.xml")
PAGED_ATTENTION = "PagedAttentionExtension"  # the op type of a paged IR's attention nodes

_core: ov.Core | None = None


def core() -> ov.Core:
    """The process-wide Core: CPU plugin loaded (PagedAttention IR needs it), tokenizer ops when installed."""
    global _core
    if _core is None:
        with contextlib.suppress(ImportError):  # importing it registers tokenizer ops with Cores created afterwards
            import openvino_tokenizers  # noqa: F401
        _core = ov.Core()
        _core.get_property("CPU", "FULL_DEVICE_NAME")
    return _core


def save_ir(model: ov.Model, path: str | Path) -> Path:
    """Write model.xml/.bin with weights exactly as built (no silent fp16 compression)."""
    path = Path(path)
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


def read_ir(path: str | Path) -> ov.Model:
    """Read an ovbuild IR and put back the PagedAttention node rt_info that the IR format does not keep."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.exists():
        raise ExportError(f"{path}: no such IR file")
    try:
        model = core().read_model(str(path))
    except RuntimeError as e:  # a truncated or damaged .xml or .bin
        raise ExportError(
            f"{path}: cannot be read ({last_line(e)}): it or {path.with_suffix('.bin').name} is damaged or "
            "incomplete; export the model again"
        ) from None
    restore_paged_attention(model, path)
    return model


def read_json(path: Path) -> dict:
    """A JSON object from `path` (a checkpoint's or an exported folder's config); a missing or malformed file raises
    an error naming it."""
    if not path.exists():
        raise CheckpointError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSON, huge integers
        raise ConfigError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def last_line(e: Exception) -> str:
    """OpenVINO errors end with the useful line after a C++ file and line; keep only that."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def set_head_geometry(node: ov.Node, num_kv_heads: int, head_dim: int) -> None:
    """The CPU plugin requires this node rt_info, and IR files drop it: set at build and again after reading."""
    rt = node.get_rt_info()
    rt["num_k_heads"], rt["k_head_size"] = num_kv_heads, head_dim
    rt["num_v_heads"], rt["v_head_size"] = num_kv_heads, head_dim


def restore_paged_attention(model: ov.Model, path: str | Path | None = None) -> None:
    """Re-attach head geometry to every PagedAttention node from the model's rt_info (`path`: named in errors)."""
    nodes = [n for n in model.get_ops() if n.get_type_name() == PAGED_ATTENTION]
    if not nodes:
        return
    heads = HeadGeometry.from_model(model, path, required=True)
    for node in nodes:
        set_head_geometry(node, heads.num_kv_heads, heads.head_size)
