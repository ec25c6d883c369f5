"""MiniCPM-V 4.7's vision tower as one IR: several images (an image's thumbnail and slices, or several images) of
different patch grids packed into one call, each attending only to itself, out come the language model's input
embeddings of every image in order and each image's token count.

```
pixel_values [1, C, p, L*p]  target_sizes [N, 2]
   │ patches [L, C*p*p] @ patch_embedding + position_embedding[nearest bucket of (row/h, col/w)]
   ▼
encoder layers 0 .. insert_layer_id        (attention within each image: block-diagonal mask)
   │ 16x: window merger (attention in 2x2 windows, 4 patches -> 1 token by an MLP + their mean); grids / 2
   ▼
encoder layers insert_layer_id+1 .. end    (same mask on the smaller grids)
   │ post_layernorm
   ▼
merger x merger_times: 2x2 neighbours concatenated -> LayerNorm -> linear_1 -> GELU -> linear_2
   ▼
image_embeds [T, LM hidden]   image_token_counts [N]   (T = sum h*w / 16 in 16x mode, / 4 in 4x)
```
"""

from __future__ import annotations

import openvino as ov
import openvino.opset16 as ops

from ovbuild.graph.ops import Output, const, i64, named, parameter, result
from ovbuild.graph.vision.minicpm_grid import (
    PatchGrid,
    downsampled,
    grouped_order,
    nearest_positions,
    patch_grid,
    same_image,
    token_counts,
)
from ovbuild.graph.weights import WeightPolicy, f32_constant
from ovbuild.ir import VisionIR, write_rt_info
from ovbuild.ir.ports import IMAGE_EMBEDS, IMAGE_TOKEN_COUNTS, MINICPM_PIXEL_VALUES, MINICPM_TARGET_SIZES
from ovbuild.weights.vision_minicpm import MiniCPMVisionConfig, MiniCPMVisionWeights

MERGER_EPS = 1e-6  # MiniCPMV4_7DownsampleMLP's LayerNorm, fixed whatever the config says


class VisionContext:
    """The config, the weights and the storage policy one build reads through."""

    def __init__(self, cfg: MiniCPMVisionConfig, weights: MiniCPMVisionWeights, policy: WeightPolicy):
        self.cfg, self.weights, self.policy = cfg, weights, policy

    def linear(self, x: Output, name: str, path: str) -> Output:
        """x @ W^T + b for the checkpoint's `name` linear: x [..., in] -> [..., out]."""
        w = self.policy.matrix(self.weights.get(name), f"{path}")
        y = ops.matmul(x, w, False, True)
        return named(ops.add(y, f32_constant(self.weights.get(name, "bias"), f"{path}/bias")), path)

    def layer_norm(self, x: Output, name: str, path: str, eps: float | None = None) -> Output:
        """LayerNorm over the last axis with the checkpoint's `name` weight and bias."""
        eps = self.cfg.layer_norm_eps if eps is None else eps
        normalized = ops.mvn(x, i64([-1]), True, eps, "inside_sqrt")
        scaled = ops.multiply(normalized, f32_constant(self.weights.get(name), f"{path}/weight"))
        return named(ops.add(scaled, f32_constant(self.weights.get(name, "bias"), f"{path}/bias")), path)


def gelu(x: Output, form: str, path: str) -> Output:
    """GELU in the tanh form (gelu_pytorch_tanh) or the exact erf form (nn.GELU)."""
    return named(ops.gelu(x, form), path)


def attention(ctx: VisionContext, x: Output, name: str, path: str, mask: Output | None, groups: int = 0) -> Output:
    """Softmax attention of `name`'s q/k/v/out projections. x: [L, D] -> [L, D]. With `mask` ([L, L] bool) every
    patch attends where it is true; with `groups` > 0 the rows are consecutive groups of that many, each attending
    to itself only (the window merger's windows), and no mask is needed."""
    cfg = ctx.cfg
    heads, hd = cfg.num_heads, cfg.head_dim
    split = [-1, groups, heads, hd] if groups else [1, -1, heads, hd]
    qkv = []
    for proj in ("q_proj", "k_proj", "v_proj"):
        y = ctx.linear(x, f"{name}.{proj}", f"{path}/{proj}")
        y = ops.reshape(y, i64(split), False)  # [L, D] -> [B, n, heads, head_dim]
        qkv.append(ops.transpose(y, i64([0, 2, 1, 3])))  # [B, heads, n, head_dim]
    scale = const(hd**-0.5)
    out = ops.scaled_dot_product_attention(*qkv, attention_mask=mask, scale=scale, causal=False)  # [B, heads, n, hd]
    named(out, f"{path}/sdpa")
    out = ops.reshape(ops.transpose(out, i64([0, 2, 1, 3])), i64([-1, cfg.hidden_size]), False)  # [L, D]
    return ctx.linear(out, f"{name}.out_proj", f"{path}/out_proj")


