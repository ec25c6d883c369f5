"""Image spans of a request, as the runtime receives them: embeddings already computed, never pixels.

A prompt that shows images holds, for each, a run of placeholder tokens; the language model reads the image's
embeddings at those rows instead of the placeholders' and turns them by three-axis positions (temporal, height,
width). `prompt_positions` lays the positions out as transformers' Qwen3.5 `get_rope_index` does; formulas and the
rules around them (prefix caching, drafts): docs/vision.md, "Image positions and the runtime".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ovbuild.errors import RequestError, UnsupportedError
from ovbuild.ir.ports import IMAGE_ROWS, MROPE_OFFSETS, PLACED_EMBEDS


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image of a prompt: its placeholder tokens start at `start`; `embeds` [t * h * w, hidden] f32 replace them
    row by row; `grid` (t, h, w) is its token grid after the vision tower's spatial merge; `content_hash` names the
    image (same pixels and processing, same hash), default a digest of the embeddings."""

    start: int
    embeds: np.ndarray
    grid: tuple[int, int, int]
    content_hash: str = field(default="")

    def __post_init__(self):
        embeds = np.ascontiguousarray(self.embeds, np.float32)
        object.__setattr__(self, "embeds", embeds)
        object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
        t, h, w = self.grid
        if embeds.ndim != 2 or min(self.grid) < 1 or embeds.shape[0] != t * h * w:
            shape = embeds.shape
            raise RequestError(f"image at token {self.start}: {shape} embeddings do not fill its grid {self.grid}")
        if not self.content_hash:
            object.__setattr__(self, "content_hash", hashlib.sha256(embeds.tobytes()).hexdigest())

    @property
    def end(self) -> int:
        """One past its last placeholder token."""
        return self.start + len(self.embeds)


def grid_positions(start: int, grid: tuple[int, int, int]) -> np.ndarray:
    """The positions [3, t * h * w] of an image whose first row sits at text position `start`: row-major over (t, h,
    w), each axis counting from `start` (transformers' get_vision_position_ids, time_interval 1)."""
    t, h, w = grid
    tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([tt.ravel(), hh.ravel(), ww.ravel()]).astype(np.int64) + start


def prompt_positions(prompt_len: int, images: list[ImageInput]) -> tuple[np.ndarray, int]:
    """Qwen3.5's three-axis positions [3, prompt_len] of a prompt showing `images`, and its rope delta: the offset
    every position after the prompt adds to its index on all three axes (max position + 1 - prompt_len)."""
    positions = np.zeros((3, prompt_len), np.int64)
    current, index = 0, 0  # the next text position; the next token not laid out
    for image in sorted(images, key=lambda i: i.start):
        if image.start < index or image.end > prompt_len:
            raise RequestError(f"image span [{image.start}, {image.end}) overlaps another or leaves the prompt")
        positions[:, index : image.start] = current + np.arange(image.start - index)  # text: one index, every axis
        current += image.start - index
        positions[:, image.start : image.end] = grid_positions(current, image.grid)
        current += max(image.grid[1], image.grid[2])  # transformers steps past the larger spatial side
        index = image.end
    positions[:, index:] = current + np.arange(prompt_len - index)
    delta = int(positions.max(initial=-1)) + 1 - prompt_len
    return positions, delta


