"""The four ways a model runs (one name for each, used by the API, the CLI, lowering and bench).

- ``fused``: the full pipeline; int8 compute ops carry their post-op chains as oneDNN attributes.
- ``unfused``: the same int8 compute kernels, every post-op (scale, shift, activation, residual
  add, quantize) as its own oneDNN primitive.
- ``fp32``: quantization stripped; the float graph on oneDNN f32 primitives.
- ``reference``: the numpy interpreter on the imported graph, exact ONNX semantics (slow).
"""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    FUSED = "fused"
    UNFUSED = "unfused"
    FP32 = "fp32"
    REFERENCE = "reference"


COMPILED_MODES = (Mode.FUSED, Mode.UNFUSED, Mode.FP32)  # the ones lowered to a oneDNN plan
