"""Chat templates rendered as transformers renders them, in a sandbox; where they are read from."""

from __future__ import annotations

import json

import pytest

from ovbuild.errors import ConfigError, RequestError
from ovbuild.serve.chat import ChatTemplate

# The shape of Qwen3's template in the parts that exercise Hugging Face's environment: whitespace control,
# loop controls, namespace(), tojson, raise_exception, special tokens and an extra keyword (enable_thinking).
QWEN_LIKE = """{%- if messages[0].role == 'system' %}
{{- bos_token + '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(users=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}{% continue %}{% endif %}
    {%- if message.role not in ['user', 'assistant'] %}
        {{- raise_exception('Conversation roles must be user or assistant') }}
    {%- endif %}
    {%- if message.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if tools %}{{- tools | tojson }}{% endif %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{% endif %}
{%- endif %}
{{- '[' ~ ns.users ~ ']' }}"""

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def test_renders_like_transformers():
    template = ChatTemplate(QWEN_LIKE, SPECIAL)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "héllo"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "again"},
    ]
    expected = (
        "<s><|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n[2]"
    )
    assert template.render(messages) == expected
    assert template.render(messages, add_generation_prompt=False).endswith("again<|im_end|>\n[2]")
    thinking_off = template.render(messages[1:2], enable_thinking=False)
    assert thinking_off == "<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n[1]"


def test_tojson_keeps_non_ascii_and_does_not_html_escape():
    template = ChatTemplate("{{ tools | tojson }}|{{ tools | tojson(indent=2) }}", {})
    tools = [{"name": "déjà <vu>", "n": 1}]
    flat, indented = template.render([], tools=tools).split("|")
    assert flat == json.dumps(tools, ensure_ascii=False) and indented == json.dumps(tools, ensure_ascii=False, indent=2)


def test_raise_exception_becomes_a_request_error():
    with pytest.raises(RequestError, match="the chat template refused the messages: Conversation roles must") as e:
        ChatTemplate(QWEN_LIKE, SPECIAL).render([{"role": "tool", "content": "x"}])
    assert e.value.param == "messages"


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",  # attribute access outside the sandbox
        "{% set _ = messages.append(1) %}",  # the immutable sandbox refuses to modify the messages
    ],
)
def test_the_sandbox_refuses_unsafe_templates(source):
    with pytest.raises(RequestError):
        ChatTemplate(source, {}).render([{"role": "user", "content": "x"}])


def test_unset_special_tokens_render_empty_not_none(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": None, "eos_token": {"content": "</s>"}, "chat_template": "{{ bos_token }}|{{ eos_token }}"}
        )
    )
    assert ChatTemplate.from_folder(tmp_path).render([]) == "|</s>"


def test_where_templates_are_read_from(tmp_path):
    assert ChatTemplate.from_folder(tmp_path) is None  # no tokenizer_config.json, no chat_template.jinja
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert ChatTemplate.from_folder(tmp_path).render([]) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert ChatTemplate.from_folder(tmp_path).render([{"role": "user", "content": "x"}]) == "J1"
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ConfigError, match=r"chat_template\.jinja: the chat template does not parse"):
        ChatTemplate.from_folder(tmp_path)
