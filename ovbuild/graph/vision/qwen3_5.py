"""The Qwen3.5-family vision tower (transformers' Qwen3_5VisionModel) as one IR: every image of a call packed into
`pixel_values`, each image's patch grid a row of `grid_thw`; every index (patch positions, attention segments,
position-grid samples) is computed in the graph from the grids, so a caller passes pixels and grids only.

pixel_values [N, C*T*P*P]   grid_thw [I, 3]
   │ patch_embed (Conv3d, stride = kernel: a MatMul)   │ patch_layout: row, col, extent, segment of each patch
   ▼                                                    ▼
 x [N, H] + position_embedding (bilinear, align corners) ── rotary (cos, sin of rows and columns)
   │ blocks: x + attn(norm1 x) (attention within each segment), x + mlp(norm2 x)
   ▼
 merger: norm, m*m patches of a window -> one row, fc1, GELU, fc2  ->  image_embeds [N / m^2, out_hidden_size]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named, parameter, result
from ovbuild.graph.vision.blocks import activation, biased_linear, layer_norm, packed_attention, segment_mask
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.ir import VisionIR, write_rt_info
from ovbuild.ir.ports import GRID_THW, IMAGE_EMBEDS, PIXEL_VALUES
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource
from ovbuild.weights.vision_qwen import LAYER_NORM_EPS, QwenVisionConfig, qwen_vision_shapes


class ShapedSource(WeightSource):
    """A tensor source that checks every tensor against the tower's shape table as it is read."""

    def __init__(self, inner: WeightSource, cfg: QwenVisionConfig):
        super().__init__(inner.checkpoint, inner.table)
        self.inner, self.shapes = inner, qwen_vision_shapes(cfg)

    def get(self, canonical: str, shape: tuple[int, ...] | None = None) -> WeightTensor:
        template = canonical.split(".", 2)
        key = f"layers.{{i}}.{template[2]}" if template[0] == "layers" else canonical
        return self.inner.get(canonical, shape or self.shapes[key])


@dataclass(frozen=True)
class BlockInputs:
    """What every block reads besides its input: the rotary tables ([N, 1, head_dim]) and the segment mask."""

    cos: Output
    sin: Output
    mask: Output  # [N, N] additive


@dataclass(frozen=True)
class PatchLayout:
    """Where each packed patch sits, all [N] i64: its row and column in its image's patch grid, that grid's height
    and width, and its attention segment (one per frame of each image)."""

    row: Output
    col: Output
    height: Output
    width: Output
    segment: Output


def patch_layout(grid: Output, patches: Output, merge: int) -> PatchLayout:
    """Each patch's place from the grids, in the processor's order: images one after another, each frame by frame,
    each frame window by window (merge x merge patches), each window row by row.

    grid: [I, 3] (t, h, w) i64, patches: [N, ...] (only its row count is read).
    """
    t, h, w = (ops.squeeze(s, i64([1])) for s in ops.split(grid, i64(1), 3).outputs())  # each [I]
    sizes = ops.multiply(ops.multiply(t, h), w)  # [I] patches per image
    ends = ops.cumsum(sizes, i64(0))  # [I]
    n = ops.gather(ops.shape_of(patches, ov.Type.i64), i64(0), i64(0))  # []
    p = ops.range(i64(0), n, i64(1), ov.Type.i64)  # [N]
    past = ops.greater_equal(ops.unsqueeze(p, i64(1)), ops.unsqueeze(ends, i64(0)))  # [N, I]: image ended before p
    image = named(ops.reduce_sum(ops.convert(past, ov.Type.i64), i64([1]), False), "visual.layout/image")  # [N]
    height, width = ops.gather(h, image, i64(0)), ops.gather(w, image, i64(0))  # [N]
    start = ops.gather(ops.subtract(ends, sizes), image, i64(0))  # [N] the image's first patch
    local = ops.subtract(p, start)  # [N] index within the image
    frame_size = ops.multiply(height, width)
    frame, q = ops.divide(local, frame_size), ops.floor_mod(local, frame_size)  # [N]
    m = i64(merge)
    inner_col, inner_row = ops.floor_mod(q, m), ops.floor_mod(ops.divide(q, m), m)
    windows_across = ops.divide(width, m)  # windows per grid row
    window = ops.divide(q, i64(merge * merge))  # [N] the window's index in its frame
    window_row, window_col = ops.divide(window, windows_across), ops.floor_mod(window, windows_across)
    row = named(ops.add(ops.multiply(window_row, m), inner_row), "visual.layout/row")
    col = named(ops.add(ops.multiply(window_col, m), inner_col), "visual.layout/col")
    first_frames = ops.subtract(ops.cumsum(t, i64(0)), t)  # [I] each image's first segment
    segment = named(ops.add(ops.gather(first_frames, image, i64(0)), frame), "visual.layout/segment")
    return PatchLayout(row, col, height.output(0), width.output(0), segment)


