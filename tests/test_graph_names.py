"""IR dumps read well: node names are paths, unique within a graph, and shared weights are built once."""

from __future__ import annotations

from collections import Counter

import pytest

from ovbuild.families import build_draft_models
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint


@pytest.mark.parametrize("fmt", ["keep", "int8"])
def test_node_names_are_unique_paths(target, draft, fmt):
    policy = WeightPolicy(fmt, group_size=16)
    models = {
        "target": build_target(*target, (1, 3, 5), policy),
        **build_draft_models(draft[0], draft[1], target[1], policy),
    }
    for name, model in models.items():
        names = Counter(n.get_friendly_name() for n in model.get_ops())
        assert not [n for n, c in names.items() if c > 1], f"{name}: duplicate node names"
    draft_names = {n.get_friendly_name() for n in models["openvino_model"].get_ops()}
    assert {"layers.0/self_attn/q_proj", "layers.0/self_attn/kv_proj", "layers.1/mlp/gate_up_proj"} <= draft_names
    names = {n.get_friendly_name() for n in models["target"].get_ops()}
    assert {
        "layers.0/self_attn/qkv_proj",  # q, k and v of one input: one MatMul over stacked weights
        "layers.0/self_attn/qkv_proj/weight",
        "layers.0/self_attn/qkv_proj/split",
        "layers.1/mlp/gate_up_proj",
        "layers.5/mlp/down_proj",
        "layers.2/self_attn/attention",
        "embed_tokens/gather",
        "lm_head",
    } <= names


def test_tied_embedding_and_lm_head_share_one_table(tmp_path):
    cfg, weights = load_target(Checkpoint.open(write_tiny_target(tmp_path / "t", tie_word_embeddings=True)))
    for fmt in ("keep", "int8"):
        model = build_target(cfg, weights, (), WeightPolicy(fmt))
        tables = [
            n
            for n in model.get_ops()
            if n.get_type_name() == "Constant" and list(n.get_output_shape(0)) == [cfg.vocab_size, cfg.hidden_size]
        ]
        assert len(tables) == 1, f"{fmt}: {len(tables)} copies of the tied table"
