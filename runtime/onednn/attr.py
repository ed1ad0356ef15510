"""Primitive attributes (scales, zero points, post-ops, scratchpad, fpmath) and post-op chains.

The int8 model these attributes express (oneDNN 3.x, per-argument scales, no output scales):

    acc = sum((src - zp_src) * wei)                   exact int32
    x   = f32(acc) * (s_src * s_wei[oc]) + bias       bias is not scaled
    x   = post_op_n(... post_op_0(x))                 f32, in append order
    dst = saturate(rint(x * (1 / s_dst)) + zp_dst)

Post-op semantics (3.2): eltwise `x = f(x; alpha, beta)`; sum `x = scale * (dst_prev - zp) + x`;
binary `x = op(x, src1)` with src1 broadcast from its dims (src1 passed at execute as
`ATTR_MULTIPLE_POST_OP(i) | SRC_1`, i = position in the whole chain); prelu
`x = x > 0 ? x : w * x` (weights at `ATTR_MULTIPLE_POST_OP(i) | WEIGHTS`).

Every setter checks its arguments first and records what it did only after the C call
succeeded, so the Python-side records always equal what oneDNN holds. The records let callers
list the chain and let `Primitive.execute` know which post-op arguments are required.
"""

from __future__ import annotations

import logging
from ctypes import byref, c_void_p
from dataclasses import dataclass

from qfuse.runtime.onednn._lib import C, Native, check
from qfuse.runtime.onednn.enums import (
    BINARY_ALGS,
    ELTWISE_ALGS,
    Alg,
    Arg,
    DataType,
    FpMathMode,
    ScratchpadMode,
    arg_name,
)
from qfuse.runtime.onednn.memory import MemoryDesc

log = logging.getLogger(__name__)

MAX_POST_OPS = 32  # oneDNN's post_ops_limit


@dataclass(frozen=True)
class PostOpRecord:
    """What one append_* call added to a post-op chain."""

    kind: str  # "eltwise", "sum", "binary" or "prelu"
    alg: Alg | None = None
    alpha: float = 0.0
    beta: float = 0.0
    scale: float = 1.0
    zero_point: int = 0
    dtype: DataType = DataType.undef
    src1_md: MemoryDesc | None = None
    mask: int = 0

    @property
    def name(self) -> str:
        """'eltwise_relu', 'sum', 'binary_mul', 'prelu' (the names `qfuse inspect` prints)."""
        if self.alg is None:
            return self.kind
        return self.alg.name

    def describe(self) -> str:
        if self.kind == "eltwise":
            return f"{self.name}(alpha={self.alpha:g}, beta={self.beta:g})"
        if self.kind == "sum":
            return f"sum(scale={self.scale:g}, zero_point={self.zero_point}, dt={self.dtype.name})"
        if self.kind == "binary":
            assert self.src1_md is not None
            return f"{self.name}(src1={self.src1_md.describe()})"
        return f"prelu(mask={self.mask})"


class PostOps(Native):
    """A dnnl_post_ops_t chain with a Python-side record of each append."""

    def __init__(self) -> None:
        handle = c_void_p()
        check(C.dnnl_post_ops_create(byref(handle)), "dnnl_post_ops_create")
        self._own(handle, C.dnnl_post_ops_destroy)
        self._records: list[PostOpRecord] = []


    def _room(self) -> None:
        if len(self._records) >= MAX_POST_OPS:
            raise ValueError(f"a post-op chain holds at most {MAX_POST_OPS} entries")

    def append_eltwise(self, alg: Alg, alpha: float = 0.0, beta: float = 0.0) -> PostOps:
        """Append `x = alg(x; alpha, beta)` (relu: alpha = negative slope)."""
        if alg not in ELTWISE_ALGS:
            raise ValueError(f"{alg!r} is not an eltwise algorithm")
        self._room()
        check(C.dnnl_post_ops_append_eltwise(self.handle, alg, alpha, beta),
              "dnnl_post_ops_append_eltwise", f"{Alg(alg).name} alpha={alpha} beta={beta}")
        self._records.append(PostOpRecord("eltwise", Alg(alg), alpha=float(alpha),
                                          beta=float(beta)))
        return self

    def append_sum(self, scale: float = 1.0, zero_point: int = 0,
                   dtype: DataType = DataType.undef) -> PostOps:
        """Append `x = scale * (dst_prev - zero_point) + x` (dtype undef: dst's data type)."""
        self._room()
        check(C.dnnl_post_ops_append_sum(self.handle, scale, int(zero_point), DataType(dtype)),
              "dnnl_post_ops_append_sum", f"scale={scale} zero_point={zero_point}")
        self._records.append(PostOpRecord("sum", scale=float(scale), zero_point=int(zero_point),
                                          dtype=DataType(dtype)))
        return self

    def append_binary(self, alg: Alg, src1_md: MemoryDesc) -> PostOps:
        """Append `x = alg(x, src1)`; src1 broadcasts from its dims ({1,C,1,1}: per channel)."""
        if alg not in BINARY_ALGS:
            raise ValueError(f"{alg!r} is not a binary algorithm")
        self._room()
        check(C.dnnl_post_ops_append_binary(self.handle, alg, src1_md.handle),
              "dnnl_post_ops_append_binary", f"{Alg(alg).name} src1={src1_md.describe()}")
        self._records.append(PostOpRecord("binary", Alg(alg), src1_md=src1_md))
        return self

    def append_prelu(self, mask: int) -> PostOps:
        """Append `x = x > 0 ? x : w * x`, w f32 over the dst dims selected by `mask`."""
        if mask < 0:
            raise ValueError(f"prelu mask must be >= 0, got {mask}")
        self._room()
        check(C.dnnl_post_ops_append_prelu(self.handle, mask), "dnnl_post_ops_append_prelu",
              f"mask={mask}")
        self._records.append(PostOpRecord("prelu", mask=int(mask)))
        return self

    def __len__(self) -> int:
        length = int(C.dnnl_post_ops_len(self.handle))
        assert length == len(self._records), "post-op records out of sync with oneDNN"
        return length

    @property
    def records(self) -> tuple[PostOpRecord, ...]:
        return tuple(self._records)

    def names(self) -> list[str]:
        return [r.name for r in self._records]

    def __repr__(self) -> str:
        return f"PostOps([{', '.join(r.describe() for r in self._records)}])"