def patch_embed(pixels: Output, weights: WeightSource, cfg: QwenVisionConfig, policy: WeightPolicy) -> Output:
    """The Conv3d whose stride is its kernel, on patches already flattened (C, T, P, P): a MatMul plus bias.

    pixels: [N, C*T*P*P] -> [N, H]
    """
    w = policy.matrix(weights.get("patch_embed.weight"), "visual.patch_embed/proj")  # [H, C, T, P, P]
    w = ops.reshape(w, i64([cfg.hidden_size, cfg.patch_dim]), False)  # [H, C*T*P*P]
    y = ops.matmul(pixels, w, False, True)
    return named(
        ops.add(y, f32_constant(weights.get("patch_embed.bias"), "visual.patch_embed/proj/bias")), "visual.patch_embed"
    )


def grid_coordinate(index: Output, extent: Output, side: int, path: str) -> Output:
    """torch.linspace(0, side - 1, extent)[index] in float32, as torch computes it: index * step on the first half,
    (side - 1) - (extent - 1 - index) * step on the second, and 0 when extent is 1. index, extent: [N] -> [N] f32."""
    f32 = ov.Type.f32
    last = ops.subtract(extent, i64(1))  # [N]
    step = ops.divide(const(float(side - 1)), ops.convert(ops.maximum(last, i64(1)), f32))
    low = ops.multiply(ops.convert(index, f32), step)
    high = ops.subtract(const(float(side - 1)), ops.multiply(ops.convert(ops.subtract(last, index), f32), step))
    first_half = ops.less(index, ops.divide(extent, i64(2)))
    value = ops.select(first_half, low, high)
    return named(ops.select(ops.equal(extent, i64(1)), const(0.0), value), path)


def position_embedding(layout: PatchLayout, weights: WeightSource, cfg: QwenVisionConfig) -> Output:
    """The learned side x side grid sampled bilinearly (align corners) at each patch's place in its image's grid.

    -> [N, H]: the four neighbours' rows of pos_embed, weighted (1-dh)(1-dw), (1-dh)dw, dh(1-dw), dh dw.
    """
    side = cfg.grid_side
    y = grid_coordinate(layout.row, layout.height, side, "visual.pos_embed/y")  # [N]
    x = grid_coordinate(layout.col, layout.width, side, "visual.pos_embed/x")
    y0, x0 = ops.convert(ops.floor(y), ov.Type.i64), ops.convert(ops.floor(x), ov.Type.i64)
    y1, x1 = ops.minimum(ops.add(y0, i64(1)), i64(side - 1)), ops.minimum(ops.add(x0, i64(1)), i64(side - 1))
    dy, dx = ops.subtract(y, ops.convert(y0, ov.Type.f32)), ops.subtract(x, ops.convert(x0, ov.Type.f32))
    ry, rx = ops.subtract(const(1.0), dy), ops.subtract(const(1.0), dx)

    def column(v: Output) -> Output:
        return ops.unsqueeze(v, i64(1))  # [N] -> [N, 1]

    corners = [(y0, x0, ry, rx), (y0, x1, ry, dx), (y1, x0, dy, rx), (y1, x1, dy, dx)]
    index = ops.concat([column(ops.add(ops.multiply(a, i64(side)), b)) for a, b, _, _ in corners], 1)  # [N, 4]
    weight = ops.concat([column(ops.multiply(u, v)) for _, _, u, v in corners], 1)  # [N, 4]
    table = weights.get("pos_embed").to_f32()  # [side^2, H]
    rows = ops.gather(const(table), index, i64(0))  # [N, 4, H]
    weighted = ops.multiply(rows, ops.unsqueeze(weight, i64(2)))  # [N, 4, H]
    return named(ops.reduce_sum(weighted, i64([1]), False), "visual.pos_embed")  # [N, H]


def inverse_frequencies(cfg: QwenVisionConfig) -> np.ndarray:
    """theta^(-2j / (head_dim / 2)) for j < head_dim / 4: one frequency set shared by rows and columns."""
    half = cfg.head_dim // 2
    return (1.0 / cfg.rope_theta ** (np.arange(0, half, 2, dtype=np.float64) / half)).astype(np.float32)


def rotary(layout: PatchLayout, cfg: QwenVisionConfig) -> tuple[Output, Output]:
    """cos and sin of each patch's angles [row f, col f, row f, col f] over the head: each [N, 1, head_dim]."""
    inv = const(inverse_frequencies(cfg))  # [head_dim / 4]
    angles = [ops.multiply(ops.unsqueeze(ops.convert(v, ov.Type.f32), i64(1)), inv) for v in (layout.row, layout.col)]
    full = ops.concat([*angles, *angles], 1)  # [N, head_dim]
    cos = named(ops.unsqueeze(ops.cos(full), i64(1)), "visual.rotary/cos")  # [N, 1, head_dim]
    sin = named(ops.unsqueeze(ops.sin(full), i64(1)), "visual.rotary/sin")
    return cos, sin


