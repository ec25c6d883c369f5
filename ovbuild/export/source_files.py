"""The files an export copies next to the IRs, checked before anything is built: what a runtime will read from the
exported folder must load there, so a bad file is refused now, in one line, rather than when generating."""

from __future__ import annotations

from pathlib import Path

from ovbuild.errors import CheckpointError, ConfigError
from ovbuild.ir import read_json
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader

TOKEN_KEYS = ("eos_token", "bos_token", "pad_token", "unk_token")


def check_copied_files(ckpt: Checkpoint, names: tuple[str, ...]) -> None:
    """Every file of `names` the checkpoint has is a regular file inside it (symlinks leading out are refused), and
    generation_config.json is a JSON object whose eos_token_id is a token id or a list of them."""
    for name in names:
        ckpt.own_file(name)
    path = ckpt.own_file("generation_config.json")
    if path is not None:
        ConfigReader(read_json(path), str(path)).int_list("eos_token_id", ())


def check_target_tokenizer(ckpt: Checkpoint) -> None:
    """tokenizer.json loads with the `tokenizers` library (as `ovbuild generate` loads it), and tokenizer_config.json
    and chat_template.jinja, when present, hold what ovbuild reads from them."""
    path = ckpt.own_file("tokenizer.json")
    if path is None:
        raise CheckpointError(
            f"{ckpt.folder}: no tokenizer.json (a target is exported with its tokenizer, which runtimes read)"
        )
    load_tokenizer(path)
    config_path = ckpt.own_file("tokenizer_config.json")
    if config_path is not None:
        check_tokenizer_config(read_json(config_path), config_path)
    template = ckpt.own_file("chat_template.jinja")
    if template is not None:
        try:
            template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{template}: not a UTF-8 text file ({e})") from e


def load_tokenizer(path: Path):
    """A `tokenizers.Tokenizer` from tokenizer.json; whatever the library fails with becomes one CheckpointError."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception for a malformed file
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: cannot be loaded as a tokenizer ({reason[:120]})") from e


def check_tokenizer_config(config: dict, path: Path) -> None:
    """Special tokens are a string or {"content": string}; a chat_template is a string or a list of named ones."""
    for key in TOKEN_KEYS:
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if token is not None and not isinstance(token, str):
            raise ConfigError(f"{path}: key '{key}' must be a token string or {{\"content\": string}}, got {token!r}")
    template = config.get("chat_template")
    named = isinstance(template, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in template
    )
    if template is not None and not isinstance(template, str) and not named:
        raise ConfigError(f"{path}: key 'chat_template' must be a string or a list of {{name, template}} objects")
