"""Image prompts through `ovbuild serve`, with the official openai client and raw HTTP: `image_url` parts (data URLs,
local files under --allowed-local-media-path) answer as `LLM.generate(images=...)` with the target alone, with the
draft, streamed, concurrently; a later turn hits the prefix cache past the image and another image does not; the
vision tower runs once per image; every bad image is one 400 naming what is wrong, on a connection that stays open."""

from __future__ import annotations

import base64
import gzip
import http.server
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from openai import OpenAI
from PIL import Image
from test_processor import DATA, encoded, png_header
from test_serve import metrics, wait_idle

from ovbuild.errors import RequestError
from ovbuild.export import export
from ovbuild.llm import LLM
from ovbuild.processor import ImageLimits
from ovbuild.runtime.pipeline import RuntimeOptions
from ovbuild.serve.chat import ChatTemplate
from ovbuild.serve.images import ImagePolicy
from ovbuild.serve.server import BackgroundServer, build_app
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.testing.tiny_minicpm_vision import write_tiny_minicpm_vision_for_images

from export_helpers import assert_clean_error, ovbuild

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

MODEL, MAX_TOKENS, CONTEXT = "tiny-vl", 12, 448
# 3 draft tokens every step: the adaptive planner would draft in no step on these tiny models
GREEDY = dict(max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True, "num_assistant_tokens": 3})
# the planner's draft lengths (none, here): the draft cache never takes the prompts' blocks, the target's still hit
PLANNED = dict(max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
ALONE = dict(max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
# Qwen3.5's chat template renders content lists itself, an image part as its vision markers around the image token,
# and a system message's text parts only (as Qwen3-VL's does): the served template here is that shape.
QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if message.role != 'system' and (part.type == 'image' or 'image_url' in part) %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'text' %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def picture(path, height: int, width: int, seed: int):
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def user(text: str, *urls: str) -> dict:
    return {"role": "user", "content": [*(image_part(u) for u in urls), {"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(target folder with its tower and a list-aware template, draft folder, media folder of four pictures)."""
    root = tmp_path_factory.mktemp("serve_images")
    target, draft = write_tiny_hybrid_target(root / "ct"), write_tiny_hybrid_dflash(root / "cd")
    export(target, root / "t", draft_of=draft, weight_format="keep", quiet=True)
    export(draft, root / "d", target_model=target, weight_format="keep", quiet=True)
    (root / "t" / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    media = root / "media"
    media.mkdir()
    sizes = {"a.png": (20, 28), "b.png": (20, 28), "tall.png": (30, 12), "small.png": (8, 10)}  # a, b: one grid
    for seed, (name, size) in enumerate(sizes.items()):
        picture(media / name, *size, seed)
    return root / "t", root / "d", media


OPTIONS = dict(max_model_len=CONTEXT, state_snapshot_interval=16)  # snapshots every block: turns hit the cache


@pytest.fixture(scope="module")
def server(folders):
    target, draft, media = folders
    app = build_app(target, draft, RuntimeOptions(**OPTIONS), MODEL, image_policy=ImagePolicy(media))
    with BackgroundServer(app) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def alone(folders):
    """The target alone in-process, and the served template: what every greedy image answer must equal."""
    target, _, _ = folders
    return LLM(target, **OPTIONS), ChatTemplate.from_folder(target)


def expected(alone, messages: list[dict], files: list) -> str:
    """LLM.generate(images=files) with the target alone, on the messages rendered as the server renders them."""
    llm, template = alone
    as_template = [
        {**m, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]
    text = template.render(as_template)
    return llm.generate(
        text, images=[str(f) for f in files], use_draft=False, max_new_tokens=MAX_TOKENS, ignore_eos=True
    )


def tower_calls(server) -> list:
    """Counts the served vision tower's IR calls from now on (one entry per call)."""
    encoder = server.server.config.app.state.model.images.prompter.encoder
    calls, infer = [], encoder.infer

    def counted(pixels, grid):
        calls.append(grid.tolist())
        return infer(pixels, grid)

    encoder.infer = counted
    return calls


def test_image_answers_equal_the_target_alone(folders, client, alone):
    """A data URL, a local path and a file:// URL: with the draft the answer is the target's own; a different image
    gives a different answer (the embeddings, not the placeholders, answer)."""
    _, _, media = folders
    messages = [user("What is this?", data_url((media / "a.png").read_bytes()))]
    answer = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY).choices[0].message.content
    assert answer == expected(alone, messages, [media / "a.png"])
    for url in (str(media / "tall.png"), f"file://{media / 'tall.png'}", "tall.png"):  # a relative path: the root's
        messages = [user("And this one?", url)]
        got = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY).choices[0].message.content
        assert got == expected(alone, messages, [media / "tall.png"]), url
    other = [user("What is this?", data_url((media / "b.png").read_bytes()))]
    assert client.chat.completions.create(model=MODEL, messages=other, **GREEDY).choices[0].message.content != answer


def test_the_plain_string_form_and_two_images_in_one_message(folders, client, alone):
    _, _, media = folders
    parts = [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": str(media / "small.png")},  # the plain-string form some clients send
        {"type": "text", "text": " with "},
        image_part(str(media / "tall.png")),
    ]
    messages = [{"role": "user", "content": parts}]
    got = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY).choices[0].message.content
    assert got == expected(alone, messages, [media / "small.png", media / "tall.png"])


def test_streaming_with_images(folders, client, alone):
    _, _, media = folders
    messages = [user("Describe it.", str(media / "small.png"))]
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == expected(alone, messages, [media / "small.png"])


def test_concurrent_requests_with_images_of_different_sizes(folders, client, alone):
    _, _, media = folders
    names = ["a.png", "tall.png", "small.png", "b.png", "tall.png", "a.png"]
    conversations = [[user(f"Picture {i}?", str(media / n))] for i, n in enumerate(names)]
    want = [expected(alone, m, [media / n]) for m, n in zip(conversations, names, strict=True)]

    def ask(messages):
        return client.chat.completions.create(model=MODEL, messages=messages, **GREEDY).choices[0].message.content

    with ThreadPoolExecutor(len(names)) as pool:
        assert list(pool.map(ask, conversations)) == want


def test_the_tower_runs_once_per_image(folders, server, client):
    _, _, media = folders
    picture(media / "fresh.png", 16, 16, 99)
    calls = tower_calls(server)
    for question in ("Once?", "Twice?"):
        client.chat.completions.create(model=MODEL, messages=[user(question, "fresh.png")], **GREEDY)
    assert calls == [[[1, 8, 8]]]  # the second request found the image's rows in the encoder's cache


@pytest.mark.parametrize("drafts", [GREEDY, PLANNED], ids=["pinned", "planned"])
def test_later_turns_hit_the_prefix_cache_past_the_image_and_another_image_does_not(
    folders, server, client, alone, drafts
):
    """Turn 2 resends turn 1 with the image: its cached prefix reaches past the image, whether the draft drafted
    (both caches hold the prefix) or not (the target's does), and its answer is the target alone's. The same
    conversation with another image of the same size (the same placeholder ids) hits only before the image."""
    _, _, media = folders
    pinned = "num_assistant_tokens" in drafts["extra_body"]
    system = {"role": "system", "content": f"You look at pictures and answer {'briefly' if pinned else 'fully'}. " * 2}

    def hits(messages) -> tuple[int, str]:
        wait_idle(server)
        before = metrics(server)["ovbuild_prefix_cache_hits_total"]
        answer = client.chat.completions.create(model=MODEL, messages=messages, **drafts)
        wait_idle(server)
        return metrics(server)["ovbuild_prefix_cache_hits_total"] - before, answer.choices[0].message.content

    first = [system, user("What is in it?", str(media / "a.png"))]
    _, reply = hits(first)
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Are you sure?"}]
    cached, answer = hits(second)
    assert answer == expected(alone, second, [media / "a.png"])
    llm, template = alone
    text = template.render([system, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    _, shown = llm.image_prompter().prompt(text, [str(media / "a.png")])
    image = shown.images[0]
    assert cached > image.end, f"turn 2 found {cached} tokens cached; the image ends at {image.end}"
    swapped = [system, user("What is in it?", str(media / "b.png")), *second[2:]]
    cached_other, _ = hits(swapped)
    assert 0 < cached_other <= image.start, f"another image: {cached_other} cached, the image starts at {image.start}"


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def web(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def flat_100mp_jpeg() -> bytes:
    return gzip.decompress((DATA / "inputs" / "flat_100mp.jpg.gz").read_bytes())


def bad_requests(media, outside) -> list[tuple[str, list[dict], str]]:
    """(case, messages, words the 400's message holds)."""
    png = encoded("PNG")
    return [
        ("corrupt", [user("?", data_url(png[:60] + b"\x00" * 400 + png[460:]))], "corrupt"),
        ("truncated", [user("?", data_url(png[:200]))], "truncated"),
        ("zero size", [user("?", data_url(png_header(0, 10)))], "zero-size"),
        ("format", [user("?", data_url(encoded("PPM"), "image/x-portable-pixmap"))], "not an image in a format"),
        ("not base64", [user("?", "data:image/png;base64,@@@")], "not valid base64"),
        ("100 MP png", [user("?", data_url(png_header(10000, 10000)))], "only JPEG can be decoded reduced"),
        ("context", [user("Too many?", *[str(media / "a.png")] * 14)], "maximum context length is 448"),
        ("system image", [{**user("?", str(media / "a.png")), "role": "system"}, user("?")], "0 image placeholder"),
        ("literal token", [user("<|image_pad|> here", str(media / "a.png"))], "2 image placeholder(s)"),
        ("token, no image", [user("<|image_pad|> alone")], "no image_url part"),
        ("remote", [user("?", "https://example.com/cat.png")], "--allow-remote-images"),
        ("outside", [user("?", str(outside))], "outside the allowed folder"),
        ("traversal", [user("?", os.path.relpath(outside, media))], "outside the allowed folder"),
        ("symlink", [user("?", "link.png")], "outside the allowed folder"),
        ("missing", [user("?", "nope.png")], "no such image file"),
        ("no url", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url.url"),
        (
            "kind",
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
            "text or image_url, not 'input_audio'",
        ),
    ]


def test_every_bad_image_is_one_400_and_the_connection_stays(folders, web, tmp_path):
    _, _, media = folders
    outside = picture(tmp_path / "secret.png", 8, 8, 5)
    (media / "link.png").unlink(missing_ok=True)
    (media / "link.png").symlink_to(outside)
    for case, messages, words in bad_requests(media, outside):
        answer = web.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2})
        assert answer.status_code == 400, (case, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages", (case, error)
        assert words in error["message"], (case, error["message"])
        assert answer.headers.get("connection") != "close", case
    fine = web.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [user("?", "small.png")], "max_tokens": MAX_TOKENS, "ignore_eos": True},
    )
    assert fine.status_code == 200 and fine.json()["usage"]["completion_tokens"] == MAX_TOKENS


def test_a_100_megapixel_jpeg_is_decoded_reduced_and_answered(web):
    body = {"model": MODEL, "messages": [user("Big?", data_url(flat_100mp_jpeg(), "image/jpeg"))], "max_tokens": 2}
    answer = web.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] > 64  # the image's 64 tokens at the processor's pixel limit


def test_a_text_only_target_refuses_images(tiny_pair):
    with BackgroundServer(build_app(tiny_pair[0], name="text")) as s:
        body = {"model": "text", "messages": [user("?", data_url(encoded("PNG")))], "max_tokens": 2}
        answers = [
            httpx.post(f"{s.url}{path}", json=body, timeout=60) for path in ("/v1/chat/completions", "/tokenize")
        ]
    for answer in answers:
        assert answer.status_code == 400
        assert "takes no images" in answer.json()["error"]["message"]


# -- /tokenize with images, and the image token in a completion prompt ----------------------------------------------


def test_tokenize_writes_out_each_image_s_placeholder_run(folders, server, web, client, alone):
    """Chat-form /tokenize with image parts: the tokens the chat endpoint prefills (the placeholders expanded, as
    vLLM answers), counted without running the tower."""
    _, _, media = folders
    picture(media / "counted.png", 18, 26, 41)
    messages = [user("Compare", "counted.png"), {"role": "assistant", "content": "ok"}, user("with", "tall.png")]
    calls = tower_calls(server)
    answer = web.post("/tokenize", json={"model": MODEL, "messages": messages, "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    assert calls == []  # the processor alone counts the placeholders
    got = answer.json()
    llm, template = alone
    text = template.render(
        [
            {**m, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
            if isinstance(m["content"], list)
            else m
            for m in messages
        ]
    )
    prompter = llm.image_prompter()
    ids, shown = prompter.prompt(text, [str(media / "counted.png"), str(media / "tall.png")])
    assert got["tokens"] == ids and got["count"] == len(ids) == len(got["token_strs"])
    assert sum(i.end - i.start for i in shown.images) == got["tokens"].count(prompter.image_id) > 2
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == got["count"]
    bad = web.post("/tokenize", json={"model": MODEL, "messages": [user("?", data_url(encoded("PNG")[:200]))]})
    assert bad.status_code == 400 and "truncated" in bad.json()["error"]["message"]


@pytest.mark.parametrize("prompt", ["Look: <|image_pad|> here", [5, 6, 258, 7]], ids=["text", "ids"])
def test_a_completion_prompt_with_the_image_token_is_a_400(web, prompt):
    answer = web.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "prompt" and "image placeholder token <|image_pad|> (id 258)" in error["message"]
    assert "/v1/completions takes no images" in error["message"]
    fine = web.post("/v1/completions", json={"model": MODEL, "prompt": "Look: here", "max_tokens": 2})
    assert fine.status_code == 200, fine.text


def test_remote_images_are_fetched_only_with_the_flag(tmp_path):
    """A loopback HTTP server started here: refused by default, fetched with allow_remote, within the byte limit."""
    served = encoded("PNG")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(served)))
            self.end_headers()
            self.wfile.write(served)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as origin:
        threading.Thread(target=origin.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{origin.server_address[1]}/a.png"
        with pytest.raises(RequestError, match="--allow-remote-images"):
            ImagePolicy().read(url, "messages[0].content[0]")
        assert ImagePolicy(allow_remote=True).read(url, "messages[0].content[0]") == served
        small = ImagePolicy(allow_remote=True, limits=ImageLimits(max_bytes=100))
        with pytest.raises(RequestError, match="over the 100-byte image limit"):
            small.read(url, "messages[0].content[0]")
        origin.shutdown()


def test_the_command_checks_its_image_flags_before_loading(capsys, tmp_path):
    run = ovbuild(capsys, "serve", "--target", tmp_path, "--allowed-local-media-path", tmp_path / "none")
    assert_clean_error(run, "--allowed-local-media-path")
    run = ovbuild(capsys, "serve", "--target", tmp_path, "--replicas", "2", "--allow-remote-images")
    assert_clean_error(run, "not supported with --replicas")


# -- MiniCPM-V 4.7: a template that takes string contents, the processor's canvas layout --------------------------


def test_minicpmv_image_chat_equals_the_target_alone(tmp_path):
    """The tiny template concatenates string contents: each image part becomes the processor's image token in its
    place, which the processor expands into the overview and slices."""
    ckpt = write_tiny_minicpm_vision_for_images(tmp_path / "c")
    export(ckpt, tmp_path / "t", weight_format="keep", quiet=True)
    wide, square = picture(tmp_path / "w.png", 24, 40, 1), picture(tmp_path / "s.png", 12, 12, 2)
    llm, template = LLM(tmp_path / "t"), ChatTemplate.from_folder(tmp_path / "t")
    conversations = [[user("What?", data_url(wide.read_bytes()))], [user("And?", data_url(square.read_bytes()))]]
    with BackgroundServer(build_app(tmp_path / "t", name="cpm")) as s:
        client = OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
        with ThreadPoolExecutor(2) as pool:
            got = list(
                pool.map(
                    lambda m: client.chat.completions.create(model="cpm", messages=m, **ALONE).choices[0].message,
                    conversations,
                )
            )
        counted = httpx.post(f"{s.url}/tokenize", json={"model": "cpm", "messages": conversations[0]}, timeout=60)
    for message, conversation, path in zip(got, conversations, (wide, square), strict=True):
        text = template.render([{"role": "user", "content": "<|image_pad|>" + conversation[0]["content"][1]["text"]}])
        want = llm.generate(text, images=[str(path)], max_new_tokens=MAX_TOKENS, ignore_eos=True)
        assert message.content == want
        if path == wide:  # /tokenize: the overview and the slices' rows between their markers, as the chat prefills
            assert counted.status_code == 200, counted.text
            assert counted.json()["tokens"] == llm.image_prompter().prompt(text, [str(path)])[0]