@dataclass(frozen=True, eq=False)
class ImagePrompt:
    """A request's images and the three-axis positions of its prompt [3, P]; every token after the prompt takes its
    sequence index + delta on all three axes."""

    images: tuple[ImageInput, ...]
    positions: np.ndarray
    delta: int

    @classmethod
    def of(cls, prompt_len: int, images: list[ImageInput], positions: np.ndarray | None = None) -> ImagePrompt:
        """Qwen3.5's layout (prompt_positions), or `positions` [3, prompt_len] a processor computed (MiniCPM-V 4.7's
        canvas layout), whose delta is then max + 1 - prompt_len."""
        images = tuple(sorted(images, key=lambda i: i.start))
        if positions is None:
            positions, delta = prompt_positions(prompt_len, list(images))
        else:
            prompt_positions(prompt_len, list(images))  # the spans are checked alike
            positions = np.asarray(positions, np.int64)
            if positions.shape != (3, prompt_len):
                raise RequestError(f"positions of shape {positions.shape}: a prompt of {prompt_len} needs (3, P)")
            delta = int(positions.max(initial=-1)) + 1 - prompt_len
        return cls(images, positions, delta)

    def offsets(self, start: int, n: int) -> np.ndarray:
        """mrope_offsets [n, 3] of the tokens at sequence indices start .. start + n - 1."""
        index = np.arange(start, start + n)
        prompt_len = self.positions.shape[1]
        offsets = np.full((n, 3), self.delta, np.int64)
        inside = index < prompt_len
        offsets[inside] = (self.positions[:, index[inside]] - index[inside]).T
        return offsets

    def rows(self, start: int, n: int) -> tuple[list[int], list[np.ndarray]]:
        """The image rows among tokens start .. start + n - 1 (counted from start) and their embeddings."""
        rows, embeds = [], []
        for image in self.images:
            first, last = max(image.start, start), min(image.end, start + n)
            if first < last:
                rows += range(first - start, last - start)
                embeds.append(image.embeds[first - image.start : last - image.start])
        return rows, embeds

    def block_key(self, block: int, block_size: int) -> bytes:
        """What a prefix-cache block hash adds for block `block`: the content hash and grid of every image that
        overlaps it (as vLLM's MultiModalHasher), so that equal placeholder ids behind other images never match."""
        lo, hi = block * block_size, (block + 1) * block_size
        keys = [f"{i.content_hash}:{i.start}:{i.grid}" for i in self.images if i.start < hi and i.end > lo]
        return "|".join(keys).encode()


@dataclass
class ImageCall:
    """A target call's image inputs, gathered sequence by sequence in packing order."""

    width: int
    offsets: list[np.ndarray] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    embeds: list[np.ndarray] = field(default_factory=list)

    def add(self, images: ImagePrompt | None, start: int, n: int, begin: int) -> None:
        """The rows of a sequence whose tokens start .. start + n - 1 sit at packed rows begin .. begin + n - 1."""
        if images is None:
            self.offsets.append(np.zeros((n, 3), np.int64))
            return
        self.offsets.append(images.offsets(start, n))
        rows, embeds = images.rows(start, n)
        self.rows += [begin + r for r in rows]
        self.embeds += embeds

    def inputs(self) -> dict[str, np.ndarray]:
        return {
            MROPE_OFFSETS: np.concatenate(self.offsets) if self.offsets else np.zeros((0, 3), np.int64),
            IMAGE_ROWS: np.array(self.rows, np.int64),
            PLACED_EMBEDS: np.concatenate(self.embeds) if self.embeds else np.zeros((0, self.width), np.float32),
        }


def per_prompt(images, prompts: int, single: bool) -> list:
    """`images` as one entry (or None) per prompt: for one prompt it is that prompt's."""
    if images is None:
        return [None] * prompts
    entries = [images] if single else list(images)
    if len(entries) != prompts:
        raise RequestError(f"images for {len(entries)} prompts, {prompts} prompts given", "images")
    return entries


def needs_processing(entry) -> bool:
    """Whether a prompt's images entry holds image sources (paths, bytes, Pillow images) rather than embeddings."""
    return (
        entry is not None and not isinstance(entry, ImagePrompt) and not all(isinstance(i, ImageInput) for i in entry)
    )


def image_prompts(images, prompt_lens: list[int], single: bool) -> list[ImagePrompt | None]:
    """Each prompt's ImagePrompt from what a caller gave: None (text prompts); for one prompt its ImageInput list or
    an ImagePrompt; for several, one such entry (or None) per prompt."""
    entries = per_prompt(images, len(prompt_lens), single)
    out = []
    for entry, length in zip(entries, prompt_lens, strict=True):
        if entry is None or isinstance(entry, ImagePrompt):
            out.append(entry)
        elif all(isinstance(i, ImageInput) for i in entry):
            out.append(ImagePrompt.of(length, list(entry)) if entry else None)
        else:
            raise RequestError("images must be ImageInput lists or ImagePrompts, one per prompt", "images")
    return out


def check_images(images: ImagePrompt, prompt_len: int, width: int | None, what: str) -> None:
    """A request's images fit its prompt and a target that takes images of their width."""
    if width is None:
        raise UnsupportedError(f"{what} shows images, but this target takes no images (exported without them)")
    if images.positions.shape[1] != prompt_len:
        raise RequestError(f"{what}: positions for {images.positions.shape[1]} tokens, the prompt has {prompt_len}")
    for image in images.images:
        if image.embeds.shape[1] != width:
            raise RequestError(
                f"{what}: the image at token {image.start} has embeddings of width {image.embeds.shape[1]}, the "
                f"target's hidden size is {width}"
            )
