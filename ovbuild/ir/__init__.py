"""The joint between building and running: IR files, their rt_info records and their ports.

`files` reads and writes IRs (and holds the process-wide Core), `records` declares what each IR records about itself
(one codec, `codec`, writes and reads every record), `ports` declares every input and output by name, element type,
rank and role. The graph builders write through this package and the runtime reads through it; it imports neither.
"""

from ovbuild.ir.codec import Record, locators_json, write_rt_info
from ovbuild.ir.files import (
    MARKOV_HEAD_STEM,
    MODEL_FILE,
    MODEL_STEM,
    TOKENIZER_IRS,
    VISION_FILE,
    VISION_STEM,
    core,
    last_line,
    read_ir,
    read_json,
    restore_paged_attention,
    save_ir,
    set_head_geometry,
)
from ovbuild.ir.records import (
    GPU_MIN_ACTIVATIONS_SCALE_FACTOR,
    DFlash2Keys,
    DraftIR,
    DSparkKeys,
    HeadGeometry,
    HybridKeys,
    Identity,
    ImageKeys,
    MarkovHeadIR,
    Provenance,
    SpecialTokens,
    TargetIR,
    VisionIR,
    WeightStorage,
    gpu_activations_scale_factor,
)

__all__ = [
    "GPU_MIN_ACTIVATIONS_SCALE_FACTOR",
    "MARKOV_HEAD_STEM",
    "MODEL_FILE",
    "MODEL_STEM",
    "TOKENIZER_IRS",
    "VISION_FILE",
    "VISION_STEM",
    "DFlash2Keys",
    "DSparkKeys",
    "DraftIR",
    "HeadGeometry",
    "HybridKeys",
    "Identity",
    "ImageKeys",
    "MarkovHeadIR",
    "Provenance",
    "Record",
    "SpecialTokens",
    "TargetIR",
    "VisionIR",
    "WeightStorage",
    "core",
    "gpu_activations_scale_factor",
    "last_line",
    "locators_json",
    "read_ir",
    "read_json",
    "restore_paged_attention",
    "save_ir",
    "set_head_geometry",
    "write_rt_info",
]
