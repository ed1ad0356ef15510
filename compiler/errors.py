"""Errors the compiler raises on models it cannot take, with messages users can act on.

Every message names the node and op it is about (``node 'conv3' (ConvTranspose): ...``) or the
tensor / opset / input involved, never a bare KeyError.
"""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A valid model that uses something qfuse does not implement (op, type, attribute)."""


class MalformedModelError(ValueError):
    """A model that breaks the ONNX spec or is inconsistent (checker failure, bad shapes,
    invalid quantization parameters, external data outside the model's folder)."""


__all__ = ["MalformedModelError", "UnsupportedModelError"]
