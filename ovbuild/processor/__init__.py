"""Image processors without OpenVINO: decode an image, resize, normalise and slice it as each family's published
processor does, and count and write its placeholder tokens. Serving runs these before a request reaches the
scheduler; the vision towers (ovbuild/graph) take `ProcessedImage.pixel_values` and `grid`.

Needs Pillow (the `vision` extra): `decode_image` raises `MissingDependencyError` without it."""

from ovbuild.processor.decode import FORMATS, ImageLimits, decode_image
from ovbuild.processor.minicpmv import MiniCPMVImageProcessor, MiniCPMVTokens
from ovbuild.processor.processed import ProcessedImage, expand_image_tokens
from ovbuild.processor.qwen import QwenImageProcessor, QwenTokens, smart_resize

__all__ = [
    "FORMATS",
    "ImageLimits",
    "MiniCPMVImageProcessor",
    "MiniCPMVTokens",
    "ProcessedImage",
    "QwenImageProcessor",
    "QwenTokens",
    "decode_image",
    "expand_image_tokens",
    "smart_resize",
]
