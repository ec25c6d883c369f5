"""`LLM`: the one-line Python API, in OpenVINO GenAI's shape (text in, text out), on the continuous-batching runtime.

llm = LLM("exported/target", "exported/draft")
llm.generate("def fib(n):", max_new_tokens=64)          # -> str
llm.generate(["def f():", "import os\\n"])              # -> [str, str], run as concurrent requests
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ovbuild.errors import ConfigError
from ovbuild.runtime.images import image_prompts
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
from ovbuild.runtime.prompts import PromptLimits, prompt_list
from ovbuild.runtime.request import GenerationConfig, Request
from ovbuild.runtime.streaming import stream_until_done

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
        (max_new_tokens=..., stop_strings=..., num_assistant_tokens=..., ignore_eos=True drops the EOS ids).
        `images`: what a prompt shows, as embeddings a vision tower made (`ovbuild.runtime.images.ImageInput`, one
        list for one prompt, one list or ImagePrompt per prompt for several); the prompt holds their placeholders."""
        items, single = prompt_list(prompts)
        configs = config if isinstance(config, list) else [config] * len(items)
        if len(configs) != len(items):
            raise ConfigError(f"LLM.generate: {len(configs)} configs for {len(items)} prompts")
        scheduler = self.pipeline.scheduler(use_draft=use_draft)
        index: dict[int, int] = {}
        encoded = [self.pipeline.encode(prompt) if isinstance(prompt, str) else prompt for prompt in items]
        shown = image_prompts(images, [len(ids) for ids in encoded], single)
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

    def request_config(self, config: GenerationConfig | None = None, **overrides) -> GenerationConfig:
        """`config` (default: the model's) with keyword overrides; ignore_eos=True clears the EOS ids."""
        config = config or self.config
        if overrides.pop("ignore_eos", False):
            overrides["eos_token_ids"] = ()
        if "stop_strings" in overrides:
            overrides["stop_strings"] = tuple(overrides["stop_strings"])
        try:
            return dataclasses.replace(config, **overrides)
        except TypeError as e:
            known = ", ".join(f.name for f in dataclasses.fields(GenerationConfig))
            raise ConfigError(f"unknown generation option ({e}); known: {known}, ignore_eos") from e
