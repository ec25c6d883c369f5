"""Tokenizer and detokenizer IRs from a Hugging Face tokenizer.json, with openvino-tokenizers but no transformers.

openvino-tokenizers' own `convert_tokenizer` takes a transformers tokenizer object (and refuses to run without
transformers installed), but the pipeline steps it assembles live in `openvino_tokenizers.tokenizer_pipeline`, import
nothing from transformers, and most build themselves from tokenizer.json. This module assembles them for the
byte-level BPE tokenizers Qwen3 checkpoints ship (normalizer, Split/ByteLevel pre-tokenizers, BPE, ByteLevel
decoder); anything else is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import openvino as ov

from ovbuild.errors import ExportError, UnsupportedError
from ovbuild.ir import SpecialTokens
from ovbuild.ir.ports import ATTENTION_MASK, GENAI_INPUT_IDS

NORMALIZATIONS = ("NFC", "NFD", "NFKC", "NFKD")
SPLIT_BEHAVIOURS = {
    "Removed": "remove",
    "Isolated": "isolate",
    "MergedWithPrevious": "mergedwithprevious",
    "MergedWithNext": "mergedwithnext",
    "Contiguous": "contiguous",
}


def convert_tokenizer(tokenizer_json: Path, special: SpecialTokens) -> tuple[ov.Model, ov.Model]:
    """(tokenizer, detokenizer) models: string -> input_ids/attention_mask i64, and i64 ids -> string."""
    tp = _pipeline_module()
    spec = _read(tokenizer_json)
    where = str(tokenizer_json)
    model = spec["model"]
    if model.get("type") != "BPE":
        raise UnsupportedError(f"{where}: model.type '{model.get('type')}' (only byte-level BPE is converted)")
    decoder = spec.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise UnsupportedError(f"{where}: decoder.type '{decoder.get('type')}' (only ByteLevel is converted)")

    added = spec.get("added_tokens", [])
    pipeline = tp.TokenizerPipeline()
    pipeline.add_steps(tp.SpecialTokensSplit([tp.SpecialToken(a["content"], a["lstrip"], a["rstrip"]) for a in added]))
    for name in _listed(spec.get("normalizer"), "normalizers"):
        if name.get("type") not in NORMALIZATIONS:
            raise UnsupportedError(f"{where}: normalizer '{name.get('type')}' is not converted")
        pipeline.add_steps(tp.NormalizeUnicode(name["type"]))
    pre_tokenizers = _listed(spec.get("pre_tokenizer"), "pretokenizers")
    if not any(p.get("type") == "ByteLevel" for p in pre_tokenizers):
        raise UnsupportedError(f"{where}: no ByteLevel pre_tokenizer (only byte-level BPE is converted)")
    for i, step in enumerate(pre_tokenizers):
        if i and step.get("add_prefix_space"):
            # tokenizers then prefixes every piece the previous pre-tokenizers split off, not just the text.
            raise UnsupportedError(f"{where}: ByteLevel add_prefix_space after another pre_tokenizer is not converted")
        pipeline.add_steps(_pre_tokenizer(tp, step, where))
    pipeline.add_steps(tp.BPETokenizationStep.from_hf_json(spec))
    pipeline.vocab = pipeline[-1].vocab
    pipeline.add_steps(_post_processor(tp, spec.get("post_processor"), where))
    pipeline.add_steps(tp.PaddingStep(token=_token_text(added, special.pad_token_id), _token_id=special.pad_token_id))
    pipeline.add_steps(
        tp.VocabDecoderStep.from_hf_json(
            spec,
            pipeline.vocab,
            added_tokens={a["id"]: a["content"] for a in added},
            skip_tokens=[a["id"] for a in added if a["special"]],
            is_byte_level=True,
        )
    )
    pipeline.add_steps([tp.CharsToBytesStep(), tp.UTF8ValidateStep(mode=tp.UTF8ReplaceMode.REPLACE)])

    full = pipeline.get_tokenizer_ov_subgraph()
    # The padding step also emits token_type_ids; Qwen tokenizers feed only ids and mask to the model.
    outputs = [next(o for o in full.outputs if name in o.get_names()) for name in (GENAI_INPUT_IDS, ATTENTION_MASK)]
    tokenizer = _with_type(ov.Model(outputs, full.get_parameters(), "tokenizer"), ov.Type.i64, outputs=True)
    detokenizer = _with_type(pipeline.get_detokenizer_ov_subgraph(), ov.Type.i64, outputs=False)
    for m in (tokenizer, detokenizer):
        special.write(m)
    return tokenizer, detokenizer


def _pipeline_module():
    try:
        from openvino_tokenizers import tokenizer_pipeline
    except ImportError as e:
        raise ExportError(
            "writing tokenizer IRs needs openvino-tokenizers: pip install 'openvino-tokenizers==2026.4.*'"
        ) from e
    return tokenizer_pipeline


def _read(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ExportError(f"{path}: no tokenizer.json (GenAI needs the tokenizer IRs built from it)") from e
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSON, huge integers
        raise ExportError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a JSON object")
    return data


def _listed(entry: dict | None, key: str) -> list[dict]:
    """A tokenizer.json component that is absent, single, or a Sequence of `key`, as a list."""
    if entry is None:
        return []
    return entry[key] if entry.get("type") == "Sequence" else [entry]


def _pre_tokenizer(tp, step: dict, where: str) -> list:
    kind = step.get("type")
    if kind == "ByteLevel":
        steps = [tp.RegexNormalizationStep.add_prefix_whitespace_regex()] if step.get("add_prefix_space") else []
        if step.get("use_regex", True):
            steps.append(tp.RegexSplitStep.byte_level_splitter())
        return [*steps, tp.BytesToCharsStep()]
    if kind == "Split":
        pattern = step["pattern"]
        regex = pattern["Regex"] if "Regex" in pattern else tp.quote_meta(pattern.get("String", ""))
        behaviour = SPLIT_BEHAVIOURS.get(step.get("behavior"))
        if not regex or behaviour is None:
            raise UnsupportedError(f"{where}: Split pre_tokenizer {pattern} / {step.get('behavior')} is not converted")
        return [tp.RegexSplitStep(regex, invert=step.get("invert", False), behaviour=behaviour)]
    raise UnsupportedError(f"{where}: pre_tokenizer '{kind}' is not converted")


def _post_processor(tp, entry: dict | None, where: str):
    """ByteLevel (or none) adds nothing; TemplateProcessing adds its special tokens around the prompt."""
    steps = [s for s in _listed(entry, "processors") if s.get("type") != "ByteLevel"]
    if not steps:
        return tp.CombineSegmentsStep([tp.Sequence()], add_special_tokens=True)
    if len(steps) == 1 and steps[0].get("type") == "TemplateProcessing":
        return tp.CombineSegmentsStep.from_hf_json_template_postprocessor(steps[0], 1, True)
    raise UnsupportedError(f"{where}: post_processor {[s.get('type') for s in steps]} is not converted")


def _token_text(added: list[dict], token_id: int) -> str:
    return next((a["content"] for a in added if a["id"] == token_id), "")


def _with_type(model: ov.Model, element_type: ov.Type, outputs: bool) -> ov.Model:
    """Ids as i64 on the tokenizer's outputs / the detokenizer's input, as GenAI feeds and reads them."""
    ppp = ov.preprocess.PrePostProcessor(model)
    for i in range(len(model.outputs if outputs else model.inputs)):
        (ppp.output(i) if outputs else ppp.input(i)).tensor().set_element_type(element_type)
    return ppp.build()


def special_tokens(folder: Path, generation: dict) -> SpecialTokens:
    """eos / pad / bos ids and the chat template of a checkpoint folder, as transformers' tokenizer reports them."""
    config = _read_optional(folder / "tokenizer_config.json")
    spec = _read_optional(folder / "tokenizer.json")
    eos = _token_id(spec, config.get("eos_token"))
    if eos is None:
        eos = _first(generation.get("eos_token_id"))
    if eos is None:
        raise ExportError(f"{folder}: no eos token in tokenizer_config.json or generation_config.json")
    pad = _token_id(spec, config.get("pad_token"))
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.exists() else config.get("chat_template")
    return SpecialTokens(
        eos_token_id=eos,
        pad_token_id=eos if pad is None else pad,
        bos_token_id=_token_id(spec, config.get("bos_token")),
        chat_template=template if isinstance(template, str) else None,
    )


def _token_id(spec: dict, token) -> int | None:
    """Id of a tokenizer_config token entry (a string or {"content": ...}) in tokenizer.json, None if unset."""
    if isinstance(token, dict):
        token = token.get("content")
    if not token:
        return None
    for added in spec.get("added_tokens", []):
        if added["content"] == token:
            return added["id"]
    vocab = spec.get("model", {}).get("vocab")
    return vocab.get(token) if isinstance(vocab, dict) else None  # a Unigram vocab is a list: not looked up


def _first(value) -> int | None:
    return value[0] if isinstance(value, list) and value else value


def _read_optional(path: Path) -> dict:
    return _read(path) if path.exists() else {}