def encoder_layer(ctx: VisionContext, i: int, x: Output, mask: Output) -> Output:
    """One pre-LayerNorm transformer layer, attention within each image. x: [L, D] -> [L, D]."""
    name, path = f"layers.{i}", f"vision.layers.{i}"
    h = ctx.layer_norm(x, f"{name}.layer_norm1", f"{path}/layer_norm1")
    x = ops.add(x, attention(ctx, h, name, f"{path}/self_attn", mask))
    h = ctx.layer_norm(x, f"{name}.layer_norm2", f"{path}/layer_norm2")
    h = gelu(ctx.linear(h, f"{name}.fc1", f"{path}/mlp/fc1"), ctx.cfg.activation, f"{path}/mlp/act")
    return named(ops.add(x, ctx.linear(h, f"{name}.fc2", f"{path}/mlp/fc2")), f"{path}/out")


def window_merger(ctx: VisionContext, x: Output, grid: PatchGrid) -> Output:
    """The window merger: patches regrouped window by window (k x k), attention inside each window added to them,
    then each window's k*k patches concatenated -> pre_norm -> linear_1 -> tanh-GELU -> linear_2, plus the
    patches' mean. x: [L, D] -> [L / k^2, D], tokens row-major over each image's (h / k) x (w / k) grid."""
    k, d, path = ctx.cfg.window_kernel, ctx.cfg.hidden_size, "vision.vit_merger"
    x = ops.gather(x, grouped_order(grid, k, k, f"{path}/window_order"), i64(0))  # [L, D], window by window
    h = ctx.layer_norm(x, "window.layer_norm1", f"{path}/layer_norm1")
    x = ops.add(x, attention(ctx, h, "window", f"{path}/self_attn", None, groups=k * k))  # [L, D]
    patch = ops.reshape(x, i64([-1, k * k, d]), False)  # [windows, k*k, D]
    flat = ops.reshape(x, i64([-1, k * k * d]), False)  # [windows, k*k*D]
    h = ctx.layer_norm(flat, "window.pre_norm", f"{path}/pre_norm")
    h = gelu(ctx.linear(h, "window.linear_1", f"{path}/linear_1"), "tanh", f"{path}/act")
    h = ctx.linear(h, "window.linear_2", f"{path}/linear_2")
    return named(ops.add(h, ops.reduce_mean(patch, i64(1), False)), f"{path}/out")  # [windows, D]


def merger(ctx: VisionContext, x: Output, sizes: Output) -> tuple[Output, Output]:
    """merger_times rounds of: kh x kw neighbours concatenated, then the round's downsample MLP (LayerNorm, linear_1,
    exact GELU, linear_2). x: [L, D] on grids `sizes` -> ([T, LM hidden], the final grids [N, 2])."""
    kh, kw = ctx.cfg.merge_kernel
    for m, (inner, _) in enumerate(ctx.cfg.merger_widths()):
        path = f"merger.mlp.{m}"
        grid = patch_grid(sizes, rows_of(x), f"{path}/grid")
        x = ops.gather(x, grouped_order(grid, kh, kw, f"{path}/group_order"), i64(0))  # [L, width], group by group
        x = ops.reshape(x, i64([-1, inner]), False)  # [L / (kh*kw), kh*kw*width]
        h = ctx.layer_norm(x, f"merger.{m}.pre_norm", f"{path}/pre_norm", MERGER_EPS)
        h = gelu(ctx.linear(h, f"merger.{m}.linear_1", f"{path}/linear_1"), "erf", f"{path}/act")
        x = ctx.linear(h, f"merger.{m}.linear_2", f"{path}/linear_2")
        sizes = downsampled(sizes, kh, kw, f"{path}/sizes")
    return x, sizes


def rows_of(x: Output) -> Output:
    """The number of rows (first axis) of x: [] i64."""
    return ops.gather(ops.shape_of(x, ov.Type.i64), i64(0), i64(0)).output(0)


