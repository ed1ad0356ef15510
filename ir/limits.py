"""Size limits, checked against declared shapes before anything is allocated.

A malformed or hostile model can declare sizes no machine has (a 1e5 x 1e5 input, 1e9
channels, pads of 1e9, a Resize by 1e5, a 1e6 x 1e6 sparse initializer, external data of
1e15 bytes). qfuse computes every such size from the model's declarations with Python
integers (no int64 wrap-around) and refuses the model with SizeLimitError, naming the tensor
or node, before reading or allocating it:

- ``max_tensor_bytes`` — one tensor: a graph input, an initializer, external data, the dense
  form of a sparse initializer, the result of folding a node on constants, and every value
  of the imported graph after shape inference. Default 4 GiB; environment variable
  ``QFUSE_MAX_TENSOR_BYTES``.
- ``max_model_bytes`` — all values of the imported graph together (what the unfused plan
  would hold at most). Default 32 GiB; ``QFUSE_MAX_MODEL_BYTES``.

The variables are read at each check, so a process can change them between compiles.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from qfuse.ir.errors import SizeLimitError

GIB = 1 << 30
DEFAULT_MAX_TENSOR_BYTES = 4 * GIB
DEFAULT_MAX_MODEL_BYTES = 32 * GIB
TENSOR_VARIABLE = "QFUSE_MAX_TENSOR_BYTES"
MODEL_VARIABLE = "QFUSE_MAX_MODEL_BYTES"


@dataclass(frozen=True)
class Limits:
    max_tensor_bytes: int
    max_model_bytes: int


def _read(variable: str, default: int) -> int:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise SizeLimitError(f"{variable}={text!r} is not a number of bytes") from None
    if value <= 0:
        raise SizeLimitError(f"{variable}={text!r} must be a positive number of bytes")
    return value


def limits() -> Limits:
    """The limits in force (environment variables, else the defaults)."""
    return Limits(_read(TENSOR_VARIABLE, DEFAULT_MAX_TENSOR_BYTES),
                  _read(MODEL_VARIABLE, DEFAULT_MAX_MODEL_BYTES))


def show_bytes(nbytes: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} bytes"


def element_count(shape: Iterable[int]) -> int:
    """The number of elements, exact (Python integers); negative dims count as 0."""
    return math.prod(max(int(d), 0) for d in shape)


def check_bytes(what: str, nbytes: int) -> None:
    """Refuse one tensor of ``nbytes`` above max_tensor_bytes; ``what`` names it."""
    limit = limits().max_tensor_bytes
    if nbytes > limit:
        raise SizeLimitError(f"{what} needs {show_bytes(nbytes)}, above the limit of "
                             f"{show_bytes(limit)} for one tensor ({TENSOR_VARIABLE})")


def check_shape(what: str, shape: Iterable[int], itemsize: int) -> None:
    """Refuse a tensor of ``shape`` and ``itemsize`` bytes per element above the limit."""
    shape = tuple(int(d) for d in shape)
    check_bytes(f"{what} of shape {shape}", element_count(shape) * itemsize)


def check_total(what: str, nbytes: int) -> None:
    limit = limits().max_model_bytes
    if nbytes > limit:
        raise SizeLimitError(f"{what} need {show_bytes(nbytes)} together, above the limit of "
                             f"{show_bytes(limit)} for a model ({MODEL_VARIABLE})")


__all__ = ["Limits", "check_bytes", "check_shape", "check_total", "element_count", "limits",
           "show_bytes"]
