"""Depth up-scaling: a deeper target started from a trained shallower one, computing exactly its function at step 0.

The trained layers keep their order and are spread evenly over the new depth; every new layer is a residual block
whose output projections (o_proj, down_proj) are zero, so it adds nothing until training moves them (the gradient
reaches both through their non-zero inputs). The grown model starts at the small model's loss, and a tap of the small
model (the output of its layer t) is the output of the last layer before the next trained one.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .common import read_json
from demo_model import Target, init_weights, tap_ids


def trained_positions(old_layers: int, new_layers: int) -> list[int]:
    """Where each trained layer goes: old layer j at j * new // old (0, 3, 6, ... for 8 -> 24)."""
    if new_layers < old_layers:
        raise ValueError(f"cannot grow {old_layers} layers into {new_layers}")
    return [j * new_layers // old_layers for j in range(old_layers)]


def grown_taps(taps: list[int], old_layers: int, new_layers: int) -> list[int]:
    """The grown model's layer whose output equals the small model's layer t output at step 0, for each tap t."""
    starts = [*trained_positions(old_layers, new_layers), new_layers]
    return [starts[t + 1] - 1 for t in taps]


@torch.no_grad()
def grow_target(small: Target, new_layers: int, generator: torch.Generator) -> Target:
    """A `new_layers`-deep target equal to `small` as a function (see the module doc)."""
    big = Target(replace(small.g, num_hidden_layers=new_layers))
    init_weights(big, generator)
    big.embed_tokens.load_state_dict(small.embed_tokens.state_dict())
    big.norm.load_state_dict(small.norm.state_dict())
    positions = trained_positions(small.g.num_hidden_layers, new_layers)
    for i, layer in enumerate(big.layers):
        if i in positions:
            layer.load_state_dict(small.layers[positions.index(i)].state_dict())
        else:  # an identity residual block until trained
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return big


def target_taps(args, num_layers: int) -> list[int]:
    """The target layers the draft reads: --taps; else, when grown, the grown positions of the trained draft's taps
    (so that draft can start the new one); else the z-lab default for --num-taps."""
    if args.taps:
        return list(args.taps)
    if args.grow_from:
        old = read_json(args.grow_from / "target" / "config.json")["num_hidden_layers"]
        taps = read_json(args.grow_from / "draft" / "config.json")["dflash_config"]["target_layer_ids"]
        return grown_taps(taps, old, num_layers)
    return tap_ids(num_layers, args.num_taps)
