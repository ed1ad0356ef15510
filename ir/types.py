"""Tensor metadata: element types, shapes and quantization parameters.

An integer tensor carries its quantization next to its shape, the way LPT reads it
(OpenVINO fake_quantize.md): ``real = scale * (q - zero_point)``, per tensor (``axis is None``) or per
channel along ``axis``. Scales and zero points are stored as tuples so that the metadata
stays hashable and immutable; ``scale_array()``/``zero_point_array()`` give numpy views.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class DType(enum.Enum):
    """Element types the IR knows. ``value`` is the numpy dtype name."""

    F32 = "float32"
    F16 = "float16"
    F64 = "float64"
    S32 = "int32"
    S64 = "int64"
    S8 = "int8"
    U8 = "uint8"
    S16 = "int16"
    U16 = "uint16"
    U32 = "uint32"
    U64 = "uint64"
    BOOL = "bool"

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def is_integer(self) -> bool:
        return self.np.kind in "iu"

    @property
    def is_quantized(self) -> bool:
        """True for the 8-bit types that int8 kernels read and write."""
        return self in (DType.S8, DType.U8)

    @property
    def range(self) -> tuple[int, int]:
        """Saturation range of an integer type."""
        if not self.is_integer:
            raise ValueError(f"{self.name} has no integer range")
        info = np.iinfo(self.np)
        return int(info.min), int(info.max)

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        name = np.dtype(dtype).name
        for member in cls:
            if member.value == name:
                return member
        raise ValueError(f"numpy dtype {name} has no IR element type")


@dataclass(frozen=True)
class QuantParams:
    """``real = scale * (q - zero_point)``; per channel along ``axis`` when it is set."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self) -> None:
        if len(self.scale) != len(self.zero_point):
            raise ValueError(
                f"{len(self.scale)} scales but {len(self.zero_point)} zero points"
            )
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("a per-tensor quantization has exactly one scale")

    @classmethod
    def make(
        cls, scale: object, zero_point: object = 0, axis: int | None = None
    ) -> QuantParams:
        s = np.atleast_1d(np.asarray(scale, dtype=np.float32)).ravel()
        z = np.broadcast_to(np.atleast_1d(np.asarray(zero_point)).ravel(), s.shape)
        if axis is not None and s.size == 1 and np.ndim(scale) == 0:
            axis = None
        return cls(tuple(float(v) for v in s), tuple(int(v) for v in z), axis)

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    def scale_array(self) -> np.ndarray:
        return np.asarray(self.scale, dtype=np.float32)

    def zero_point_array(self) -> np.ndarray:
        return np.asarray(self.zero_point, dtype=np.int32)


@dataclass(frozen=True)
class OnnxQuantize:
    """The quantization a FakeQuantize stands for when it was made from an ONNX Q/DQ pair.

    ONNX QuantizeLinear rounds first and adds the zero point after:
    ``q = saturate(rint(x / scale) + zero_point)``, ``x / scale`` a float32 *division* (as
    onnxruntime's MLAS computes it), round half to even. OpenVINO's FakeQuantize rounds the
    level index instead, ``rint((x - il)/(ih - il)·(L - 1))``, i.e. ``rint(x/s + zp)`` for a
    Q/DQ's ranges: the two part on values within float32 rounding of a tie, and on exact ties
    when the zero point is odd (docs/numerics.md). Carrying the pair's own type and parameters
    (not ranges rebuilt from them) keeps ONNX's result bit for bit. ``dequantize``: the
    FakeQuantize outputs ``(q - zero_point)·scale`` (the pair); False: the levels ``q`` (a
    quantize-only FakeQuantize, passes/decompose_fake_quantize.py).
    """

    dtype: DType
    quant: QuantParams
    dequantize: bool = True


@dataclass(frozen=True)
class TensorInfo:
    """Shape (static; every dim known) and element type, plus quantization of int tensors."""

    shape: tuple[int, ...]
    dtype: DType
    quant: QuantParams | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # Python ints: no int64 wrap-around on absurd shapes

    def with_shape(self, shape: tuple[int, ...]) -> TensorInfo:
        return TensorInfo(tuple(int(d) for d in shape), self.dtype, self.quant)

    def with_dtype(self, dtype: DType, quant: QuantParams | None = None) -> TensorInfo:
        return TensorInfo(self.shape, dtype, quant)

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        text = f"{self.dtype.name.lower()}[{dims}]"
        if self.quant is not None:
            q = self.quant
            if q.per_tensor:
                text += f" (s={q.scale[0]:.6g}, zp={q.zero_point[0]})"
            else:
                text += f" (per-channel axis {q.axis}, {len(q.scale)} scales)"
        return text
