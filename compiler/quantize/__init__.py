"""``qfuse quantize``: calibrate a float ONNX model into an int8 one placed for the compiler."""

from __future__ import annotations

from qfuse.compiler.quantize.api import quantize

__all__ = ["quantize"]
