"""Images in chat requests: `image_url` content parts read under the server's policy (data URLs always; local files
under --allowed-local-media-path; http(s) only with --allow-remote-images), decoded and processed as the target's
processor does, encoded by its vision tower and placed at the placeholders the chat template wrote.

All of it runs in a request handler's worker thread, before the request reaches the engine: a large image never
stalls the engine's steps. Every refusal is a RequestError naming the content part (a 400)."""

from __future__ import annotations

import dataclasses
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ovbuild.errors import ImageError, OvbuildError, RequestError
from ovbuild.ir import VISION_FILE
from ovbuild.llm import ImagePrompter
from ovbuild.processor import ImageLimits, decode_image
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.prompts import PromptLimits

# Images prepared at once across requests: each holds a decoded raster (up to ImageLimits.max_decoded_pixels * 3
# bytes) and its pixel values, so a burst of large images is taken two at a time, not as many as the thread pool has.
PREPARING_AT_ONCE = 2
REMOTE_TIMEOUT_S = 10.0
NO_PIXELS = np.zeros(0, np.float32)  # what a processed image keeps once encoded: its rows are what count


@dataclass(frozen=True)
class ImagePolicy:
    """Where images may come from: a local folder (None: no local files) and whether http(s) URLs are fetched."""

    local_root: Path | None = None
    allow_remote: bool = False
    limits: ImageLimits = field(default_factory=ImageLimits)
    timeout_s: float = REMOTE_TIMEOUT_S

    def read(self, url: str, where: str) -> bytes | str:
        """The image of one `image_url`: a data URL as it is (the processor decodes it), else the bytes of a local file
        or of a fetched URL; a RequestError naming `where` when the policy refuses it."""
        if url.startswith("data:"):
            return url
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return self.fetch(url, where)
        if scheme == "file":
            return self.local(urllib.parse.unquote(urllib.parse.urlsplit(url).path), where)
        if scheme and len(scheme) > 1:  # a drive letter is not a scheme
            raise RequestError(f"{where}: unsupported image URL scheme '{scheme}' (data:, file: or a path)", "messages")
        return self.local(url, where)

    def local(self, path: str, where: str) -> bytes:
        """A file under `local_root`, symlinks resolved before the check; a relative path is taken from the root."""
        if self.local_root is None:
            raise RequestError(
                f"{where}: local image files are not served (start the server with --allowed-local-media-path DIR)",
                "messages",
            )
        root = self.local_root.resolve()
        resolved = (root / path).resolve()  # symlinks followed as far as the path exists
        if not resolved.is_relative_to(root):  # checked first: a path outside says nothing of what exists there
            raise RequestError(
                f"{where}: {path[:200]} is outside the allowed folder --allowed-local-media-path", "messages"
            )
        if not resolved.exists():
            raise RequestError(f"{where}: no such image file under the allowed folder: {path[:200]}", "messages")
        if not resolved.is_file():
            raise RequestError(f"{where}: {path[:200]} is not a file", "messages")
        if resolved.stat().st_size > self.limits.max_bytes:
            raise RequestError(
                f"{where}: {path[:200]} is over the {self.limits.max_bytes}-byte image limit", "messages"
            )
        return resolved.read_bytes()

    def fetch(self, url: str, where: str) -> bytes:
        """The body of an http(s) URL (with --allow-remote-images), within the timeout and the byte limit."""
        if not self.allow_remote:
            raise RequestError(
                f"{where}: remote image URLs are not fetched (start the server with --allow-remote-images, or send the "
                f"image as a data: URL)",
                "messages",
            )
        limit = self.limits.max_bytes
        try:
            with urllib.request.urlopen(
                url, timeout=self.timeout_s
            ) as answer:  # http(s) only: the scheme is checked above
                data = answer.read(limit + 1)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise RequestError(f"{where}: cannot fetch {url[:200]} ({getattr(e, 'reason', e)})", "messages") from None
        if len(data) > limit:
            raise RequestError(f"{where}: {url[:200]} is over the {limit}-byte image limit", "messages")
        return data


def image_url(part: dict, where: str) -> str:
    """The URL of an `image_url` content part: {"image_url": {"url": ...}} or the plain-string form."""
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise RequestError(f"{where}: an image_url part needs image_url.url, a non-empty string", "messages")
    return url


