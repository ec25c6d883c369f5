"""The MiniCPM-V 4.7 image processor (transformers maps it to MiniCPMV4_6ImageProcessorPil) and its placeholder text
(MiniCPMV4_7Processor.replace_image_token): an overview of the whole image, then, when the image is large, a grid of
equal slices of a refined resize; each crop normalised and packed patch by patch into one strip."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.errors import ConfigError
from ovbuild.processor import config_file as cf
from ovbuild.processor.minicpmv_slices import find_best_resize, refine_size, slice_grid
from ovbuild.processor.pixels import rescale_normalize, resize, to_chw
from ovbuild.processor.processed import ProcessedImage, content_hash, expand_image_tokens

if TYPE_CHECKING:
    from PIL import Image

IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
# downsample_mode -> patches per image token: "16x" merges 4x4 patches into one token, "4x" keeps 2x2.
TOKEN_DIVISOR = {"16x": 16, "4x": 4}


@dataclass(frozen=True)
class MiniCPMVTokens:
    """The marker strings around an image and its slices, and the repeated image token, as MiniCPM-V 4.6 / 4.7
    tokenizers (Qwen3.5's vocabulary) declare them in `extra_special_tokens`; a tokenizer_config.json naming others
    wins."""

    image: str = "<|image_pad|>"
    image_start: str = "<image>"
    image_end: str = "</image>"
    slice_start: str = "<slice>"
    slice_end: str = "</slice>"
    image_id_start: str = "<image_id>"
    image_id_end: str = "</image_id>"


@dataclass(frozen=True)
class MiniCPMVImageProcessor:
    """Settings of MiniCPMV4_6ImageProcessorPil; the defaults are its class defaults, which published MiniCPM-V 4.6
    preprocessor_config.json files repeat (9 slices, 448, patch 14, slice mode, image ids, mean/std 0.5)."""

    max_slice_nums: int = 9
    scale_resolution: int = 448
    patch_size: int = 14
    slice_mode: bool = True
    downsample_mode: str = "16x"
    use_image_id: bool = True
    image_mean: tuple[float, float, float] = IMAGENET_STANDARD_MEAN
    image_std: tuple[float, float, float] = IMAGENET_STANDARD_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # bicubic
    tokens: MiniCPMVTokens = MiniCPMVTokens()

    def process(self, image: Image.Image) -> ProcessedImage:
        """An RGB Pillow image -> pixel_values [1, C, P, patches * P], target_sizes [crops, 2], tokens."""
        size = (image.height, image.width)
        grid = slice_grid(size, self.max_slice_nums, self.scale_resolution) if self.slice_mode else None
        height, width = find_best_resize(size, self.scale_resolution, self.patch_size, allow_upscale=grid is None)
        overview = to_chw(resize(image, height, width, self.resample))
        crops, resized = [overview], [overview]
        if grid is not None:
            rows, cols = grid
            refine_h, refine_w = refine_size(size, grid, self.scale_resolution, self.patch_size)
            refined = to_chw(resize(image, refine_h, refine_w, self.resample))
            resized.append(refined)
            slice_h, slice_w = refine_h // rows, refine_w // cols
            crops += [  # row-major, as divide_to_patches cuts
                refined[:, r * slice_h : (r + 1) * slice_h, c * slice_w : (c + 1) * slice_w]
                for r in range(rows)
                for c in range(cols)
            ]
        pixel_values = np.concatenate([self.pack(crop) for crop in crops], axis=-1)[None]  # [1, C, P, patches * P]
        target_sizes = np.array([(c.shape[1] // self.patch_size, c.shape[2] // self.patch_size) for c in crops])
        target_sizes = target_sizes.astype(np.int32)  # [crops, 2]: (h, w) in patches
        tokens_per_crop = [int(h * w) // TOKEN_DIVISOR[self.downsample_mode] for h, w in target_sizes]
        return ProcessedImage(
            family="minicpmv",
            pixel_values=pixel_values,
            grid=target_sizes,
            slices=grid or (0, 0),
            num_tokens=count_tokens(tokens_per_crop, grid),
            placeholder=self.placeholder_text(tokens_per_crop, grid),
            content_hash=content_hash(self, resized),
        )

    def pack(self, crop: np.ndarray) -> np.ndarray:
        """uint8 crop [C, H, W] -> normalised strip [C, P, (H/P)*(W/P)*P]: its patches side by side, row-major."""
        x = rescale_normalize(crop, self.rescale_factor, self.image_mean, self.image_std)
        channels, height, width = x.shape
        p = self.patch_size
        x = x.reshape(channels, height // p, p, width // p, p)  # [C, H, W] -> [C, H/P, P, W/P, P]
        x = x.transpose(0, 2, 1, 3, 4)  # -> [C, P, H/P, W/P, P]
        return x.reshape(channels, p, -1)  # -> [C, P, (H/P)*(W/P)*P]

    def placeholder_text(self, tokens_per_crop: list[int], grid: tuple[int, int] | None) -> str:
        """`<image>` + overview tokens + `</image>`, then the slices' rows (`<slice>` + tokens + `</slice>` per slice)
        joined by newlines."""
        t = self.tokens
        text = t.image_start + t.image * tokens_per_crop[0] + t.image_end
        if self.slice_mode and grid is not None:
            rows, cols = grid
            one = t.slice_start + t.image * tokens_per_crop[1] + t.slice_end
            text += "\n".join(one * cols for _ in range(rows))
        return text

    def expand_prompt(self, prompt: str, images: list[ProcessedImage]) -> str:
        """A rendered prompt with one image token per image -> each replaced by its placeholder text, preceded by
        `<image_id>k</image_id>` (k counting the prompt's images from 0) when use_image_id is set."""
        t = self.tokens
        ids = [f"{t.image_id_start}{k}{t.image_id_end}" if self.use_image_id else "" for k in range(len(images))]
        return expand_image_tokens(prompt, t.image, [i + im.placeholder for i, im in zip(ids, images, strict=True)])

    @classmethod
    def from_folder(cls, folder: Path) -> MiniCPMVImageProcessor:
        """Read preprocessor_config.json (or processor_config.json's `image_processor`) and tokenizer_config.json."""
        settings, path = cf.read_image_processor_settings(folder)
        return cls.from_settings(settings, path, cf.read_special_tokens(folder))

    @classmethod
    def from_settings(cls, settings: dict, path: Path, special: dict[str, str] | None = None) -> MiniCPMVImageProcessor:
        """The processor from a preprocessor config's keys (`path` names it in errors)."""
        cf.refuse_disabled_steps(settings, path)
        mode = cf.value(settings, path, "downsample_mode", str, cls.downsample_mode)
        if mode not in TOKEN_DIVISOR:
            raise ConfigError(f"{path}: downsample_mode must be one of {sorted(TOKEN_DIVISOR)}, got {mode!r}")
        special = special or {}
        d = MiniCPMVTokens()
        tokens = MiniCPMVTokens(**{f: special.get(f"{f}_token", getattr(d, f)) for f in d.__dataclass_fields__})
        return cls(
            max_slice_nums=cf.positive(settings, path, "max_slice_nums", cls.max_slice_nums),
            scale_resolution=cf.positive(settings, path, "scale_resolution", cls.scale_resolution),
            patch_size=cf.positive(settings, path, "patch_size", cls.patch_size),
            slice_mode=cf.value(settings, path, "slice_mode", bool, cls.slice_mode),
            downsample_mode=mode,
            use_image_id=cf.value(settings, path, "use_image_id", bool, cls.use_image_id),
            image_mean=cf.triple(settings, path, "image_mean", cls.image_mean),
            image_std=cf.triple(settings, path, "image_std", cls.image_std),
            rescale_factor=float(cf.value(settings, path, "rescale_factor", (int, float), cls.rescale_factor)),
            resample=cf.value(settings, path, "resample", int, cls.resample),
            tokens=tokens,
        )


def count_tokens(tokens_per_crop: list[int], grid: tuple[int, int] | None) -> int:
    """Image tokens in the placeholder: the overview's, then every slice's (all slices are the same size)."""
    return tokens_per_crop[0] + (grid[0] * grid[1] * tokens_per_crop[1] if grid is not None else 0)