def patch_embeddings(ctx: VisionContext, pixel_values: Output) -> Output:
    """The stride-p patch convolution as one matmul. pixel_values [1, C, p, L*p] -> [L, D]."""
    c, p, d = ctx.cfg.num_channels, ctx.cfg.patch_size, ctx.cfg.hidden_size
    x = ops.reshape(pixel_values, i64([c, p, -1, p]), False)  # [1, C, p, L*p] -> [C, p, L, p]
    x = ops.transpose(x, i64([2, 0, 1, 3]))  # [L, C, p, p]
    x = ops.reshape(x, i64([-1, c * p * p]), False)  # [L, C*p*p], as the conv weight [D, C, p, p] flattens
    w = ctx.weights.get("patch_embedding")
    matrix = ctx.policy.matrix(type(w)(w.name, w.dtype, w.array.reshape(d, c * p * p)), "vision.patch_embedding")
    y = ops.matmul(x, matrix, False, True)  # [L, D]
    bias = f32_constant(ctx.weights.get("patch_embedding", "bias"), "vision.patch_embedding/bias")
    return named(ops.add(y, bias), "vision.patch_embedding")


def vision_tower(ctx: VisionContext, pixel_values: Output, sizes: Output) -> tuple[Output, Output]:
    """Embeddings, encoder (with the window merger at insert_layer_id in 16x mode) and post_layernorm:
    -> ([L', D], the grids [N, 2] after the window merger, if it ran)."""
    cfg = ctx.cfg
    x = patch_embeddings(ctx, pixel_values)  # [L, D]
    grid = patch_grid(sizes, rows_of(x), "vision.grid")
    table = f32_constant(ctx.weights.get("position_embedding"), "vision.position_embedding")
    positions = nearest_positions(grid, cfg.positions_per_side, "vision.position_ids")
    x = named(ops.add(x, ops.gather(table, positions, i64(0))), "vision.embeddings")  # [L, D]
    mask = same_image(grid, "vision.mask")
    for i in range(cfg.num_layers):
        x = encoder_layer(ctx, i, x, mask)
        if cfg.uses_window_merger and i == cfg.insert_layer_id:
            x = window_merger(ctx, x, grid)  # [L / k^2, D]
            k = cfg.window_kernel
            sizes = downsampled(sizes, k, k, "vision.vit_merger/sizes")
            grid = patch_grid(sizes, rows_of(x), "vision.merged_grid")
            mask = same_image(grid, "vision.merged_mask")
    return ctx.layer_norm(x, "post_layernorm", "vision.post_layernorm"), sizes


def build_minicpm_vision(
    cfg: MiniCPMVisionConfig, weights: MiniCPMVisionWeights, policy: WeightPolicy | None = None
) -> ov.Model:
    """The vision IR: pixel_values [1, C, p, L*p] + target_sizes [N, 2] -> image_embeds [T, LM hidden] and
    image_token_counts [N]. Every grid side must be a multiple of `grid_multiple(cfg)`, and sum h*w = L."""
    ctx = VisionContext(cfg, weights, policy or WeightPolicy())
    pixel_values = parameter(MINICPM_PIXEL_VALUES, [1, cfg.num_channels, cfg.patch_size, -1])
    sizes = parameter(MINICPM_TARGET_SIZES, [-1, 2])
    hidden, merged_sizes = vision_tower(ctx, pixel_values.output(0), sizes.output(0))
    embeds, final_sizes = merger(ctx, hidden, merged_sizes)
    counts = token_counts(final_sizes, "merger/token_counts")
    model = ov.Model(
        [result(embeds, IMAGE_EMBEDS), result(counts, IMAGE_TOKEN_COUNTS)], [pixel_values, sizes], "minicpm_vision"
    )
    write_rt_info(model, vision_ir(cfg), ctx.policy.storage())
    return model


def grid_multiple(cfg: MiniCPMVisionConfig) -> int:
    """What every grid side must be a multiple of: the window (16x) times the merger's kernel per round."""
    window = cfg.window_kernel if cfg.uses_window_merger else 1
    return window * max(cfg.merge_kernel) ** cfg.merger_times


def vision_ir(cfg: MiniCPMVisionConfig) -> VisionIR:
    """The IR's record: how to pack its input and count its output."""
    return VisionIR(
        family=cfg.family,
        depth=cfg.depth,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_heads,
        in_channels=cfg.num_channels,
        patch_size=cfg.patch_size,
        num_position_embeddings=cfg.positions_per_side**2,
        out_hidden_size=cfg.llm_hidden_size,
        patches_per_token=cfg.patches_per_token,
        grid_multiple=grid_multiple(cfg),
        downsample_mode=cfg.downsample_mode,
    )
