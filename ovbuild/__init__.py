"""ovbuild: OpenVINO graphs for DFlash-family speculative-decoding drafts, built natively from safetensors."""

__version__ = "0.1.0"
