"""ovbuild: OpenVINO graphs for DFlash-family speculative-decoding drafts, built natively from safetensors."""

from ovbuild.version import __version__

__all__ = ["LLM", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so `import ovbuild` (the CLI's start-up) does not load OpenVINO.
    if name == "LLM":
        from ovbuild.llm import LLM

        return LLM
    raise AttributeError(f"module 'ovbuild' has no attribute {name!r}")
