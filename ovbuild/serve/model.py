"""What the endpoints know of the served model besides the engine: its names, tokenizer, chat template, limits and
defaults, and the model card and tokenizer description clients read."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ovbuild.ir import read_json
from ovbuild.runtime.prompts import PromptLimits
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.errors import ModelNotFoundError
from ovbuild.serve.tools import DEFAULT_FORMAT as DEFAULT_TOOL_FORMAT

if TYPE_CHECKING:
    from ovbuild.serve.images import ServedImages

# tokenizer_config.json keys /tokenizer_info leaves out: the added-token table is tokenizer.json's business.
_TOKENIZER_INFO_SKIPPED = ("added_tokens_decoder",)


def model_name(name: str) -> str:
    """A model name as the server compares it: a path-like name normalised (`./exported/target/` and
    `exported/target` are one model), surrounding blanks dropped."""
    name = name.strip()
    return os.path.normpath(name) if name else name


@dataclass
class ServedModel:
    """The served model's names (the first is its own, the others aliases), tokenizer, template, limits, defaults."""

    names: tuple[str, ...]
    encode: Callable[[str], list[int]]
    base_config: GenerationConfig
    limits: PromptLimits
    chat_template: ChatTemplate | None = None
    default_max_tokens: int = 256  # chat requests without max_tokens (completions default to 16, as OpenAI's)
    decode: Callable[[list[int]], str] | None = None  # token ids -> text (echoed prompts, logprobs' tokens)
    tokenizer_config: dict = field(default_factory=dict)  # the target's tokenizer_config.json
    root: str = ""  # the exported target folder
    created: int = field(default_factory=lambda: int(time.time()))  # when the server loaded it
    spec_decode_stats: str = "none"  # per-choice speculative decoding stats: none, summary or detailed
    tokenizer: object | None = None  # the target's `tokenizers.Tokenizer` (/tokenize with special tokens)
    grammars: Grammars | None = None  # the model's grammar compiler (structured output, forced tool calls)
    vocab_size: int | None = None  # the model's vocabulary (logit_bias ids are checked against it)
    reasoning_parser: str | None = None  # a key of ovbuild.serve.reasoning.FORMATS, or None: no reasoning split
    tool_call_parser: str = DEFAULT_TOOL_FORMAT  # a key of ovbuild.serve.tools.FORMATS
    images: ServedImages | None = None  # the target's image side (processor, vision tower); None: text only

    def __post_init__(self):
        self.names = tuple(dict.fromkeys(model_name(n) for n in self.names))

    @property
    def name(self) -> str:
        return self.names[0]

    def resolve(self, requested: str | None) -> str:
        """The served name a request's `model` field means (None: the model's own); ModelNotFoundError if none."""
        if requested is None:
            return self.name
        name = model_name(requested)
        if name not in self.names:
            served = ", ".join(f"'{n}'" for n in self.names)
            raise ModelNotFoundError(f"the model '{requested}' does not exist (this server serves {served})", "model")
        return name

    def token_text(self, token: int) -> str:
        """One token's text, as the logprobs show it."""
        return self.decode([token]) if self.decode is not None else str(token)

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`, with the tokenizer's special tokens around it when asked (/tokenize)."""
        if add_special_tokens and self.tokenizer is not None:
            return self.tokenizer.encode(text, add_special_tokens=True).ids
        return self.encode(text)

    def detokenize(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included (/detokenize gives back what /tokenize took)."""
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.decode(ids) if self.decode is not None else ""

    def card(self, name: str) -> dict:
        """The model object of /v1/models, with vLLM's `root`, `parent` and `max_model_len`."""
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "ovbuild",
            "root": self.root,
            "parent": None,
            "max_model_len": self.limits.context_length,
        }

    def tokenizer_info(self) -> dict:
        """/tokenizer_info as vLLM answers it: the tokenizer_config.json entries, `tokenizer_class` and the chat
        template as text."""
        info = {k: v for k, v in self.tokenizer_config.items() if k not in _TOKENIZER_INFO_SKIPPED}
        info.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        info["chat_template"] = self.chat_template.source if self.chat_template is not None else None
        info["model_max_length"] = self.limits.context_length
        return info

    @classmethod
    def from_folder(
        cls,
        names: str | Sequence[str],
        target_dir: str | Path,
        pipeline,
        default_max_tokens: int = 256,
        spec_decode_stats: str = "none",
        **parsers,
    ) -> ServedModel:
        """parsers: reasoning_parser, tool_call_parser."""
        config_path = Path(target_dir) / "tokenizer_config.json"
        return cls(
            (names,) if isinstance(names, str) else tuple(names),
            pipeline.encode,
            GenerationConfig(eos_token_ids=pipeline.eos_token_ids),
            PromptLimits.from_pipeline(pipeline),
            ChatTemplate.from_folder(target_dir),
            default_max_tokens,
            pipeline.decode,
            read_json(config_path) if config_path.exists() else {},
            str(target_dir),
            spec_decode_stats=spec_decode_stats,
            tokenizer=pipeline.tokenizer,
            grammars=pipeline.grammars,
            vocab_size=pipeline.target.vocab_size,
            **parsers,
        )
