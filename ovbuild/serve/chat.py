"""Chat templates as Hugging Face tokenizers apply them: the checkpoint's Jinja template rendered in a sandbox.

The environment mirrors transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls, a `tojson`
that keeps non-ASCII, `raise_exception`, `strftime_now`), and the template sees `messages`, `add_generation_prompt`,
`tools`, the special tokens (`bos_token`, `eos_token`, ...) and any extra keyword (e.g. Qwen3's `enable_thinking`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ovbuild.errors import ConfigError, MissingDependencyError, RequestError
from ovbuild.ir import read_json

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str], origin: str = "chat template"):
        jinja2, sandbox = _jinja()
        env = sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(f"{origin}: the chat template does not parse (line {e.lineno}: {e.message})") from e
        self.special_tokens, self.origin, self.source = special_tokens, origin, source
        # the names the template reads from its context: a template that never reads `tools` cannot show them
        self.reads = frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))

    @property
    def renders_tools(self) -> bool:
        """Whether the template reads `tools` (Qwen's and most tool models' do; a plain transcript does not)."""
        return "tools" in self.reads

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate | None:
        """The folder's chat_template.jinja, else tokenizer_config.json's `chat_template` (the "default" one of a
        named list); None if it has neither."""
        folder = Path(folder)
        config_path = folder / "tokenizer_config.json"
        config = read_json(config_path) if config_path.exists() else {}
        special = {k: _token_text(config[k]) for k in _SPECIAL_TOKENS if _token_text(config.get(k))}
        jinja_path = folder / "chat_template.jinja"
        if jinja_path.exists():
            return cls(jinja_path.read_text(encoding="utf-8"), special, str(jinja_path))
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": ..., "template": ...}]: transformers picks "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str):
            return None
        return cls(source, special, f"{config_path} chat_template")

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]); the template's own complaints
        (raise_exception) and errors become RequestError."""
        jinja2, _ = _jinja()
        context = {**self.special_tokens, **kwargs}
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)
        except _TemplateRefusal as e:
            raise RequestError(f"the chat template refused the messages: {e}", "messages") from e
        except (jinja2.TemplateError, TypeError, ValueError) as e:
            raise RequestError(f"{self.origin}: cannot render the messages ({e})", "messages") from e


class _TemplateRefusal(Exception):
    """raise_exception() called by a template."""


def _raise_exception(message: str):
    raise _TemplateRefusal(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' tojson: non-ASCII kept, no HTML escaping (jinja2's own filter escapes <, >, &, ').
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _token_text(token) -> str | None:
    """A tokenizer_config token entry: a string, or an AddedToken dict {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) and token else None


def _jinja():
    try:
        import jinja2
        import jinja2.meta
        import jinja2.sandbox
    except ImportError as e:
        raise MissingDependencyError(
            "chat templates need jinja2: pip install 'ovbuild[serve]' (or jinja2 alone)"
        ) from e
    return jinja2, jinja2.sandbox
