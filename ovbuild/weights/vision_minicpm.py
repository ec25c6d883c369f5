"""MiniCPM-V 4.7's vision side (`MiniCPMV4_7ForConditionalGeneration`): config keys and tensor names as the published
checkpoints write them.

config.json: the SigLIP-style tower's geometry nests under `vision_config` (`model_type` minicpmv4_7_vision); the
top level holds what joins it to the language model: `insert_layer_id` (which overrides the nested one, as
transformers' `MiniCPMV4_7Config.__post_init__` copies it down), `downsample_mode` ("16x" / "4x"),
`merge_kernel_size`, `merger_times`, and `text_config.hidden_size`, the width the merger projects to. A key left out
takes transformers' default. Tensors: the tower under `model.vision_tower.`, the merger under `model.merger.`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import ConfigError, TensorError, UnsupportedError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

ARCHITECTURE = "MiniCPMV4_7ForConditionalGeneration"
DOWNSAMPLE_MODES = ("16x", "4x")  # 16x: window merger and merger, 16 patches a token; 4x: merger only, 4
# hidden_act -> the GELU form the graph and the reference compute (transformers' ACT2FN names).
ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "erf"}

TOWER = "model.vision_tower."
MERGER = "model.merger."
# Canonical name -> checkpoint name; `{i}`: an encoder layer, `{m}`: a merger round. Every linear and LayerNorm has
# `.weight` and `.bias` (`params`).
LINEARS = ("q_proj", "k_proj", "v_proj", "out_proj")
TENSORS: dict[str, str] = {
    "patch_embedding": f"{TOWER}embeddings.patch_embedding",
    "position_embedding": f"{TOWER}embeddings.position_embedding",
    **{f"layers.{{i}}.{n}": f"{TOWER}encoder.layers.{{i}}.{n}" for n in ("layer_norm1", "layer_norm2")},
    **{f"layers.{{i}}.{n}": f"{TOWER}encoder.layers.{{i}}.self_attn.{n}" for n in LINEARS},
    **{f"layers.{{i}}.{n}": f"{TOWER}encoder.layers.{{i}}.mlp.{n}" for n in ("fc1", "fc2")},
    "post_layernorm": f"{TOWER}post_layernorm",
    **{f"window.{n}": f"{TOWER}vit_merger.self_attn.{n}" for n in LINEARS},
    **{f"window.{n}": f"{TOWER}vit_merger.{n}" for n in ("layer_norm1", "pre_norm", "linear_1", "linear_2")},
    **{f"merger.{{m}}.{n}": f"{MERGER}mlp.{{m}}.{n}" for n in ("pre_norm", "linear_1", "linear_2")},
}
PARAMS = {"position_embedding": ("weight",)}  # every other entry: weight and bias


@dataclass(frozen=True)
class MiniCPMVisionConfig:
    """The vision tower, window merger and merger of one MiniCPM-V 4.7 checkpoint, normalized."""

    hidden_size: int  # D
    intermediate_size: int  # the encoder MLP's width
    num_layers: int
    num_heads: int
    num_channels: int
    image_size: int  # position table side = image_size // patch_size
    patch_size: int
    activation: str  # "tanh" or "erf": the encoder MLP's GELU
    layer_norm_eps: float
    insert_layer_id: int  # the window merger runs after this encoder layer (16x only)
    window_kernel: int  # the window merger's square window
    downsample_mode: str  # "16x" or "4x"
    merge_kernel: tuple[int, int]  # the merger's (h, w) groups
    merger_times: int
    llm_hidden_size: int  # what the last merger round projects to
    family: str = "minicpmv4_7_vision"  # the VisionTower's name and the IR's `ovbuild/family`

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def depth(self) -> int:
        """Encoder layers, which the export's progress follows."""
        return self.num_layers

    @property
    def positions_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def uses_window_merger(self) -> bool:
        return self.downsample_mode == "16x"

    @property
    def merge_size(self) -> int:
        return self.merge_kernel[0] * self.merge_kernel[1]

    @property
    def patches_per_token(self) -> int:
        """Patches behind one output token: 16 in 16x mode, 4 in 4x (with 2x2 kernels and one merger round)."""
        window = self.window_kernel**2 if self.uses_window_merger else 1
        return window * self.merge_size**self.merger_times

    def merger_widths(self) -> list[tuple[int, int]]:
        """(input, output) width of each merger round: D*4 -> D for all but the last, D*4 -> the LM's hidden."""
        d = self.hidden_size
        return [(d * self.merge_size, d)] * (self.merger_times - 1) + [(d * self.merge_size, self.llm_hidden_size)]

    def tokens(self, height: int, width: int) -> int:
        """Output tokens of an image of height x width patches."""
        return height * width // self.patches_per_token

    def with_mode(self, downsample_mode: str) -> MiniCPMVisionConfig:
        """The same tower run in the other downsample mode (transformers' per-call `downsample_mode`)."""
        if downsample_mode not in DOWNSAMPLE_MODES:
            raise ConfigError(f"downsample_mode '{downsample_mode}' is not one of {', '.join(DOWNSAMPLE_MODES)}")
        return _checked(dict(vars(self), downsample_mode=downsample_mode), f"downsample_mode '{downsample_mode}'")