class ServedImages:
    """The served target's image side: its prompter (processor and vision tower), the sources policy, and how its
    chat template takes images (`lists`: it renders content lists itself, as Qwen's templates do; otherwise each
    image part becomes its placeholder text inside a string content)."""

    def __init__(self, target_dir: Path, tokenizer, device: str, policy: ImagePolicy, template=None):
        self.prompter, self.policy = ImagePrompter(Path(target_dir), tokenizer, device), policy
        self.image_token = self.prompter.processor.tokens.image
        self.lists = template is not None and self.renders_image_parts(template)
        self.gate = threading.BoundedSemaphore(PREPARING_AT_ONCE)

    @classmethod
    def for_folder(cls, target_dir, tokenizer, device: str, policy: ImagePolicy, template=None) -> ServedImages | None:
        """The folder's image side, or None when it has no vision tower (a text-only target)."""
        if not (Path(target_dir) / VISION_FILE).is_file():
            return None
        return cls(Path(target_dir), tokenizer, device, policy, template)

    def renders_image_parts(self, template) -> bool:
        """Whether the template writes the image token for an image part of a content list (Hugging Face's
        `{"type": "image"}`); a template that only concatenates string contents fails or writes none."""
        probe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
        try:
            return self.image_token in template.render(probe, True)
        except OvbuildError:
            return False

    def message_content(self, parts: list[dict], where: str) -> tuple[str | list[dict], list[tuple[str, str]]]:
        """A message's content as the template takes it, and its images as (url, where) in order."""
        content, images = [], []
        for j, part in enumerate(parts):
            kind, at = part.get("type"), f"{where}.content[{j}]"
            if kind == "text":
                content.append({"type": "text", "text": part.get("text", "")})
            elif kind == "image_url":
                images.append((image_url(part, at), at))
                content.append({"type": "image"})
            else:
                raise RequestError(f"{at}: content parts are text or image_url, not {kind!r}", "messages")
        if self.lists:
            return content, images
        return "".join(p["text"] if p["type"] == "text" else self.prompter.placeholder() for p in content), images

    def prepare(self, text: str, images: list[tuple[str, str]], limits: PromptLimits) -> tuple[list[int], ImagePrompt]:
        """Token ids of the rendered `text` with each image's placeholder run, and its ImagePrompt. One image at a
        time: read, decode, process (a 400 naming its part), encode (the tower runs only for an image not in the
        encoder's cache), then its pixel values are dropped, so the step never holds more than one image's pixels and
        activations. The counts are checked before any image is read, the context as the images add up.
        Runs in a worker thread."""
        self.check_placeholders(text, images)
        context = limits.context_length
        with self.gate:
            processed, embeds, shown = [], [], 0
            for url, where in images:
                image = self.processed(url, where)
                shown += image.num_tokens
                if context is not None and shown >= context:
                    raise RequestError(
                        f"{where}: the images up to this one take {shown} tokens; this model's maximum context length "
                        f"is {context}",
                        "messages",
                    )
                embeds.append(self.prompter.encoder.encode_one(image.pixel_values, image.grid, image.content_hash))
                processed.append(dataclasses.replace(image, pixel_values=NO_PIXELS))
            ids = self.prompter.expand(text, processed)
            if context is not None and len(ids) >= context:
                raise RequestError(
                    f"the prompt is {len(ids)} tokens, {shown} of them for its {len(images)} image(s); this model's "
                    f"maximum context length is {context}",
                    "messages",
                )
            return ids, self.prompter.place(ids, processed, embeds)

    def check_placeholders(self, text: str, images: list[tuple[str, str]]) -> None:
        """One image token in the rendered `text` per image, else a RequestError saying why they differ."""
        written = text.count(self.image_token)
        if written != len(images):
            raise RequestError(
                f"the rendered messages hold {written} image placeholder(s) ({self.image_token}) for {len(images)} "
                f"image(s) (the chat template leaves out images it does not render, e.g. in a system message; the "
                f"text must not hold the image token itself)",
                "messages",
            )

    def refuse_placeholders(self, prompts: list[list[int]]) -> None:
        """A RequestError when a prompt without images holds the image token: its rows would have no embeddings."""
        for p, ids in enumerate(prompts):
            if self.prompter.image_id in ids:
                where = "the prompt" if len(prompts) == 1 else f"prompt[{p}]"
                raise RequestError(
                    f"{where} holds the image placeholder token {self.image_token} (id {self.prompter.image_id}) at "
                    f"index {ids.index(self.prompter.image_id)}, but no image for it: /v1/completions takes no images "
                    f"(send them as image_url parts to /v1/chat/completions)",
                    "prompt",
                )

    def expanded_text(self, text: str, images: list[tuple[str, str]]) -> str:
        """The rendered `text` with each image token written out as its image's placeholder run (what /tokenize
        counts): every image read, decoded and processed for its token count, none encoded. Runs in a worker thread."""
        self.check_placeholders(text, images)
        with self.gate:
            processed = [dataclasses.replace(self.processed(u, w), pixel_values=NO_PIXELS) for u, w in images]
        return self.prompter.processor.expand_prompt(text, processed)

    def processed(self, url: str, where: str):
        """One image read, decoded and processed; its ImageError becomes a RequestError naming the part."""
        try:
            return self.prompter.processor.process(decode_image(self.policy.read(url, where), self.policy.limits))
        except ImageError as e:
            raise RequestError(f"{where}: {e}", "messages") from None
