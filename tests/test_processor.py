"""The image processors against transformers 5.18's own output (recorded by tools/record_processor_outputs.py in a
separate environment): decoding of awkward inputs, Qwen3.5's and MiniCPM-V's grids, token counts, placeholder text and
pixel values; bad inputs raising one clear error; a 100-megapixel JPEG decoded reduced."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ovbuild.errors import ConfigError, ImageError, MissingDependencyError, RequestError, UnsupportedError
from ovbuild.processor import (
    ImageLimits,
    MiniCPMVImageProcessor,
    QwenImageProcessor,
    decode,
    decode_image,
    smart_resize,
)

from processor_images import SIZES, minicpmv_rows, picture, pixels_sha256, row_statistics

DATA = Path(__file__).parent / "data" / "processor"
RECORDED = json.loads((DATA / "recorded.json").read_text())
CASES = [f"{w}x{h}" for w, h in SIZES]


def recorded(name: str, case: str) -> dict[str, np.ndarray]:
    """One case's arrays from a recorded npz."""
    with np.load(DATA / f"{name}.npz") as data:
        return {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(case + "/")}


def image_of(case: str) -> Image.Image:
    """The case's picture, checked to be the one transformers was given."""
    width, height = (int(v) for v in case.split("x"))
    pixels = picture(width, height)
    assert pixels_sha256(pixels) == RECORDED["pictures_sha256"][case], f"{case}: picture differs from the recorded one"
    return Image.fromarray(pixels)


def assert_rows_agree(case: str, rows: np.ndarray, want: dict[str, np.ndarray]) -> None:
    """Per-patch statistics and the sampled patches equal transformers' to float32 tolerance; the message states the
    largest difference measured."""
    got = row_statistics(rows)
    worst = float(np.abs(got["sampled_rows"] - want["sampled_rows"]).max())
    sums = float(np.abs(got["row_sum"] - want["row_sum"]).max())
    dots = float(np.abs(got["row_dot"] - want["row_dot"]).max())
    message = f"{case}: max |diff| sampled patches {worst:.3g}, per-patch sums {sums:.3g}, weighted sums {dots:.3g}"
    assert worst <= 1e-6 and sums <= 1e-4 and dots <= 1e-4, message
    np.testing.assert_array_equal(got["sampled_index"], want["sampled_index"])


# --- decoding ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(np.load(DATA / "decoded.npz").files))
def test_decoding_equals_transformers_load_image(name):
    """RGBA, palette, grey, grey + alpha, 16-bit grey, CMYK, EXIF-rotated, WebP and BMP inputs decode to the RGB
    pixels transformers' load_image gives (EXIF orientation applied, then convert("RGB"))."""
    want = np.load(DATA / "decoded.npz")[name]
    got = np.asarray(decode_image(DATA / "inputs" / name))
    assert got.shape == want.shape, f"{name}: {got.shape} != {want.shape}"
    diff = int(np.abs(got.astype(np.int16) - want).max())
    assert diff == 0, f"{name}: max |diff| {diff}"


