"""`LLM`: the one-line Python API, in OpenVINO GenAI's shape (text in, text out), on the continuous-batching runtime.

llm = LLM("exported/target", "exported/draft")
llm.generate("def fib(n):", max_new_tokens=64)          # -> str
llm.generate(["def f():", "import os\\n"])              # -> [str, str], run as concurrent requests
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ovbuild.errors import ConfigError, RequestError, UnsupportedError
from ovbuild.processor import MiniCPMVImageProcessor, QwenImageProcessor, decode_image
from ovbuild.runtime.canvas_positions import CanvasMarkers, canvas_positions
from ovbuild.runtime.images import ImageInput, ImagePrompt, image_prompts, needs_processing, per_prompt
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
from ovbuild.runtime.prompts import PromptLimits, prompt_list
from ovbuild.runtime.request import GenerationConfig, Request
from ovbuild.runtime.streaming import stream_until_done
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.runtime.vision.encoder import VisionEncoder

QWEN_TOWER, MINICPM_TOWER = "qwen3_5_vision", "minicpmv4_7_vision"
# Each vision tower family's image processor (a tower's VisionIR names its family).
PROCESSORS = {QWEN_TOWER: QwenImageProcessor, MINICPM_TOWER: MiniCPMVImageProcessor}
# streamer(text) for one prompt, streamer(index, text) for a list; returning True stops that request.
Streamer = Callable[..., bool | None]


class LLM:
    """Exported target (and optional draft) folders, compiled once; `generate` serves prompts concurrently."""

    def __init__(
        self,
        target_dir: str | Path,
        draft_dir: str | Path | None = None,
        options: RuntimeOptions | None = None,
        **option_fields,
    ):
        """`option_fields` are RuntimeOptions fields (device="GPU", max_num_batched_tokens=..., target=ModelOptions)."""
        if options is None:
            try:
                options = RuntimeOptions(**option_fields)
            except TypeError as e:
                known = ", ".join(f.name for f in dataclasses.fields(RuntimeOptions))
                raise ConfigError(f"LLM: unknown runtime option ({e}); known: {known}") from e
        elif option_fields:
            raise ConfigError("LLM: pass either options= or runtime option keywords, not both")
        self.pipeline = Pipeline(target_dir, draft_dir, options)
        self.target_dir, self.device = Path(target_dir), options.device
        self._prompter: ImagePrompter | None = None
        self.limits = PromptLimits.from_pipeline(self.pipeline)
        self.config = GenerationConfig(eos_token_ids=self.pipeline.eos_token_ids)  # the model's defaults

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        config: GenerationConfig | list[GenerationConfig] | None = None,
        streamer: Streamer | None = None,
        use_draft: bool = True,
        images=None,
        **overrides,
    ) -> str | list[str]:
        """Text of each prompt's completion: one str for one prompt (a str or a list of token ids), else a list.

        `config` (one, or one per prompt) defaults to `self.config`; keywords override its fields
        (max_new_tokens=..., stop_strings=..., num_assistant_tokens=..., ignore_eos=True drops the EOS ids,
        response_format=... as OpenAI's dict or a pydantic model class, constraint=Constraint(...), logit_bias=...).
        `images`: what a prompt shows: image sources (paths, bytes, data URLs, Pillow images) for a text prompt,
        processed and encoded by the target folder's processor and vision tower; or embeddings a tower made
        (`ovbuild.runtime.images.ImageInput`s) for a prompt that holds their placeholders. One list for one prompt;
        for several, one list (or ImagePrompt, or None) per prompt."""
        items, single = prompt_list(prompts)
        configs = config if isinstance(config, list) else [config] * len(items)
        if len(configs) != len(items):
            raise ConfigError(f"LLM.generate: {len(configs)} configs for {len(items)} prompts")
        scheduler = self.pipeline.scheduler(use_draft=use_draft)
        index: dict[int, int] = {}
        encoded, entries = [], per_prompt(images, len(items), single)
        for i, (prompt, entry) in enumerate(zip(items, entries, strict=True)):
            if needs_processing(entry):
                if not isinstance(prompt, str):
                    raise RequestError(f"prompt {i + 1}: image files go with a text prompt", "images")
                prompt, entries[i] = self.image_prompter().prompt(prompt, list(entry))
            encoded.append(self.pipeline.encode(prompt) if isinstance(prompt, str) else prompt)
        shown = image_prompts(entries, [len(ids) for ids in encoded], False)
        for i, (ids, cfg, pictures) in enumerate(zip(encoded, configs, shown, strict=True)):
            cfg = self.request_config(cfg, **overrides)
            self.limits.check_ids(ids)
            self.limits.max_new_tokens(len(ids), cfg.max_new_tokens, cfg.max_new_tokens)
            index[scheduler.add_request(ids, cfg, images=pictures).id] = i

        def on_text(request: Request, text: str, finished: bool) -> bool | None:
            if streamer is None or not text:
                return None
            return streamer(text) if single else streamer(index[request.id], text)

        stream_until_done(scheduler, on_text, self.pipeline.decode)
        texts = [r.text for r in sorted(scheduler.finished, key=lambda r: index[r.id])]
        return texts[0] if single else texts

    def image_prompter(self) -> ImagePrompter:
        """The target folder's image processor and vision tower (compiled on first use)."""
        if self._prompter is None:
            self._prompter = ImagePrompter(self.target_dir, self.pipeline.tokenizer, self.device)
        return self._prompter

    def request_config(self, config: GenerationConfig | None = None, **overrides) -> GenerationConfig:
        """`config` (default: the model's) with keyword overrides; ignore_eos=True clears the EOS ids."""
        config = config or self.config
        if overrides.pop("ignore_eos", False):
            overrides["eos_token_ids"] = ()
        if "stop_strings" in overrides:
            overrides["stop_strings"] = tuple(overrides["stop_strings"])
        if "response_format" in overrides:  # OpenAI's spelling of a constraint (runtime/structured/spec.py)
            overrides["constraint"] = Constraint.from_response_format(overrides.pop("response_format"))
        try:
            return dataclasses.replace(config, **overrides)
        except TypeError as e:
            known = ", ".join(f.name for f in dataclasses.fields(GenerationConfig))
            raise ConfigError(f"unknown generation option ({e}); known: {known}, ignore_eos") from e


class ImagePrompter:
    """Text prompts that show images: each image decoded and processed as the target's processor does
    (preprocessor_config.json in its folder), encoded by its vision tower, and placed at its placeholder tokens, with
    the three-axis positions of its family's layout (Qwen3.5's, or MiniCPM-V 4.7's canvas)."""

    def __init__(self, folder: Path, tokenizer, device: str = "CPU"):
        self.encoder, self.tokenizer = VisionEncoder(folder, device), tokenizer
        family = self.encoder.record.family
        if family not in PROCESSORS:
            raise UnsupportedError(
                f"{folder}: no image processor for a {family} tower (known: {', '.join(PROCESSORS)})"
            )
        self.processor = PROCESSORS[family].from_folder(folder)
        self.canvas = family == MINICPM_TOWER
        self.image_id = self.token_id(self.processor.tokens.image, folder)
        if self.canvas:
            t = self.processor.tokens
            newline = tokenizer.encode("\n", add_special_tokens=False).ids
            if len(newline) != 1:
                raise UnsupportedError(f"{folder}: the tokenizer writes a newline as {len(newline)} tokens, not one")
            marks = (t.slice_start, t.slice_end, t.image_start, t.image_end)
            self.markers = CanvasMarkers(*(self.token_id(m, folder) for m in marks), newline[0])

    def token_id(self, token: str, folder: Path) -> int:
        """The id of a special token of the processor's; an error naming it when the tokenizer lacks it."""
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise UnsupportedError(f"{folder}: the tokenizer has no {token} token")
        return found

    def placeholder(self) -> str:
        """One image's placeholder as the chat templates write it: Qwen's image token between its vision markers,
        MiniCPM-V's image token alone (its processor writes the markers)."""
        tokens = self.processor.tokens
        return tokens.image if self.canvas else tokens.vision_start + tokens.image + tokens.vision_end

    def with_placeholders(self, text: str, count: int) -> str:
        """`text` as it is when it holds image tokens, else with `count` images' placeholders before it."""
        return text if self.processor.tokens.image in text else self.placeholder() * count + text

    def prompt(self, text: str, sources: list) -> tuple[list[int], ImagePrompt]:
        """Token ids of `text` with its images' placeholder runs, and its ImagePrompt. A text without the image
        token gets the images first (as the chat templates render a message's images before its text)."""
        processed = [self.processor.process(decode_image(source)) for source in sources]
        ids = self.expand(self.with_placeholders(text, len(processed)), processed)
        return ids, self.place(ids, processed)

    def expand(self, text: str, processed: list) -> list[int]:
        """Token ids of a text holding one image token per processed image, each expanded into its placeholder run
        (a RequestError when the counts differ)."""
        return self.tokenizer.encode(self.processor.expand_prompt(text, processed), add_special_tokens=False).ids

    def place(self, ids: list[int], processed: list, embeds: list[np.ndarray] | None = None) -> ImagePrompt:
        """Encode each processed image (the tower runs once per image not in the encoder's cache; `embeds`: rows
        encoded already, one array per image) and place its rows at its placeholder runs in `ids`."""
        runs = [i for i, t in enumerate(ids) if t == self.image_id and (i == 0 or ids[i - 1] != self.image_id)]
        crops = sum(len(image.grid) for image in processed)  # a Qwen image is one run, a MiniCPM-V crop is one
        if len(runs) != crops:
            raise RequestError(
                f"the prompt's image tokens form {len(runs)} run(s) for {crops} image crop(s): images whose "
                f"placeholders touch cannot be told apart (put text or markers between them)",
                "messages",
            )
        if embeds is None:
            embeds = self.encoder.encode(
                [(p.pixel_values, p.grid) for p in processed], [p.content_hash for p in processed]
            )
        if self.canvas:
            return self.canvas_prompt(ids, runs, processed, embeds)
        merge, images = math.isqrt(self.encoder.record.patches_per_token), []  # the merge window's side
        for start, image, rows in zip(runs, processed, embeds, strict=True):
            t, h, w = (int(g) for g in image.grid[0])
            images.append(ImageInput(start, rows, (t, h // merge, w // merge), image.content_hash))
        return ImagePrompt.of(len(ids), images)

    def canvas_prompt(self, ids: list[int], runs: list[int], processed: list, embeds: list) -> ImagePrompt:
        """MiniCPM-V 4.7: every crop (an image's overview and each slice) is a run of its own between markers, so
        each becomes an ImageInput of its rows; the positions are the canvas layout of the whole prompt."""
        types = [int(t == self.image_id) for t in ids]
        sizes = [(int(h), int(w)) for image in processed for h, w in image.grid]
        merge = math.isqrt(self.encoder.record.patches_per_token)
        positions, _ = canvas_positions(ids, types, sizes, self.markers, merge)
        images, crop = [], 0
        for image, rows in zip(processed, embeds, strict=True):
            counts = [int(h * w) // merge**2 for h, w in image.grid]
            for k, piece in enumerate(np.split(rows, np.cumsum(counts)[:-1])):
                images.append(ImageInput(runs[crop], piece, (1, 1, len(piece)), f"{image.content_hash}:{k}"))
                crop += 1
        return ImagePrompt.of(len(ids), images, positions)
