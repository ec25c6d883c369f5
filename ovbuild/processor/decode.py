"""Image decoding: bytes, a file path or a `data:` URL -> an RGB Pillow image, as transformers' `load_image` makes it
(EXIF orientation applied, then `convert("RGB")`), within stated size limits checked from the header before any pixel
is decoded."""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from ovbuild.errors import ImageError, MissingDependencyError

try:
    from PIL import Image, ImageOps, UnidentifiedImageError
except ImportError:  # the `vision` extra; the message says which
    Image = ImageOps = UnidentifiedImageError = None

# The formats Pillow may open here: what browsers and cameras send. Others (EPS, which runs Ghostscript; PSD; ICO; ...)
# are refused by name rather than handed to a decoder nobody reviewed for untrusted input.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
# Formats whose decoder can produce a reduced image directly (libjpeg's DCT scaling through `Image.draft`).
REDUCIBLE = ("JPEG", "MPO")  # Pillow opens multi-picture JPEGs (MPO) through its JPEG plugin

# Leading bytes of each accepted format, to tell "not an image we take" from "one of ours, but its header is broken".
SIGNATURES = {
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}

ImageSource = Union[bytes, bytearray, memoryview, str, Path, "Image.Image"]


@dataclass(frozen=True)
class ImageLimits:
    """What an image may cost before it is decoded. A source over `max_source_pixels` is refused from its header; one
    over `max_decoded_pixels` is decoded reduced by 2, 4 or 8 when its format allows (JPEG) and refused otherwise.
    Pillow's own bomb check (`Image.MAX_IMAGE_PIXELS`, errors above twice it) applies as well."""

    max_bytes: int = 64 * 1024 * 1024  # encoded size
    max_source_pixels: int = 150_000_000
    max_decoded_pixels: int = 64_000_000  # 192 MB as RGB


def require_pillow() -> None:
    """Raise the error naming the extra when Pillow is missing."""
    if Image is None:
        raise MissingDependencyError("image input needs Pillow: pip install 'ovbuild[vision]'")


def read_source(source: ImageSource, max_bytes: int) -> tuple[bytes, str]:
    """The encoded bytes of `source` and a name for messages: raw bytes, a `data:` URL (base64) or a file path; a file
    or payload over `max_bytes` is refused before it is read or decoded."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), f"image bytes ({len(source)} bytes)"
    if isinstance(source, str) and source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ImageError(f"data URL {header[:64]!r}: expected 'data:<mime>;base64,<payload>'")
        if len(payload) // 4 * 3 > max_bytes:
            raise ImageError(f"data URL ({header[5:64]}): payload over the {max_bytes}-byte limit")
        try:
            return base64.b64decode(payload, validate=True), f"data URL ({header[5:64]})"
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"data URL ({header[5:64]}): payload is not valid base64 ({e})") from e
    if isinstance(source, (str, Path)):
        path = Path(source)
        if str(source).startswith(("http://", "https://")):
            raise ImageError(f"{str(source)[:200]}: ovbuild does not fetch URLs; pass the bytes or a data URL")
        if not path.is_file():
            raise ImageError(f"{str(source)[:200]}: no such image file")
        if path.stat().st_size > max_bytes:
            raise ImageError(f"{path}: {path.stat().st_size} bytes is over the {max_bytes}-byte limit")
        return path.read_bytes(), str(path)
    raise ImageError(f"an image must be bytes, a file path or a data URL, not {type(source).__name__}")


def decode_image(source: ImageSource, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """`source` as an RGB image, oriented by its EXIF tag, as transformers loads it; errors name the source."""
    require_pillow()
    if isinstance(source, Image.Image):
        return to_rgb(source, "image", limits)
    data, name = read_source(source, limits.max_bytes)
    if not data:
        raise ImageError(f"{name}: empty, no image data")
    if len(data) > limits.max_bytes:
        raise ImageError(f"{name}: {len(data)} bytes is over the {limits.max_bytes}-byte limit")
    image = open_checked(data, name, limits)
    return to_rgb(image, name, limits)


def open_checked(data: bytes, name: str, limits: ImageLimits) -> Image.Image:
    """Open from the header only and apply the limits; a large JPEG is set to decode reduced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our limits decide, not a warning
        try:
            image = Image.open(io.BytesIO(data), formats=FORMATS)
        except Image.DecompressionBombError as e:
            raise ImageError(f"{name}: too large for Pillow's decompression-bomb limit ({e})") from e
        except UnidentifiedImageError as e:
            raise ImageError(f"{name}: {unidentified(data)}") from e
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise ImageError(f"{name}: corrupt or truncated image header ({e})") from e
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"{name}: zero-size image ({width}x{height})")
    pixels = width * height
    if pixels > limits.max_source_pixels:
        raise ImageError(f"{name}: {width}x{height} is over the {limits.max_source_pixels}-pixel limit")
    if pixels > limits.max_decoded_pixels:
        reduce_on_decode(image, name, limits)
    return image


def unidentified(data: bytes) -> str:
    """Why Pillow could not open `data`: a known format with a broken header, or no format ovbuild takes."""
    kind = next((fmt for magic, fmt in SIGNATURES.items() if data.startswith(magic)), None)
    if kind is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind = "WEBP"
    if kind is not None:
        return f"a {kind} file whose header cannot be read (corrupt, truncated, or a zero-size image)"
    return f"not an image in a format ovbuild decodes ({', '.join(FORMATS)})"


def reduce_on_decode(image: Image.Image, name: str, limits: ImageLimits) -> None:
    """Ask the JPEG decoder for the smallest reduction (2, 4, 8) that fits `max_decoded_pixels`, so the full-size
    raster never exists; other formats cannot decode reduced and are refused."""
    width, height = image.size
    if image.format not in REDUCIBLE:
        raise ImageError(
            f"{name}: {image.format} image of {width}x{height} is over the {limits.max_decoded_pixels}-pixel decode "
            f"limit (only JPEG can be decoded reduced)"
        )
    for scale in (2, 4, 8):
        if math.ceil(width / scale) * math.ceil(height / scale) <= limits.max_decoded_pixels:
            # draft picks the largest reduction keeping the image at least this size: floor, so it can reach `scale`
            image.draft("RGB", (width // scale, height // scale))
            return
    raise ImageError(f"{name}: {width}x{height} stays over the {limits.max_decoded_pixels}-pixel limit at 1/8 scale")


def to_rgb(image: Image.Image, name: str, limits: ImageLimits) -> Image.Image:
    """Decode, orient by EXIF and convert to RGB (alpha dropped, palette expanded, grey/16-bit/CMYK converted) as
    transformers' `load_image` does."""
    if image.width * image.height > limits.max_decoded_pixels and image.format not in REDUCIBLE:
        raise ImageError(f"{name}: {image.width}x{image.height} is over the {limits.max_decoded_pixels}-pixel limit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # as load_image does, without a second raster
            return image.convert("RGB")
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            kind = image.format or "image"
            raise ImageError(f"{name}: corrupt or truncated {kind} data ({e})") from e