def test_bytes_path_and_data_url_decode_alike():
    data = (DATA / "inputs" / "rgba.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    want = np.asarray(decode_image(DATA / "inputs" / "rgba.png"))
    for source in (data, bytearray(data), url, str(DATA / "inputs" / "rgba.png")):
        np.testing.assert_array_equal(np.asarray(decode_image(source)), want)


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature, IHDR chunk for an 8-bit RGB image of the given size and an empty IDAT: a header claiming a
    size, with no pixels behind it."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"")


def encoded(fmt: str, size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(picture(*size)).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (b"", "empty"),
        (b"this is not an image at all", "not an image in a format"),
        (encoded("PNG")[:200], "truncated"),
        (encoded("JPEG")[:300], "truncated"),
        (encoded("PNG")[:60] + b"\x00" * 400 + encoded("PNG")[460:], "corrupt"),
        (encoded("PPM"), "not an image in a format"),  # Pillow reads it; ovbuild does not take it from users
        (png_header(0, 10), "PNG file whose header cannot be read (corrupt, truncated, or a zero-size image)"),
        (png_header(13000, 12000), "over the 150000000-pixel limit"),
        (png_header(20000, 10000), "decompression-bomb limit"),
        (png_header(9000, 9000), "only JPEG can be decoded reduced"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png,rawtext", "base64"),
        ("/no/such/file.png", "no such image file"),
        ("https://example.com/a.png", "does not fetch"),
        (12345, "bytes, a file path or a data URL"),
    ],
)
def test_bad_input_raises_one_clear_error(source, words):
    with pytest.raises(ImageError) as caught:
        decode_image(source)
    assert words in str(caught.value), str(caught.value)


def test_byte_limit_names_the_limit():
    small = ImageLimits(max_bytes=100)
    data = encoded("PNG")
    for source in (data, DATA / "inputs" / "rgba.png", "data:image/png;base64," + base64.b64encode(data).decode()):
        with pytest.raises(ImageError, match="over the 100-byte limit"):
            decode_image(source, small)


def test_large_jpeg_decodes_reduced_to_fit():
    """Over max_decoded_pixels, a JPEG is decoded by libjpeg at 1/2, 1/4 or 1/8 scale: the smallest reduction that
    fits (here 1/4: 1/2 would still be 1.2 MP)."""
    data = encoded("JPEG", size=(2400, 2000))
    image = decode_image(data, ImageLimits(max_decoded_pixels=1_000_000))
    assert image.size == (600, 500) and image.mode == "RGB"


def test_a_100_megapixel_jpeg_never_exists_at_full_size():
    """The 10000x10000 JPEG decodes at 1/2 scale under the default limits: the peak memory of a fresh process grows by
    about 120 MB, where decoding it in full takes 400 MB (its 100 MB greyscale raster, then 300 MB as RGB)."""
    script = (
        "import gzip, resource, sys\n"
        "from ovbuild.processor import decode_image\n"
        f"data = gzip.decompress(open({str(DATA / 'inputs' / 'flat_100mp.jpg.gz')!r}, 'rb').read())\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "image = decode_image(data)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(image.size[0], image.size[1], (after - before) // 1024)\n"
    )
    env_path = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env={"PYTHONPATH": env_path}
    ).stdout.split()
    width, height, grown_mb = (int(v) for v in out)
    assert (width, height) == (5000, 5000)
    # 1/2 scale: 25 MB of greyscale, 75 MB as RGB; in full it would be 100 MB + 300 MB
    assert grown_mb < 160, f"decoding grew peak memory by {grown_mb} MB (a full decode needs 400 MB)"
    assert len(gzip.decompress((DATA / "inputs" / "flat_100mp.jpg.gz").read_bytes())) > 1_000_000


# --- Qwen3.5 (Qwen2VLImageProcessorPil + Qwen3VLProcessor) -------------------------------------------------------


def qwen_folder(tmp_path: Path, settings: dict) -> Path:
    names = {"processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**settings, **names}))
    return tmp_path


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> QwenImageProcessor:
    return QwenImageProcessor.from_folder(qwen_folder(tmp_path_factory.mktemp("qwen"), RECORDED["qwen3_5"]))


@pytest.mark.parametrize("case", CASES)
def test_qwen_equals_transformers(qwen, case):
    want = recorded("qwen3_5", case)
    got = qwen.process(image_of(case))
    np.testing.assert_array_equal(got.grid, want["grid_thw"])
    assert got.pixel_values.shape == tuple(want["shape"]) and got.pixel_values.dtype == np.float32
    assert got.num_tokens == int(want["num_tokens"])
    assert hashlib.sha256(got.placeholder.encode()).hexdigest() == str(want["placeholder_sha256"])
    assert_rows_agree(case, got.pixel_values, want)


def test_qwen_settings_as_published(qwen):
    assert (qwen.patch_size, qwen.merge_size, qwen.temporal_patch_size) == (16, 2, 2)
    assert (qwen.min_pixels, qwen.max_pixels, qwen.image_mean) == (65536, 16777216, (0.5, 0.5, 0.5))


def test_qwen_reads_processor_config_and_legacy_pixel_keys(tmp_path):
    nested = {"image_processor": {**RECORDED["qwen3_5"], "max_pixels": 1003520}, "processor_class": "Qwen3VLProcessor"}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    processor = QwenImageProcessor.from_folder(tmp_path)
    assert (processor.min_pixels, processor.max_pixels) == (65536, 1003520)


@pytest.mark.parametrize(
    ("settings", "error", "words"),
    [
        ({"size": {"shortest_edge": 9000, "longest_edge": 100}}, ConfigError, "shortest_edge <= longest_edge"),
        ({"patch_size": 0}, ConfigError, "patch_size must be positive"),
        ({"image_std": [0.5, 0, 0.5]}, ConfigError, "image_std has a zero"),
        ({"image_mean": [0.5, 0.5]}, ConfigError, "three numbers"),
        ({"do_normalize": False}, UnsupportedError, "do_normalize"),
    ],
)
def test_qwen_bad_settings_name_the_key(tmp_path, settings, error, words):
    with pytest.raises(error, match=words):
        QwenImageProcessor.from_folder(qwen_folder(tmp_path, {**RECORDED["qwen3_5"], **settings}))


def test_qwen_refuses_an_aspect_ratio_over_200():
    with pytest.raises(ImageError, match="aspect ratio"):
        smart_resize(10, 2010, 32, 65536, 16777216)


def test_qwen_prompt_expansion(qwen):
    images = [qwen.process(image_of("224x224")), qwen.process(image_of("37x91"))]
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>a<|vision_start|><|image_pad|><|vision_end|>"
    text = qwen.expand_prompt(prompt, images)
    assert text.count("<|image_pad|>") == 64 + 78
    assert "<|vision_start|>" + "<|image_pad|>" * 64 + "<|vision_end|>a" in text
    with pytest.raises(RequestError, match="2 image placeholder"):
        qwen.expand_prompt(prompt, images[:1])


# --- MiniCPM-V 4.7 (MiniCPMV4_6ImageProcessorPil + MiniCPMV4_7Processor) ----------------------------------------


@pytest.fixture(scope="module")
def minicpmv(tmp_path_factory) -> MiniCPMVImageProcessor:
    folder = tmp_path_factory.mktemp("minicpmv")
    (folder / "preprocessor_config.json").write_text(json.dumps(RECORDED["minicpmv"]))
    return MiniCPMVImageProcessor.from_folder(folder)


@pytest.mark.parametrize("case", CASES)
def test_minicpmv_equals_transformers(minicpmv, case):
    want = recorded("minicpmv", case)
    got = minicpmv.process(image_of(case))
    np.testing.assert_array_equal(got.grid, want["target_sizes"])
    assert got.slices == tuple(int(v) for v in want["grid"])
    assert got.pixel_values.shape == tuple(want["shape"]) and got.pixel_values.dtype == np.float32
    assert got.num_tokens == int(want["num_tokens"])
    assert minicpmv.expand_prompt(minicpmv.tokens.image, [got]) == str(want["placeholder"])
    assert_rows_agree(case, minicpmv_rows(got.pixel_values, minicpmv.patch_size), want)


def test_minicpmv_reads_token_strings_from_the_tokenizer(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**RECORDED["minicpmv"], "downsample_mode": "4x"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": {"image_token": "<|img|>"}}))
    processor = MiniCPMVImageProcessor.from_folder(tmp_path)
    got = processor.process(image_of("224x224"))
    assert processor.tokens.image == "<|img|>" and processor.tokens.slice_start == "<slice>"
    # 224x224 is upscaled to the 448x448 overview: 32x32 patches, 4 per token in 4x mode
    assert got.num_tokens == 32 * 32 // 4 and got.placeholder == "<image>" + "<|img|>" * 256 + "</image>"


def test_minicpmv_refuses_an_unknown_downsample_mode(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"downsample_mode": "8x"}))
    with pytest.raises(ConfigError, match="downsample_mode"):
        MiniCPMVImageProcessor.from_folder(tmp_path)


def test_equal_images_share_a_hash_and_different_ones_do_not(qwen):
    a, b = qwen.process(image_of("224x224")), qwen.process(image_of("224x224"))
    c = qwen.process(Image.fromarray(picture(224, 224, seed=1)))
    assert a.content_hash == b.content_hash != c.content_hash


def test_the_processors_import_no_openvino():
    """Serving runs them beside the scheduler; a processor process needs no OpenVINO."""
    script = "import sys, ovbuild.processor; print(sorted(m for m in sys.modules if m.split('.')[0] == 'openvino'))"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]", out.stdout


def test_without_pillow_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(decode, "Image", None)
    with pytest.raises(MissingDependencyError, match=r"ovbuild\[vision\]"):
        decode_image(b"\x89PNG")
