"""Digest every IR an export writes for the tiny checkpoints, so a refactor can prove it left the IRs unchanged.

    python tools/ir_snapshot.py snapshot.json             # write the digests
    python tools/ir_snapshot.py now.json --compare before.json   # and fail on any difference

Covers every draft family and the target, both IR formats (genai only where it applies), every weight format and bf16
checkpoints. The XML is compared with version-dependent rt_info masked (OpenVINO's runtime version, ovbuild's
version and the source's absolute path); the .bin bytes are compared as they are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

from ovbuild.errors import OvbuildError
from ovbuild.export.api import export
from ovbuild.export.weight_formats import WEIGHT_FORMATS
from ovbuild.families import DFLASH2, FAMILIES
from ovbuild.testing.tiny import write_tiny_target
from ovbuild.testing.tiny_dflash2 import write_tiny_dflash2_short_window

# Values that change with the machine, the install or the clock, not with the graph.
MASKS = [
    re.compile(r'(<Runtime_version value=")[^"]*'),
    re.compile(r'(<(?:version|ovbuild_version|source|path|folder|target_source)\s+value=")[^"]*'),
]


def masked_xml(text: str) -> str:
    for mask in MASKS:
        text = mask.sub(r"\1*", text)
    return text


def digest_folder(folder: Path) -> dict[str, str]:
    """sha256 of every .xml (masked) and .bin file of an exported folder."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.suffix == ".xml" and not p.name.startswith("openvino_tokenizer") and "detokenizer" not in p.name:
            out[p.name] = hashlib.sha256(masked_xml(p.read_text()).encode()).hexdigest()
        elif p.suffix == ".bin" and not p.name.startswith("openvino_tokenizer") and "detokenizer" not in p.name:
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def checkpoints(root: Path) -> tuple[Path, dict[str, Path]]:
    """The tiny target (f32), every tiny checkpoint the draft families declare and a DFlash v2 draft whose window is
    below its block, each from its fixed seed."""
    target = write_tiny_target(root / "target")
    drafts = {}
    for family in FAMILIES:
        drafts.update({name: write(root / name) for name, write in family.tiny.items()})
        if family is DFLASH2:  # the window band mask
            drafts["dflash2_window"] = write_tiny_dflash2_short_window(root / "dflash2_window")
    # The order matters: OpenVINO numbers unnamed nodes from one counter per process, so a snapshot compares with
    # another only when both exported in the same order.
    return target, drafts


def snapshot(root: Path) -> dict[str, dict[str, str]]:
    """Every export's digests keyed by "<checkpoint>/<format>/<weight format>"."""
    target, drafts = checkpoints(root / "ckpt")
    bf16 = write_tiny_target(root / "ckpt" / "target_bf16", dtype="bf16", head_dim=16)
    results: dict[str, dict[str, str]] = {}

    def one(name: str, model: Path, fmt: str, wf: str, **kw) -> None:
        key = f"{name}/{fmt}/{wf}"
        if wf == "int4":
            kw.setdefault("group_size", 16)
        try:
            out = export(model, root / "out" / key, format=fmt, weight_format=wf, quiet=True, **kw).out
            results[key] = digest_folder(out)
        except OvbuildError as e:  # a combination the project refuses is part of the snapshot too
            results[key] = {"error": type(e).__name__}
        print(key, file=sys.stderr)

    for wf in WEIGHT_FORMATS:
        if wf == "int4":  # the tiny models' rows are shorter than the default group of 128
            one("target_sym", target, "paged", wf, group_size=16, sym=True, all_layers=True)
        one("target", target, "paged", wf, draft_of=drafts["dflash"])
        one("target_bf16", bf16, "paged", wf)
        one("target", target, "genai", wf)
        for name, draft in drafts.items():
            one(name, draft, "paged", wf, target_model=target)
            one(name, draft, "genai", wf)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where to write the digests (JSON)")
    parser.add_argument("--compare", type=Path, help="digests of an earlier run: exit 1 on any difference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = snapshot(Path(tmp))
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    diffs = [k for k in sorted(set(before) | set(results)) if before.get(k) != results.get(k)]
    for k in diffs:
        print(f"DIFFERENT {k}: {before.get(k)} -> {results.get(k)}")
    print(f"{len(results)} exports, {len(diffs)} different")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
