"""GenAI folders: what `openvino_genai.LLMPipeline(target)` and `openvino_genai.draft_model(draft)` open directly.

Target folder: openvino_model.xml/.bin, config.json, generation_config.json, the checkpoint's tokenizer files and
openvino_tokenizer.xml / openvino_detokenizer.xml. Draft folder: openvino_model.xml/.bin, config.json (GenAI's DFlash
path uses the target's tokenizer, so the draft needs none).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openvino as ov

from ovbuild.errors import CompatibilityError, ExportError
from ovbuild.graph.genai.draft import build_genai_draft
from ovbuild.graph.genai.target import build_genai_target
from ovbuild.graph.genai.tokenizer import SpecialTokens, convert_tokenizer
from ovbuild.graph.ir import MODEL_FILE, save_ir
from ovbuild.graph.weights import WeightPolicy
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.families import load_draft
from ovbuild.weights.target import TargetConfig, load_target

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def write_genai_target(folder: str | Path, target: Checkpoint, policy: WeightPolicy | None = None) -> Path:
    """Write the complete GenAI target folder for a Qwen3 checkpoint; returns the folder."""
    cfg, weights = load_target(target)
    model = build_genai_target(cfg, weights, policy)
    folder = _ready(folder)
    save_ir(model, folder / MODEL_FILE)
    _copy(target.folder / "config.json", folder)
    generation = _generation_config(target, cfg)
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (target.folder / name).exists():
            _copy(target.folder / name, folder)
    tokenizer, detokenizer = convert_tokenizer(target.folder / "tokenizer.json", special_tokens(target, generation))
    ov.save_model(tokenizer, str(folder / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(folder / "openvino_detokenizer.xml"))
    return folder


def write_genai_draft(
    folder: str | Path, draft: Checkpoint, target: Checkpoint | None = None, policy: WeightPolicy | None = None
) -> Path:
    """Write the GenAI folder of a DFlash v1 draft, checked against `target` when given; returns the folder."""
    cfg, weights = load_draft(draft)
    if target is not None:
        check_pair(cfg, load_target(target)[0], str(draft.config_path))
    model = build_genai_draft(cfg, weights, policy)
    folder = _ready(folder)
    save_ir(model, folder / MODEL_FILE)
    _copy(draft.folder / "config.json", folder)
    return folder


def check_pair(draft: DraftConfig, target: TargetConfig, where: str) -> None:
    """The draft reads the target's taps and shares its embedding, lm_head and vocabulary."""
    problems = []
    if draft.target_hidden_size != target.hidden_size:
        problems.append(f"target_hidden_size {draft.target_hidden_size} != target hidden_size {target.hidden_size}")
    if draft.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {draft.hidden_size} != target hidden_size {target.hidden_size} (grafted lm_head)")
    if draft.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {draft.vocab_size} != target vocab_size {target.vocab_size}")
    beyond = [i for i in draft.target_layer_ids if i >= target.num_layers]
    if beyond:
        problems.append(f"target_layer_ids {list(beyond)} beyond the target's {target.num_layers} layers")
    if problems:
        raise CompatibilityError(f"{where}: draft does not fit the target: " + "; ".join(problems))


def special_tokens(target: Checkpoint, generation: dict) -> SpecialTokens:
    """eos / pad / bos ids and the chat template, as transformers' tokenizer would report them."""
    config = _json(target.folder / "tokenizer_config.json")
    spec = _json(target.folder / "tokenizer.json")
    eos = _token_id(spec, config.get("eos_token"))
    if eos is None:
        eos = _first(generation.get("eos_token_id"))
    if eos is None:
        raise ExportError(f"{target.folder}: no eos token in tokenizer_config.json or generation_config.json")
    pad = _token_id(spec, config.get("pad_token"))
    template_file = target.folder / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.exists() else config.get("chat_template")
    return SpecialTokens(
        eos_token_id=eos,
        pad_token_id=eos if pad is None else pad,
        bos_token_id=_token_id(spec, config.get("bos_token")),
        chat_template=template if isinstance(template, str) else None,
    )


def _generation_config(target: Checkpoint, cfg: TargetConfig) -> dict:
    """The checkpoint's generation_config.json, or one carrying the config's eos ids (GenAI stops on them)."""
    path = target.folder / "generation_config.json"
    if path.exists():
        return _json(path)
    return {"eos_token_id": list(cfg.eos_token_ids), "do_sample": False} if cfg.eos_token_ids else {}


def _token_id(spec: dict, token) -> int | None:
    """Id of a tokenizer_config token entry (a string or {"content": ...}) in tokenizer.json, None if unset."""
    if isinstance(token, dict):
        token = token.get("content")
    if not token:
        return None
    for added in spec.get("added_tokens", []):
        if added["content"] == token:
            return added["id"]
    return spec.get("model", {}).get("vocab", {}).get(token)


def _first(value) -> int | None:
    return value[0] if isinstance(value, list) and value else value


def _json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not valid JSON ({e})") from e


def _ready(folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _copy(source: Path, folder: Path) -> None:
    if source.resolve() != (folder / source.name).resolve():
        shutil.copyfile(source, folder / source.name)
