"""Checkpoint I/O: Hugging Face configs, bf16 safetensors, and the geometry of the models they hold."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .common import EOS, MASK, read_json, write_json
from demo_model import Draft, Geometry, Target


def hf_config(g: Geometry, bos: int, eos: int) -> dict:
    return {
        "vocab_size": g.vocab_size,
        "hidden_size": g.hidden_size,
        "intermediate_size": g.intermediate_size,
        "num_hidden_layers": g.num_hidden_layers,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_key_value_heads,
        "head_dim": g.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": g.rms_norm_eps,
        "rope_theta": g.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * g.num_hidden_layers,
        "initializer_range": 0.02,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def save_weights(model: nn.Module, path: Path, prefix: str = "") -> None:
    tensors = {prefix + k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_weights(model: nn.Module, path: Path, prefix: str = "") -> None:
    tensors = load_file(str(path))
    model.load_state_dict({k.removeprefix(prefix): v.to(torch.float32) for k, v in tensors.items()}, strict=True)


def export_target(model: Target, out: Path, tok) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eos = tok.token_to_id(EOS)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    config |= hf_config(model.g, eos, eos) | {"tie_word_embeddings": True, "use_cache": True}
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {"bos_token_id": eos, "eos_token_id": eos, "do_sample": False})
    save_weights(model, out / "model.safetensors", prefix="model.")


def export_draft(model: Draft, out: Path, tok, num_target_layers: int, taps: list[int], block: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eos, mask = tok.token_to_id(EOS), tok.token_to_id(MASK)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    }
    config |= hf_config(model.g, eos, eos) | {
        "tie_word_embeddings": False,
        "num_target_layers": num_target_layers,
        "block_size": block,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": taps, "block_size": block},
    }
    write_json(out / "config.json", config)
    save_weights(model, out / "model.safetensors")


def geometry_from_config(config: dict) -> Geometry:
    return Geometry(**{k: config[k] for k in Geometry.__dataclass_fields__})


def load_target(out: Path) -> Target:
    model = Target(geometry_from_config(read_json(out / "target" / "config.json")))
    load_weights(model, out / "target" / "model.safetensors", prefix="model.")
    return model.eval().requires_grad_(False)


def load_draft(out: Path) -> tuple[Draft, dict]:
    config = read_json(out / "draft" / "config.json")
    dflash = config["dflash_config"]
    model = Draft(geometry_from_config(config), len(dflash["target_layer_ids"]))
    load_weights(model, out / "draft" / "model.safetensors")
    return model.eval().requires_grad_(False), dflash


def target_geometry(args, vocab: int) -> Geometry:
    return Geometry(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        rope_theta=args.rope_theta,
    )