def parse_minicpm_vision(config: dict, path: str) -> MiniCPMVisionConfig:
    """Normalize the vision side of a MiniCPM-V 4.7 config.json."""
    root = ConfigReader(config, path)
    arch = root.architecture()
    if arch != ARCHITECTURE:
        raise UnsupportedError(f"{root.where('architectures')}: {arch!r} is not {ARCHITECTURE}")
    vision = root.section("vision_config") or ConfigReader({}, path, "vision_config.")
    text = root.section("text_config")
    if text is None:
        raise ConfigError(f"{root.where('text_config')} is missing (the merger projects to its hidden_size)")
    act = vision.str("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise UnsupportedError(f"{vision.where('hidden_act')} = '{act}' is not one of {', '.join(ACTIVATIONS)}")
    mode = root.str("downsample_mode", "16x")
    if mode not in DOWNSAMPLE_MODES:
        raise ConfigError(f"{root.where('downsample_mode')} = '{mode}' is not one of {', '.join(DOWNSAMPLE_MODES)}")
    fields = dict(
        hidden_size=vision.int("hidden_size", 768, minimum=1),
        intermediate_size=vision.int("intermediate_size", 3072, minimum=1),
        num_layers=vision.int("num_hidden_layers", 12, minimum=1),
        num_heads=vision.int("num_attention_heads", 12, minimum=1),
        num_channels=vision.int("num_channels", 3, minimum=1),
        image_size=_square(vision, "image_size", 224),
        patch_size=_square(vision, "patch_size", 16),
        activation=ACTIVATIONS[act],
        layer_norm_eps=vision.float("layer_norm_eps", 1e-6),
        insert_layer_id=root.int("insert_layer_id", 6),
        window_kernel=_square(vision, "window_kernel_size", 2),
        downsample_mode=mode,
        merge_kernel=_pair(root, "merge_kernel_size", (2, 2)),
        merger_times=root.int("merger_times", 1, minimum=1),
        llm_hidden_size=text.int("hidden_size", minimum=1),
    )
    return _checked(fields, path)


def _checked(fields: dict, where: str) -> MiniCPMVisionConfig:
    """The config, after the checks transformers' modules make implicitly (a view that would not fit)."""
    cfg = MiniCPMVisionConfig(**fields)
    if cfg.hidden_size % cfg.num_heads:
        raise ConfigError(
            f"{where}: key 'vision_config.num_attention_heads' = {cfg.num_heads} does not divide hidden_size "
            f"{cfg.hidden_size}"
        )
    if cfg.positions_per_side < 1:
        raise ConfigError(f"{where}: key 'vision_config.image_size' = {cfg.image_size} is below the patch size")
    # The published modules hard-code 2x2 groups: the downsample MLP's width is 4*D and the window merger's
    # follow-up halves target_sizes, whatever the kernel keys say.
    if cfg.merge_kernel != (2, 2):
        raise UnsupportedError(f"{where}: key 'merge_kernel_size' = {list(cfg.merge_kernel)}: only [2, 2] is built")
    if cfg.window_kernel != 2:
        raise UnsupportedError(
            f"{where}: key 'vision_config.window_kernel_size' = {cfg.window_kernel}: only [2, 2] is built"
        )
    if cfg.uses_window_merger and not 0 <= cfg.insert_layer_id < cfg.num_layers:
        raise ConfigError(
            f"{where}: key 'insert_layer_id' = {cfg.insert_layer_id} names no vision layer (0..{cfg.num_layers - 1}), "
            "and 16x mode needs the window merger"
        )
    return cfg


def _square(reader: ConfigReader, key: str, default: int) -> int:
    """An int, or an [h, w] pair of equal sides (image_size, patch_size, window_kernel_size may be either)."""
    value = reader.raw(key, default)
    if isinstance(value, list | tuple):
        sides = reader.int_list(key)
        if len(sides) != 2 or sides[0] != sides[1]:
            raise UnsupportedError(f"{reader.where(key)} = {list(value)}: only square sizes are built")
        value = sides[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{reader.where(key)} must be a positive integer, got {value!r}")
    return value


def _pair(reader: ConfigReader, key: str, default: tuple[int, int]) -> tuple[int, int]:
    value = reader.int_list(key, default)
    if len(value) != 2 or min(value) < 1:
        raise ConfigError(f"{reader.where(key)} must be two positive integers [h, w], got {list(value)}")
    return (value[0], value[1])


def tensor_name(canonical: str, param: str = "weight") -> str:
    """The checkpoint name of `canonical`'s `param` (weight or bias): `layers.3.fc1` ->
    `model.vision_tower.encoder.layers.3.mlp.fc1.weight`."""
    parts = canonical.split(".")
    index = next((p for p in parts if p.isdigit()), None)
    key = ".".join(("{i}" if parts[0] == "layers" else "{m}") if p.isdigit() else p for p in parts)
    if key not in TENSORS:
        raise TensorError(f"no MiniCPM-V vision tensor '{canonical}' in the name table")
    return f"{TENSORS[key].format(i=index, m=index)}.{param}"


def tensor_shape(cfg: MiniCPMVisionConfig, canonical: str, param: str = "weight") -> tuple[int, ...]:
    """The shape `canonical`'s `param` has under `cfg` (the published modules' shapes)."""
    d, i, p = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size
    wd, wi = d * cfg.window_kernel**2, i * cfg.window_kernel**2
    last = canonical.split(".")[-1]
    if canonical == "patch_embedding":
        return (d, cfg.num_channels, p, p) if param == "weight" else (d,)
    if canonical == "position_embedding":
        return (cfg.positions_per_side**2, d)
    if canonical.startswith("merger."):
        inner, out = cfg.merger_widths()[int(canonical.split(".")[1])]
        rows = {"pre_norm": (inner,), "linear_1": (inner, inner), "linear_2": (out, inner)}[last]
    else:
        matrices = {"fc1": (i, d), "fc2": (d, i), "linear_1": (wi, wd), "linear_2": (d, wi), "pre_norm": (wd,)}
        rows = matrices.get(last) or ((d, d) if last in LINEARS else (d,))
    return rows if param == "weight" or len(rows) == 1 else rows[:1]  # a bias has the output width


def canonical_names(cfg: MiniCPMVisionConfig) -> list[str]:
    """Every canonical tensor the tower `cfg` describes reads, in build order (4x never reads the window merger)."""
    names = ["patch_embedding", "position_embedding"]
    layer = ("layer_norm1", *LINEARS, "layer_norm2", "fc1", "fc2")
    names += [f"layers.{n}.{t}" for n in range(cfg.num_layers) for t in layer]
    if cfg.uses_window_merger:
        names += [f"window.{t}" for t in ("layer_norm1", *LINEARS, "pre_norm", "linear_1", "linear_2")]
    names.append("post_layernorm")
    names += [f"merger.{m}.{t}" for m in range(cfg.merger_times) for t in ("pre_norm", "linear_1", "linear_2")]
    return names


def tensor_params(canonical: str) -> tuple[str, ...]:
    """The parameters `canonical` holds."""
    return PARAMS.get(canonical, ("weight", "bias"))


def weight_table(cfg: MiniCPMVisionConfig) -> dict[str, str]:
    """`canonical.param` -> checkpoint name, a WeightSource's table (`layers.{i}.` rows kept as templates, merger
    rounds spelled out): what the export streams the tensors through."""
    table = {}
    for key, name in TENSORS.items():
        rounds = range(cfg.merger_times) if "{m}" in key else (None,)
        for m, param in ((m, p) for m in rounds for p in tensor_params(key)):
            canonical = key if m is None else key.format(m=m)
            table[f"{canonical}.{param}"] = f"{name.replace('{m}', str(m))}.{param}"
    return table


class MiniCPMVisionWeights:
    """Reads the vision tensors of one checkpoint by canonical name (`layers.3.fc1`, `merger.0.linear_1`), each
    shape-checked against the config, through a WeightSource over `weight_table` (the export's streaming one, or a
    plain one); a missing or misshaped tensor raises TensorError naming it."""

    def __init__(self, source: WeightSource, cfg: MiniCPMVisionConfig):
        self.source, self.cfg = source, cfg

    def get(self, canonical: str, param: str = "weight") -> WeightTensor:
        """Tensor `param` of `canonical` as stored, shape-checked."""
        return self.source.get(f"{canonical}.{param}", tensor_shape(self.cfg, canonical, param))

    def canonical_names(self) -> list[str]:
        return canonical_names(self.cfg)


def load_minicpm_vision(
    checkpoint: Checkpoint, downsample_mode: str | None = None
) -> tuple[MiniCPMVisionConfig, MiniCPMVisionWeights]:
    """(config, weights) of a MiniCPM-V 4.7 checkpoint's vision side; `downsample_mode` overrides the config's."""
    cfg = parse_minicpm_vision(checkpoint.config, str(checkpoint.config_path))
    if downsample_mode is not None:
        cfg = cfg.with_mode(downsample_mode)
    return cfg, MiniCPMVisionWeights(WeightSource(checkpoint, weight_table(cfg)), cfg)
