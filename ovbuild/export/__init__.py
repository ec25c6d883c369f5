"""Export: a checkpoint (hub id or folder) to a complete, self-describing IR folder; inspection of such folders."""

from ovbuild.export.api import ExportResult, export

__all__ = ["ExportResult", "export"]
