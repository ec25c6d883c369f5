"""Record what transformers' image processors make of a few images, for tests/test_processor.py.

Runs in its own environment, never in ovbuild's (transformers stays out of the package and its tests):

    python -m venv /tmp/record-venv
    /tmp/record-venv/bin/pip install transformers==5.18.0 pillow numpy   # no torch: the PIL variants need none
    /tmp/record-venv/bin/python tools/record_processor_outputs.py

Writes tests/data/processor/: `inputs/` (small encoded images in awkward modes, and a 100-megapixel JPEG gzipped),
`decoded.npz` (transformers' `load_image` of each input), `qwen3_5.npz` and `minicpmv.npz` (per picture: grid,
token count, placeholder text or its hash, per-patch statistics and a few whole patches) and `recorded.json` (the
versions and settings used). The processors are built from explicit settings, written below as data, equal to the
published preprocessor_config.json files named beside them (there is no hub access where this runs).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers.image_utils import load_image
from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
from transformers.models.minicpmv4_7.processing_minicpmv4_7 import MiniCPMV4_7Processor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from processor_images import SIZES, minicpmv_rows, picture, pixels_sha256, row_statistics  # noqa: E402

OUT = ROOT / "tests" / "data" / "processor"

# Qwen/Qwen3.5-9B (and every Qwen3.5 size, dense and MoE) preprocessor_config.json, without the two class-name keys.
# transformers maps model_type qwen3_5 to Qwen2VLImageProcessor / Qwen2VLImageProcessorPil and Qwen3VLProcessor.
QWEN3_5 = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# openbmb/MiniCPM-V-4.6 preprocessor_config.json (the MiniCPMV4_6ImageProcessor that transformers also maps
# minicpmv4_7 to); its values equal the class defaults, which is what a 4.7 file omitting a key falls back to.
MINICPMV = {
    "max_slice_nums": 9,
    "scale_resolution": 448,
    "patch_size": 14,
    "use_image_id": True,
    "slice_mode": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# The strings MiniCPMV4_7Processor reads from its tokenizer, as MiniCPM-V 4.6 / 4.7 tokenizer_config.json files
# declare them in `extra_special_tokens`.
MINICPMV_TOKENS = {
    "image_token": "<|image_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}


def encoded_inputs() -> dict[str, bytes]:
    """Small images in the modes a user sends, encoded once here so tests decode the very same bytes."""
    base = Image.fromarray(picture(40, 30, seed=7))
    alpha = Image.fromarray(np.linspace(0, 255, 40 * 30).astype(np.uint8).reshape(30, 40))
    out = {}

    def save(name: str, image: Image.Image, fmt: str, **kwargs) -> None:
        buf = io.BytesIO()
        image.save(buf, fmt, **kwargs)
        out[name] = buf.getvalue()

    rgba = base.copy()
    rgba.putalpha(alpha)
    save("rgba.png", rgba, "PNG")
    save("palette.png", base.quantize(colors=16), "PNG")
    save("grey.png", base.convert("L"), "PNG")
    save("grey_alpha.png", Image.merge("LA", (base.convert("L"), alpha)), "PNG")
    grey16 = Image.fromarray((np.asarray(base.convert("L"), dtype=np.uint16) * 257).astype(np.uint16))
    save("grey16.png", grey16, "PNG")
    save("cmyk.jpg", base.convert("CMYK"), "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    save("exif_rotated.jpg", base, "JPEG", quality=90, exif=exif.tobytes())
    save("rgb.webp", base, "WEBP", lossless=True)
    save("rgb.bmp", base, "BMP")
    return out


def qwen_case(processor: Qwen2VLImageProcessorPil, image: Image.Image) -> dict[str, np.ndarray]:
    """The Qwen processor's output for one image, and the placeholder Qwen3VLProcessor writes for it."""
    out = processor(images=[image], return_tensors="np")
    stub = SimpleNamespace(image_processor=processor, image_token="<|image_pad|>")
    text = Qwen3VLProcessor.replace_image_token(stub, out, 0)
    stats = row_statistics(out["pixel_values"])
    return {
        "shape": np.array(out["pixel_values"].shape),
        "grid_thw": out["image_grid_thw"],
        "num_tokens": np.array(text.count(stub.image_token)),
        "placeholder_sha256": np.array(hashlib.sha256(text.encode()).hexdigest()),
        **stats,
    }


def minicpmv_case(processor: MiniCPMV4_6ImageProcessorPil, image: Image.Image) -> dict[str, np.ndarray]:
    """MiniCPM-V's output for one image and the placeholder MiniCPMV4_7Processor writes for it (image id 0)."""
    out = processor(images=[image], return_tensors="np")
    stub = SimpleNamespace(slice_mode=processor.slice_mode, video_token="<|video_pad|>", **MINICPMV_TOKENS)
    text = MiniCPMV4_7Processor.replace_image_token(stub, out, image_idx=0, image_token_divisor=16)
    with_id = MiniCPMV4_7Processor._prepend_local_ids(stub, [stub.image_token], [text], stub.image_token)[0]
    stats = row_statistics(minicpmv_rows(out["pixel_values"], processor.patch_size))
    return {
        "shape": np.array(out["pixel_values"].shape),
        "target_sizes": out["target_sizes"],
        "grid": np.array(out["grids"][0]),
        "num_tokens": np.array(text.count(stub.image_token)),
        "placeholder": np.array(with_id),
        **stats,
    }


def flat(cases: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """{case: {key: array}} -> {"case/key": array} for one npz."""
    return {f"{case}/{key}": value for case, values in cases.items() for key, value in values.items()}


def main() -> None:
    (OUT / "inputs").mkdir(parents=True, exist_ok=True)
    inputs = encoded_inputs()
    for name, data in inputs.items():
        (OUT / "inputs" / name).write_bytes(data)
    big = io.BytesIO()
    Image.new("L", (10000, 10000), 128).save(big, "JPEG", quality=75)  # 100 megapixels, flat: gzips to 2 KB
    (OUT / "inputs" / "flat_100mp.jpg.gz").write_bytes(gzip.compress(big.getvalue(), 9, mtime=0))
    decoded = {name: np.asarray(load_image(str(OUT / "inputs" / name))) for name in inputs}
    np.savez_compressed(OUT / "decoded.npz", **decoded)

    qwen = Qwen2VLImageProcessorPil(**QWEN3_5)
    minicpmv = MiniCPMV4_6ImageProcessorPil(**MINICPMV)
    qwen_cases, minicpmv_cases, pictures = {}, {}, {}
    for width, height in SIZES:
        pixels = picture(width, height)
        case = f"{width}x{height}"
        pictures[case] = pixels_sha256(pixels)
        image = Image.fromarray(pixels)
        qwen_cases[case] = qwen_case(qwen, image)
        minicpmv_cases[case] = minicpmv_case(minicpmv, image)
    np.savez_compressed(OUT / "qwen3_5.npz", **flat(qwen_cases))
    np.savez_compressed(OUT / "minicpmv.npz", **flat(minicpmv_cases))
    record = {
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "qwen3_5": QWEN3_5,
        "minicpmv": MINICPMV,
        "minicpmv_tokens": MINICPMV_TOKENS,
        "pictures_sha256": pictures,
    }
    (OUT / "recorded.json").write_text(json.dumps(record, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
