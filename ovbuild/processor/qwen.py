"""The Qwen2-VL image processor (PIL variant) as Qwen3-VL and the Qwen3.5 family use it: `smart_resize` to a multiple
of patch_size * merge_size within [min_pixels, max_pixels], bicubic resize, rescale, normalise, repeat in time to
temporal_patch_size, flatten into patches in merge-window order; `image_grid_thw` and t*h*w / merge^2 image tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.errors import ConfigError, ImageError
from ovbuild.processor import config_file as cf
from ovbuild.processor.pixels import rescale_normalize, resize, to_chw
from ovbuild.processor.processed import ProcessedImage, content_hash, expand_image_tokens

if TYPE_CHECKING:
    from PIL import Image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200  # smart_resize refuses anything longer


@dataclass(frozen=True)
class QwenTokens:
    """The strings the chat template writes around an image and the one the processor repeats (Qwen3VLProcessor's
    defaults, unless the tokenizer declares others)."""

    image: str = "<|image_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"


@dataclass(frozen=True)
class QwenImageProcessor:
    """Settings of Qwen2VLImageProcessorPil; the defaults are its class defaults (what a key missing from the file
    means). Published Qwen3.5 checkpoints set patch 16, merge 2, temporal 2, pixels [65536, 16777216], mean/std 0.5."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # bicubic
    tokens: QwenTokens = QwenTokens()

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this: one merge window of patches."""
        return self.patch_size * self.merge_size

    def process(self, image: Image.Image) -> ProcessedImage:
        """An RGB Pillow image (see `decode_image`) -> pixel_values [patches, C*T*P*P], image_grid_thw, tokens."""
        height, width = smart_resize(image.height, image.width, self.factor, self.min_pixels, self.max_pixels)
        chw = to_chw(resize(image, height, width, self.resample))
        pixels = rescale_normalize(chw, self.rescale_factor, self.image_mean, self.image_std)
        patches = patchify(pixels, self.patch_size, self.merge_size, self.temporal_patch_size)
        grid = np.array([[1, height // self.patch_size, width // self.patch_size]], dtype=np.int64)
        num_tokens = int(grid.prod()) // self.merge_size**2
        return ProcessedImage(
            family="qwen3_vl",
            pixel_values=patches,
            grid=grid,
            slices=(0, 0),
            num_tokens=num_tokens,
            placeholder=self.tokens.image * num_tokens,
            content_hash=content_hash(self, [chw]),
        )

    def expand_prompt(self, prompt: str, images: list[ProcessedImage]) -> str:
        """A rendered prompt (one `<|vision_start|><|image_pad|><|vision_end|>` per image, as the chat template
        writes it) with each image's pad token repeated num_tokens times."""
        return expand_image_tokens(prompt, self.tokens.image, [im.placeholder for im in images])

    @classmethod
    def from_folder(cls, folder: Path) -> QwenImageProcessor:
        """Read preprocessor_config.json (or processor_config.json's `image_processor`) and tokenizer_config.json as
        published Qwen3-VL / Qwen3.5 checkpoints write them."""
        settings, path = cf.read_image_processor_settings(folder)
        return cls.from_settings(settings, path, cf.read_special_tokens(folder))

    @classmethod
    def from_settings(cls, settings: dict, path: Path, special: dict[str, str] | None = None) -> QwenImageProcessor:
        """The processor from a preprocessor config's keys (`path` names it in errors)."""
        cf.refuse_disabled_steps(settings, path)
        size = cf.value(settings, path, "size", dict, {"shortest_edge": cls.min_pixels, "longest_edge": cls.max_pixels})
        # Older files carry min_pixels / max_pixels, which transformers lets override size (as its __init__ does).
        size = {**size, **{k: settings[k] for k in ("min_pixels", "max_pixels") if settings.get(k) is not None}}
        low, high = size.get("min_pixels", size.get("shortest_edge")), size.get("max_pixels", size.get("longest_edge"))
        if not isinstance(low, int) or not isinstance(high, int) or not 0 < low <= high:
            raise ConfigError(f"{path}: size needs shortest_edge <= longest_edge (pixel counts), got {size}")
        special = special or {}
        defaults = QwenTokens()
        return cls(
            patch_size=cf.positive(settings, path, "patch_size", cls.patch_size),
            temporal_patch_size=cf.positive(settings, path, "temporal_patch_size", cls.temporal_patch_size),
            merge_size=cf.positive(settings, path, "merge_size", cls.merge_size),
            min_pixels=low,
            max_pixels=high,
            image_mean=cf.triple(settings, path, "image_mean", cls.image_mean),
            image_std=cf.triple(settings, path, "image_std", cls.image_std),
            rescale_factor=float(cf.value(settings, path, "rescale_factor", (int, float), cls.rescale_factor)),
            resample=cf.value(settings, path, "resample", int, cls.resample),
            tokens=QwenTokens(
                image=special.get("image_token", defaults.image),
                vision_start=special.get("vision_start_token", defaults.vision_start),
                vision_end=special.get("vision_end_token", defaults.vision_end),
            ),
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled into [min_pixels, max_pixels] keeping the aspect ratio
    (transformers' smart_resize, Python's round-half-to-even included)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(f"image of {width}x{height}: aspect ratio over {MAX_ASPECT_RATIO} (Qwen's resize refuses it)")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(pixels: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """[C, H, W] -> [patches, C * temporal * patch * patch]: patches ordered by merge window (row-major over windows,
    row-major within one), each patch's values ordered (channel, time, row, column); a still image repeats in time."""
    channels, height, width = pixels.shape
    grid_h, grid_w = height // patch, width // patch
    # [C, H, W] -> [C, gh/m, m, P, gw/m, m, P]
    x = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # -> [gh/m, gw/m, m, m, C, P, P]
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal, patch, patch))  # -> [..., C, T, P, P]
    return x.reshape(grid_h * grid_w, channels * temporal * patch * patch)  # -> [patches, C*T*P*P]
