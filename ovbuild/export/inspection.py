"""What an exported folder holds (family, ports, rt_info, weight storage, sizes), and whether each IR loads.

Every model IR is read the way the runtime reads it and compiled on CPU; the first failure is an ExportError.
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov

from ovbuild.errors import ExportError
from ovbuild.export.progress import human_size
from ovbuild.ir import (
    MODEL_FILE,
    TOKENIZER_IRS,
    HybridKeys,
    Identity,
    Provenance,
    VisionIR,
    WeightStorage,
    core,
    last_line,
    read_ir,
)
from ovbuild.ir.rt_info import flat_rt_info


@dataclass(frozen=True)
class Port:
    name: str
    type: str
    shape: str


@dataclass
class IrReport:
    """One IR: its ports, rt_info (what the contract reads, and all of it flattened to `a/b` keys), and weight
    Constants as type -> (count, bytes)."""

    file: str
    inputs: list[Port]
    outputs: list[Port]
    identity: Identity
    storage: WeightStorage
    origin: Provenance
    rt_info: dict[str, str]
    constants: dict[str, tuple[int, int]]
    compiled_on: str = ""
    hybrid: HybridKeys | None = None  # a hybrid target's layer pattern and linear-attention geometry
    vision: VisionIR | None = None  # a vision tower's geometry


@dataclass
class FolderReport:
    folder: Path
    irs: list[IrReport]
    files: dict[str, int]
    tokenizer: str = ""  # how the tokenizer IRs were checked, when present
    notes: list[str] = field(default_factory=list)

    @property
    def main(self) -> IrReport:
        """The report of openvino_model.xml."""
        return next(ir for ir in self.irs if ir.file == MODEL_FILE)


def inspect_folder(folder: str | Path, device: str = "CPU") -> FolderReport:
    """Describe an exported folder, reading every IR and compiling it on `device`."""
    folder = Path(folder)
    if not (folder / MODEL_FILE).is_file():
        raise ExportError(f"{folder}: not an exported folder (no {MODEL_FILE})")
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    model_irs = [MODEL_FILE, *sorted(n for n in files if n.endswith(".xml") and n not in (MODEL_FILE, *TOKENIZER_IRS))]
    report = FolderReport(folder, [describe_ir(folder / name, device) for name in model_irs], files)
    report.tokenizer = check_tokenizers(folder, files, device)
    return report


def describe_ir(path: Path, device: str) -> IrReport:
    """Read one IR (PagedAttention rt_info restored), describe it, compile it."""
    model = read_ir(path)
    report = IrReport(
        path.name,
        [port(p) for p in model.inputs],
        [port(p) for p in model.outputs],
        Identity.from_model(model, path),
        WeightStorage.from_model(model, path),
        Provenance.from_model(model, path),
        flat_rt_info(model),
        constants(model),
        hybrid=HybridKeys.from_model(model, path),
        vision=VisionIR.from_model(model, path),
    )
    try:
        core().compile_model(model, device)
    except RuntimeError as e:
        raise ExportError(f"{path}: does not compile on {device} ({last_line(e)})") from e
    report.compiled_on = device
    return report


def check_tokenizers(folder: Path, files: dict[str, int], device: str) -> str:
    """Read and compile the tokenizer IRs when openvino-tokenizers (their op extension) is installed."""
    present = [n for n in TOKENIZER_IRS if n in files]
    if not present:
        return ""
    try:
        importlib.import_module("openvino_tokenizers")  # registers its ops with every Core made from now on
    except ImportError:
        return "not checked (openvino-tokenizers not installed)"
    tokenizer_core = ov.Core()
    for name in present:
        try:
            tokenizer_core.compile_model(tokenizer_core.read_model(str(folder / name)), device)
        except RuntimeError as e:
            raise ExportError(f"{folder / name}: does not load on {device} ({last_line(e)})") from e
    return f"reads and compiles on {device}"


def port(p: ov.Output) -> Port:
    return Port(p.get_any_name(), p.get_element_type().get_type_name(), str(p.get_partial_shape()))


def constants(model: ov.Model) -> dict[str, tuple[int, int]]:
    """Constant element type -> (count, bytes): how the weights are actually stored."""
    count, size = Counter(), Counter()
    for node in model.get_ops():
        if node.get_type_name() == "Constant":
            t = node.get_output_element_type(0)
            count[t.get_type_name()] += 1
            size[t.get_type_name()] += node.get_byte_size()
    return {t: (count[t], size[t]) for t in sorted(size, key=size.get, reverse=True)}


def format_report(report: FolderReport) -> str:
    """The report as text, one section per IR."""
    main = report.main
    lines = [
        f"{report.folder}",
        f"  kind {shown(main.identity.kind)}, family {shown(main.identity.family)}, "
        f"weight format {shown(main.storage.weight_format)}, IR format {shown(main.origin.ir_format)}",
        f"  source {shown(main.origin.source)} @ {shown(main.origin.revision)}",
    ]
    if main.hybrid is not None:  # a hybrid target: which layers are linear (L) and which full attention (F)
        pattern = main.hybrid.layer_pattern
        lines.append(f"  layers {pattern} ({pattern.count('L')} linear attention, {pattern.count('F')} full attention)")
    for ir in report.irs:
        lines += [f"{ir.file}: reads and compiles on {ir.compiled_on}"]
        if ir.vision is not None:
            lines += vision_lines(ir.vision)
        lines += ["  inputs:"]
        lines += [f"    {p.name:<24} {p.type:<8} {p.shape}" for p in ir.inputs]
        lines += ["  outputs:"]
        lines += [f"    {p.name:<24} {p.type:<8} {p.shape}" for p in ir.outputs]
        lines += ["  constants:"]
        lines += [f"    {t:<8} {n:>5} x  {human_size(b):>10}" for t, (n, b) in ir.constants.items()]
        lines += ["  rt_info:"]
        lines += [f"    {k} = {v}" for k, v in ir.rt_info.items()]
    if report.tokenizer:
        lines.append(f"tokenizer IRs: {report.tokenizer}")
    lines.append(f"files ({human_size(sum(report.files.values()))}):")
    lines += [f"  {name:<32} {human_size(size):>10}" for name, size in report.files.items()]
    return "\n".join(lines)


def vision_lines(v: VisionIR) -> list[str]:
    """A vision tower's geometry: what an image becomes (patches, merged tokens) and the tower's size."""
    p, g = v.patch_size, v.grid_multiple
    side = round(v.num_position_embeddings**0.5)
    frames = f"{v.temporal_patch_size}x" if v.temporal_patch_size is not None else ""
    mode = f", downsample {v.downsample_mode}" if v.downsample_mode is not None else ""
    return [
        f"  vision tower {shown(v.family)}: {v.depth} blocks, width {v.hidden_size}, {v.num_heads} heads",
        f"    patches {frames}{p}x{p} pixels of {v.in_channels} channels; position grid {side}x{side}",
        f"    one token of width {v.out_hidden_size} per {v.patches_per_token} patches{mode} "
        f"(grids in multiples of {g * p} pixels)",
    ]


def shown(value: str | None) -> str:
    """An rt_info value as printed: "?" when the IR does not record it."""
    return "?" if value is None else value
