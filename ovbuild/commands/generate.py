"""`ovbuild generate`: run prompts as concurrent requests on an exported target, with or without a draft."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ovbuild.commands.options import (
    add_runtime_arguments,
    add_sampling_arguments,
    check_runtime_arguments,
    runtime_options,
    sampling_options,
)
from ovbuild.errors import ConfigError, RequestError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding (continuous batching)",
        description="Run prompts as concurrent requests on an exported target, with a draft "
        "(speculative decoding) or without (the target alone). Greedy by default, or sampling (--do-sample); "
        "lossless either way (in distribution when sampling).",
    )
    p.add_argument("--target", required=True, help="exported target folder")
    p.add_argument("--draft", help="exported draft folder (omit to run the target alone)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for concurrent requests)")
    p.add_argument(
        "--prompt-file",
        action="append",
        default=[],
        help="a file holding one prompt, or a JSON list of prompts (.json)",
    )
    p.add_argument(
        "--prompt-ids",
        action="append",
        default=[],
        help="a tokenized prompt as comma-separated token ids, e.g. 785,3974,13876 (repeatable)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send each text prompt as a user message through the target's chat template",
    )
    add_runtime_arguments(p)
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image the prompt shows (repeatable; one text prompt): processed and encoded by the target folder's "
        "vision tower, placed at the prompt's image tokens, or before its text when it has none",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--num-assistant-tokens",
        type=int,
        help="draft tokens verified per step (default: chosen per request and step from call costs and acceptance)",
    )
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    add_sampling_arguments(p)
    constrained = p.add_mutually_exclusive_group()
    constrained.add_argument("--json-schema", metavar="FILE", help="the output is JSON valid under this JSON schema")
    constrained.add_argument("--regex", help="the output matches this regular expression")
    p.add_argument("--json", dest="json_path", help="write prompts, tokens, text and metrics to this file")
    p.add_argument("--trace", action="store_true", help="record every speculative step in the --json output")
    p.set_defaults(run=run)


def read_prompts(args: argparse.Namespace) -> list[str | list[int]]:
    """Text prompts (--prompt, --prompt-file, each checked to be UTF-8) then token-id prompts (--prompt-ids)."""
    from ovbuild.runtime.validation import check_utf8

    prompts: list[str | list[int]] = list(args.prompt)
    for i, prompt in enumerate(prompts):
        check_utf8(prompt, f"--prompt {i + 1}")
    for file in args.prompt_file:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read prompt file ({e.strerror})") from e
        except UnicodeDecodeError as e:
            raise RequestError(
                f"{path}: prompt file is not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"
            ) from None
        if path.suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: not valid JSON ({e})") from e
            if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
                raise ConfigError(f"{path}: expected a JSON list of prompt strings")
            for i, prompt in enumerate(data):
                check_utf8(prompt, f"{path}: prompt {i + 1}")
            prompts += data
        else:
            prompts.append(text)
    prompts += [_parse_ids(value) for value in args.prompt_ids]
    if not prompts:
        raise ConfigError("no prompt given (use --prompt, --prompt-file or --prompt-ids)")
    return prompts


def _parse_ids(value: str) -> list[int]:
    try:
        ids = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise ConfigError(f"--prompt-ids {value!r}: expected comma-separated integers") from e
    if not ids:
        raise ConfigError("--prompt-ids: empty")
    return ids


def prompt_token_ids(
    pipeline, prompts: list[str | list[int]], target: str, chat: bool, max_new_tokens: int
) -> list[list[int]]:
    """Token ids of every prompt, text prompts rendered through the chat template first with --chat; each checked
    against the target's vocabulary and context length before the first is queued."""
    from ovbuild.runtime.validation import check_prompt

    template = chat_template(target) if chat else None
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            text = template.render([{"role": "user", "content": prompt}]) if template else prompt
            prompt = pipeline.encode(text, f"prompt {i + 1}")
        ids = np.asarray(prompt, np.int64)
        check_prompt(ids, max_new_tokens, pipeline.target.vocab_size, pipeline.max_model_len, f"prompt {i + 1}")
        out.append(prompt)
    return out


def output_constraint(args: argparse.Namespace):
    """The --json-schema or --regex constraint (None without either); a schema file that is not JSON is named."""
    from ovbuild.runtime.structured.spec import Constraint

    if args.regex is not None:
        return Constraint("regex", args.regex)
    if args.json_schema is None:
        return None
    path = Path(args.json_schema)
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--json-schema {path}: cannot be read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--json-schema {path}: not JSON ({e})") from None
    return Constraint.json_schema(schema)


