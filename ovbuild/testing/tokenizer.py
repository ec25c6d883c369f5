"""A byte-level tokenizer built with `tokenizers`: every byte is a token, plus end-of-text and mask tokens."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS_TOKEN, MASK_TOKEN = "<|endoftext|>", "<|mask|>"
EOS_ID, MASK_ID = 256, 257

# A ChatML template in the shape of Qwen's (its markers are plain text to this byte-level tokenizer), so chat
# requests run on the tiny target; it refuses unknown roles through raise_exception as real templates do. As Qwen3's,
# it lists `tools` in a system turn, renders an assistant's tool_calls as <tool_call> blocks (arguments as a JSON
# string or an object) and a tool message as a <tool_response> in a user turn.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{- \'\\n</tools>\\nCall one as <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role: ' + message.role) }}"
    "{%- endif %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set args = call.function.arguments %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{- (args if args is string else args | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen's vision markers, ids 258..261 after the two above (the tiny vision-language configs' image_token_id etc.)
QWEN_VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


def byte_level_tokenizer(extra: tuple[str, ...] = ()) -> Tokenizer:
    """256 byte tokens (ids 0..255) and two special tokens, then `extra` special tokens; no merges, so it is tiny and
    deterministic."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN, MASK_TOKEN])
    assert tok.token_to_id(EOS_TOKEN) == EOS_ID and tok.token_to_id(MASK_TOKEN) == MASK_ID
    if extra:
        tok.add_special_tokens(list(extra))
    return tok


def write_tokenizer(folder: Path, extra: tuple[str, ...] = ()) -> None:
    """tokenizer.json and a minimal tokenizer_config.json with a chat template, as Hugging Face checkpoints have;
    `extra`: more special tokens (a vision-language model's markers)."""
    byte_level_tokenizer(extra).save(str(folder / "tokenizer.json"))
    config = {
        "eos_token": EOS_TOKEN,
        "bos_token": None,
        "pad_token": EOS_TOKEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _byte_of(char: str) -> int:
    """The byte that ByteLevel's printable alphabet maps to `char` (GPT-2's bytes_to_unicode, inverted)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if ord(char) in printable:
        return ord(char)
    missing = [b for b in range(256) if b not in printable]
    return missing[ord(char) - 256]
