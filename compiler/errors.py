"""The user-facing errors (defined in ir/errors.py, the layer every other one imports)."""

from __future__ import annotations

from qfuse.ir.errors import (
    InputError,
    MalformedModelError,
    QfuseError,
    SizeLimitError,
    UnsupportedModelError,
)

__all__ = ["InputError", "MalformedModelError", "QfuseError", "SizeLimitError",
           "UnsupportedModelError"]
