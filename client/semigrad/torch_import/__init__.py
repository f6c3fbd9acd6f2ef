"""Import PyTorch models: :func:`from_torch` (torch itself is imported only when it is called)."""

from .importer import TorchImport, TorchImportError, from_torch

__all__ = ["TorchImport", "TorchImportError", "from_torch"]