def apply_rotary(x: Output, cos: Output, sin: Output, path: str) -> Output:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; x: [N, heads, head_dim]."""
    first, second = ops.split(x, i64(-1), 2).outputs()
    rotated = ops.concat([ops.negative(second), first], -1)
    return named(ops.add(ops.multiply(x, cos), ops.multiply(rotated, sin)), path)


def attention(
    x: Output, weights: WeightSource, cfg: QwenVisionConfig, i: int, ctx: BlockInputs, policy: WeightPolicy
) -> Output:
    """One block's attention: fused qkv with bias, 2-D rotary, softmax within each segment, out projection."""
    path = f"visual.blocks.{i}/attn"
    qkv = biased_linear(x, weights, f"layers.{i}.attn.qkv", f"{path}/qkv", policy)  # [N, 3H]
    qkv = ops.reshape(qkv, i64([0, 3, cfg.num_heads, cfg.head_dim]), True)  # [N, 3, heads, head_dim]
    q, k, v = (ops.squeeze(t, i64([1])) for t in ops.split(qkv, i64(1), 3).outputs())  # each [N, heads, head_dim]
    q = apply_rotary(q, ctx.cos, ctx.sin, f"{path}/q_rotary")
    k = apply_rotary(k, ctx.cos, ctx.sin, f"{path}/k_rotary")
    out = packed_attention(q, k, v, ctx.mask, cfg.head_dim, f"{path}/sdpa")  # [N, H]
    return biased_linear(out, weights, f"layers.{i}.attn.proj", f"{path}/proj", policy)


def block(
    x: Output, weights: WeightSource, cfg: QwenVisionConfig, i: int, ctx: BlockInputs, policy: WeightPolicy
) -> Output:
    """x + attn(norm1 x), then + mlp(norm2 x); x: [N, H]."""
    path = f"visual.blocks.{i}"
    h = layer_norm(x, weights, f"layers.{i}.norm1", LAYER_NORM_EPS, f"{path}/norm1")
    x = ops.add(x, attention(h, weights, cfg, i, ctx, policy))
    h = layer_norm(x, weights, f"layers.{i}.norm2", LAYER_NORM_EPS, f"{path}/norm2")
    h = biased_linear(h, weights, f"layers.{i}.mlp.linear_fc1", f"{path}/mlp/linear_fc1", policy)
    h = activation(h, cfg.hidden_act, f"{path}/mlp/act")
    h = biased_linear(h, weights, f"layers.{i}.mlp.linear_fc2", f"{path}/mlp/linear_fc2", policy)
    return named(ops.add(x, h), f"{path}/out")


def merger(x: Output, weights: WeightSource, cfg: QwenVisionConfig, policy: WeightPolicy) -> Output:
    """LayerNorm per patch, each window's merge x merge patches side by side in one row, then fc1, GELU (erf),
    fc2. x: [N, H] -> [N / m^2, out_hidden_size]."""
    h = layer_norm(x, weights, "merger.norm", LAYER_NORM_EPS, "visual.merger/norm")
    h = ops.reshape(h, i64([-1, cfg.merged_hidden_size]), False)  # [N / m^2, H * m^2]
    h = biased_linear(h, weights, "merger.linear_fc1", "visual.merger/linear_fc1", policy)
    h = named(ops.gelu(h, "erf"), "visual.merger/act")  # nn.GELU(): exact, unlike the blocks' tanh form
    return biased_linear(h, weights, "merger.linear_fc2", "visual.merger/linear_fc2", policy)


def build_qwen_vision(cfg: QwenVisionConfig, weights: WeightSource, policy: WeightPolicy | None = None) -> ov.Model:
    """The vision tower IR: pixel_values [N, C*T*P*P] f32 and grid_thw [I, 3] i64 -> image_embeds [N / m^2, out]."""
    policy = policy or WeightPolicy()
    weights = ShapedSource(weights, cfg)
    pixels = parameter(PIXEL_VALUES, [-1, cfg.patch_dim])
    grid = parameter(GRID_THW, [-1, 3])
    layout = patch_layout(grid.output(0), pixels.output(0), cfg.spatial_merge_size)
    x = patch_embed(pixels.output(0), weights, cfg, policy)
    x = named(ops.add(x, position_embedding(layout, weights, cfg)), "visual.embeddings")  # [N, H]
    cos, sin = rotary(layout, cfg)
    ctx = BlockInputs(cos, sin, segment_mask(layout.segment, "visual.attention_mask"))
    for i in range(cfg.depth):
        x = block(x, weights, cfg, i, ctx, policy)
    out = merger(x, weights, cfg, policy)
    model = ov.Model([result(out, IMAGE_EMBEDS)], [pixels, grid], "qwen3_5_vision")
    write_rt_info(model, vision_record(cfg), policy.storage())
    return model


def vision_record(cfg: QwenVisionConfig) -> VisionIR:
    """What the vision IR records about the tower."""
    return VisionIR(
        family=cfg.family,
        depth=cfg.depth,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        in_channels=cfg.in_channels,
        patch_size=cfg.patch_size,
        num_position_embeddings=cfg.num_position_embeddings,
        out_hidden_size=cfg.out_hidden_size,
        patches_per_token=cfg.merge_unit,
        grid_multiple=cfg.spatial_merge_size,
        temporal_patch_size=cfg.temporal_patch_size,
    )