@dataclass(frozen=True)
class AttrInfo:
    """Snapshot of an attribute at primitive-descriptor creation (what execute must bind)."""

    scales_masks: tuple[tuple[int, int], ...] = ()
    zero_points_masks: tuple[tuple[int, int], ...] = ()
    post_ops: tuple[PostOpRecord, ...] = ()
    scratchpad_user: bool = True
    fpmath: FpMathMode | None = None

    def describe(self) -> str:
        parts = [f"scales[{arg_name(a)}]=mask {m}" for a, m in self.scales_masks]
        parts += [f"zero_points[{arg_name(a)}]=mask {m}" for a, m in self.zero_points_masks]
        parts += [r.describe() for r in self.post_ops]
        return ", ".join(parts) or "default attributes"


class PrimitiveAttr(Native):
    """A dnnl_primitive_attr_t. Scratchpad mode is `user` by default: the scratchpad is then an
    explicit execute argument (ARG SCRATCHPAD) that the runtime can share between primitives."""

    def __init__(self, *, scratchpad_user: bool = True, fpmath: FpMathMode | None = None) -> None:
        handle = c_void_p()
        check(C.dnnl_primitive_attr_create(byref(handle)), "dnnl_primitive_attr_create")
        self._own(handle, C.dnnl_primitive_attr_destroy)
        self._scales: dict[int, int] = {}
        self._zero_points: dict[int, int] = {}
        self._post_ops: tuple[PostOpRecord, ...] = ()
        self._scratchpad_user = False
        self._fpmath: FpMathMode | None = None
        if scratchpad_user:
            check(C.dnnl_primitive_attr_set_scratchpad_mode(handle, ScratchpadMode.user),
                  "dnnl_primitive_attr_set_scratchpad_mode", "user")
            self._scratchpad_user = True
        if fpmath is not None:
            self.set_fpmath_mode(fpmath)


    def set_scales_mask(self, arg: int, mask: int) -> PrimitiveAttr:
        """Scales of `arg` are a runtime f32 input at ATTR_SCALES | arg; mask 0 = one value."""
        _check_arg_mask(arg, mask)
        check(C.dnnl_primitive_attr_set_scales_mask(self.handle, int(arg), int(mask)),
              "dnnl_primitive_attr_set_scales_mask", f"arg={arg_name(arg)} mask={mask}")
        self._scales[int(arg)] = int(mask)
        return self

    def set_zero_points_mask(self, arg: int, mask: int) -> PrimitiveAttr:
        """Zero points of `arg` are a runtime s32 input at ATTR_ZERO_POINTS | arg."""
        _check_arg_mask(arg, mask)
        check(C.dnnl_primitive_attr_set_zero_points_mask(self.handle, int(arg), int(mask)),
              "dnnl_primitive_attr_set_zero_points_mask", f"arg={arg_name(arg)} mask={mask}")
        self._zero_points[int(arg)] = int(mask)
        return self

    def set_post_ops(self, post_ops: PostOps) -> PrimitiveAttr:
        """Copy `post_ops` into the attribute (later appends to `post_ops` do not apply)."""
        check(C.dnnl_primitive_attr_set_post_ops(self.handle, post_ops.handle),
              "dnnl_primitive_attr_set_post_ops", repr(post_ops))
        self._post_ops = post_ops.records
        return self

    def set_fpmath_mode(self, mode: FpMathMode) -> PrimitiveAttr:
        check(C.dnnl_primitive_attr_set_fpmath_mode(self.handle, FpMathMode(mode)),
              "dnnl_primitive_attr_set_fpmath_mode", FpMathMode(mode).name)
        self._fpmath = FpMathMode(mode)
        return self

    @property
    def scales_masks(self) -> dict[int, int]:
        return dict(self._scales)

    @property
    def zero_points_masks(self) -> dict[int, int]:
        return dict(self._zero_points)

    @property
    def post_ops(self) -> tuple[PostOpRecord, ...]:
        return self._post_ops

    def info(self) -> AttrInfo:
        return AttrInfo(tuple(self._scales.items()), tuple(self._zero_points.items()),
                        self._post_ops, self._scratchpad_user, self._fpmath)

    def __repr__(self) -> str:
        return f"PrimitiveAttr({self.info().describe()})"


def _check_arg_mask(arg: int, mask: int) -> None:
    if int(arg) <= 0 or int(arg) >= int(Arg.ATTR_SCALES):
        raise ValueError(f"argument index {arg} cannot carry scales or zero points")
    if int(mask) < 0:
        raise ValueError(f"mask must be >= 0, got {mask}")