def image_prompt(pipeline, prompts: list[str | list[int]], args: argparse.Namespace):
    """The one text prompt of --image runs: its token ids with the images' placeholder tokens (rendered through the
    chat template with --chat), and its ImagePrompt."""
    from ovbuild.llm import ImagePrompter
    from ovbuild.runtime.validation import check_prompt

    if len(prompts) != 1 or not isinstance(prompts[0], str):
        raise ConfigError("--image goes with one text prompt (--prompt or --prompt-file)")
    prompter = ImagePrompter(Path(args.target), pipeline.tokenizer, args.device)
    text = prompter.with_placeholders(prompts[0], len(args.image))
    if args.chat:
        text = chat_template(args.target).render([{"role": "user", "content": text}])
    ids, images = prompter.prompt(text, list(args.image))
    limits = pipeline.target.vocab_size, pipeline.max_model_len
    check_prompt(np.asarray(ids, np.int64), args.max_new_tokens, *limits, "prompt 1")
    return ids, images


def chat_template(target: str):
    """The target folder's chat template, for --chat."""
    from ovbuild.serve.chat import ChatTemplate

    template = ChatTemplate.from_folder(target)
    if template is None:
        raise ConfigError(f"{target}: --chat needs a chat template (chat_template.jinja or tokenizer_config.json)")
    return template


def run(args: argparse.Namespace) -> int:
    from ovbuild.runtime.pipeline import Pipeline
    from ovbuild.runtime.report import format_metrics, results_json
    from ovbuild.runtime.request import GenerationConfig
    from ovbuild.runtime.streaming import stream_until_done
    from ovbuild.runtime.validation import check_positive_int, check_stop_strings, check_writable

    # Everything the user typed is checked before any model is read, and --json before any token is generated.
    check_positive_int(args.max_new_tokens, "--max-new-tokens")
    check_stop_strings(tuple(args.stop), "--stop")
    check_runtime_arguments(args, with_draft=args.draft is not None)
    if args.json_path:
        check_writable(args.json_path, "--json")
    prompts = read_prompts(args)
    GenerationConfig(args.max_new_tokens, **sampling_options(args))  # bad sampling values fail before any model loads
    constraint = output_constraint(args)
    pipeline = Pipeline(args.target, args.draft, runtime_options(args))
    if constraint is not None:
        pipeline.grammars.compile(constraint)  # a bad schema or regex fails before any token
    eos = () if args.ignore_eos else pipeline.eos_token_ids
    config = GenerationConfig(
        args.max_new_tokens,
        eos,
        tuple(args.stop),
        args.num_assistant_tokens,
        **sampling_options(args),
        constraint=constraint,
    )
    scheduler = pipeline.scheduler(trace=args.trace)
    if args.image:
        ids, images = image_prompt(pipeline, prompts, args)
        scheduler.add_request(ids, config, images=images)
    else:
        for ids in prompt_token_ids(pipeline, prompts, args.target, args.chat, args.max_new_tokens):
            scheduler.add_request(ids, config)
    stream_until_done(scheduler, _Printer(len(prompts)), pipeline.decode)
    requests, metrics = sorted(scheduler.finished, key=lambda r: r.id), scheduler.metrics
    runtime = pipeline.describe()
    print(f"runtime              {runtime}", file=sys.stderr)
    print(format_metrics(metrics, with_draft=args.draft is not None), file=sys.stderr)
    if args.json_path:
        results = results_json(prompts, requests, metrics, args.trace) | {"runtime": runtime}
        text = json.dumps(results, indent=2)
        try:
            Path(args.json_path).write_text(text)
        except OSError as e:
            raise ConfigError(f"--json {args.json_path}: cannot be written ({e.strerror or e})") from None
    return 0


class _Printer:
    """Streams text as it is committed: one request's text as is; several requests line by line, each line
    prefixed by its request index ("[2] "), and a closing line per request with its finish reason."""

    def __init__(self, num_requests: int):
        self.several, self.open_line = num_requests > 1, None  # index of the request whose line is open

    def __call__(self, request, text: str, finished: bool) -> None:
        if not self.several:
            print(text + ("\n" if finished else ""), end="", flush=True)
            return
        for i, piece in enumerate(text.split("\n")):
            if i > 0:
                self._close()
            if piece:
                self._open(request.id)
                print(piece, end="")
        if finished:
            self._close()
            print(f"[{request.id}] --- {request.finish_reason}, {len(request.generated)} tokens")
        sys.stdout.flush()

    def _open(self, index: int) -> None:
        if self.open_line != index:
            self._close()
            print(f"[{index}] ", end="")
            self.open_line = index

    def _close(self) -> None:
        if self.open_line is not None:
            print()
            self.open_line = None
