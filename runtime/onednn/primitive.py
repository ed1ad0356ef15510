"""Primitive descriptors, primitives, and validated execution.

oneDNN does not check an execute call's argument set: on the AMX 1x1 convolution path
(brgconv_1x1:avx512_core_amx; jit_1x1 returns invalid_arguments instead) a missing scale argument
returns success and never writes dst (docs/onednn.md; reproduced in test_onednn_errors.py).
So every primitive computes, once at creation, the complete set of arguments it expects and
the memory descriptor each must have:

- SRC, SRC_1..3, MULTIPLE_SRC+i, WEIGHTS, BIAS, DST, MEAN, VARIANCE, SCALE, SHIFT, WORKSPACE,
  SCRATCHPAD: whatever the primitive descriptor reports through
  dnnl_primitive_desc_query_md(pd, exec_arg_md, arg) (the zero descriptor = not taken), except
  that layer normalization reports SCALE/SHIFT even when its flags leave them out (the C API
  has no query for argument usage), so those follow the flags;
- ATTR_SCALES | arg for every arg whose scales mask was set: f32 1-D (tag a) with one value per
  element of the arg's dims selected by the mask; ATTR_ZERO_POINTS | arg likewise, s32;
- ATTR_MULTIPLE_POST_OP(i) | SRC_1 for a binary post-op i (the pd's own md for it), and
  ATTR_MULTIPLE_POST_OP(i) | WEIGHTS for prelu post-op i (f32, dst dims selected by its mask).

`Primitive.execute` raises ValueError (naming the primitive and the args) for a missing arg, an
unexpected arg, or a memory whose descriptor differs, before any C call. `Primitive.bind` does
that check once and builds the dnnl_exec_arg_t array once, for repeated execution.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from ctypes import Array, byref, c_char_p, c_int, c_uint, c_void_p
from dataclasses import dataclass
from typing import Any

from qfuse.runtime.onednn._lib import C, ExecArg, Native, check, execute_preconverted, preconverted
from qfuse.runtime.onednn.attr import AttrInfo
from qfuse.runtime.onednn.enums import (
    Arg,
    DataType,
    FormatTag,
    NormFlags,
    PrimitiveKind,
    Query,
    Status,
    arg_name,
)
from qfuse.runtime.onednn.memory import Engine, Memory, MemoryDesc, Stream, default_stream

log = logging.getLogger(__name__)

_PLAIN_ARGS = (
    Arg.SRC_0, Arg.SRC_1, Arg.SRC_2, Arg.SRC_3, Arg.WEIGHTS, Arg.BIAS, Arg.DST,
    Arg.DST_1, Arg.DST_2, Arg.WEIGHTS_1, Arg.WEIGHTS_2, Arg.WEIGHTS_3,  # RNN's
    Arg.MEAN, Arg.VARIANCE, Arg.SCALE, Arg.SHIFT, Arg.WORKSPACE, Arg.SCRATCHPAD,
)
_MAX_MULTIPLE_SRC = 1024


@dataclass(frozen=True)
class ExpectedArg:
    """One argument a primitive needs. `exact`: the bound md must equal `md`; otherwise only
    its data type and element count must match (prelu post-op weights)."""

    arg: int
    md: MemoryDesc
    exact: bool = True

    def mismatch(self, md: MemoryDesc) -> str | None:
        if self.exact:
            return None if md == self.md else f"expected {self.md.describe()}"
        if md.dtype != self.md.dtype or md.nelems != self.md.nelems or md.size != self.md.size:
            return f"expected dense {self.md.dtype.name} with {self.md.nelems} elements"
        return None


def _masked_dims(dims: tuple[int, ...], mask: int) -> tuple[int, ...]:
    return tuple(d if mask >> i & 1 else 1 for i, d in enumerate(dims))


class PrimitiveDesc(Native):
    """An owned dnnl_primitive_desc_t plus the attribute snapshot it was created with."""

    def __init__(self, handle: c_void_p, kind: PrimitiveKind, attr: AttrInfo, engine: Engine,
                 detail: str = "") -> None:
        self._own(handle, C.dnnl_primitive_desc_destroy)
        self.kind = kind
        self.attr = attr
        self.engine = engine
        self.detail = detail


    @functools.cached_property
    def impl_name(self) -> str:
        """The implementation oneDNN picked, e.g. 'brg:avx512_core_amx' or 'ref:any'."""
        text = c_char_p()
        check(C.dnnl_primitive_desc_query(self.handle, Query.impl_info_str, 0, byref(text)),
              "dnnl_primitive_desc_query", "impl_info_str")
        return (text.value or b"").decode()

    def next_impl(self) -> bool:
        """Advance in place to the next implementation that accepts this descriptor (its
        formats may change when created with ``any``); False after the last one."""
        status = C.dnnl_primitive_desc_next_impl(self.handle)
        if status == Status.last_impl_reached:
            return False
        check(status, "dnnl_primitive_desc_next_impl", self.impl_name)
        self.__dict__.pop("impl_name", None)
        self.__dict__.pop("expected_args", None)
        return True

    def _query_uint(self, query: Query) -> int:
        value = c_uint()
        check(C.dnnl_primitive_desc_query(self.handle, query, 0, byref(value)),
              "dnnl_primitive_desc_query", query.name)
        return value.value

    def md(self, query: Query, index: int = 0) -> MemoryDesc | None:
        """An owned copy of a queried descriptor (src_md, weights_md, ...); None if absent."""
        return MemoryDesc.clone_of(C.dnnl_primitive_desc_query_md(self.handle, query, index))

    def arg_md(self, arg: int) -> MemoryDesc | None:
        """The descriptor of execution argument `arg`; None when the primitive does not take it."""
        return self.md(Query.exec_arg_md, int(arg))

    @property
    def src_md(self) -> MemoryDesc | None:
        return self.md(Query.src_md)

    @property
    def weights_md(self) -> MemoryDesc | None:
        return self.md(Query.weights_md)

    @property
    def dst_md(self) -> MemoryDesc | None:
        return self.md(Query.dst_md)

    @property
    def scratchpad_md(self) -> MemoryDesc | None:
        return self.md(Query.scratchpad_md)

    @property
    def name(self) -> str:
        return f"{self.kind.name} ({self.impl_name})"

    @functools.cached_property
    def expected_args(self) -> dict[int, ExpectedArg]:
        """Every argument execute needs, with its descriptor (see the module docstring)."""
        expected: dict[int, ExpectedArg] = {}
        for arg in _PLAIN_ARGS:
            if (md := self.arg_md(arg)) is not None:
                expected[int(arg)] = ExpectedArg(int(arg), md)
        if self.kind == PrimitiveKind.layer_normalization:
            # exec_arg_md reports the scale/shift descriptor whether or not the flags use it
            flags = self._query_uint(Query.flags)
            for arg, flag in ((Arg.SCALE, NormFlags.use_scale), (Arg.SHIFT, NormFlags.use_shift)):
                if not flags & flag:
                    expected.pop(int(arg), None)
        for index in range(_MAX_MULTIPLE_SRC):
            if (md := self.arg_md(Arg.multiple_src(index))) is None:
                break
            expected[Arg.multiple_src(index)] = ExpectedArg(Arg.multiple_src(index), md)
        for prefix, masks, dtype in ((Arg.ATTR_SCALES, self.attr.scales_masks, DataType.f32),
                                     (Arg.ATTR_ZERO_POINTS, self.attr.zero_points_masks,
                                      DataType.s32)):
            for arg, mask in masks:
                if arg not in expected:
                    raise ValueError(f"{self.name}: {prefix.name} set for {arg_name(arg)}, "
                                     "an argument this primitive does not take")
                count = math.prod(_masked_dims(expected[arg].md.dims, mask))
                key = int(prefix) | arg
                expected[key] = ExpectedArg(key, MemoryDesc.from_tag((count,), dtype,
                                                                     FormatTag.a))
        for index, post_op in enumerate(self.attr.post_ops):
            if post_op.kind == "binary":
                key = Arg.post_op(index, Arg.SRC_1)
                md = self.arg_md(key) or post_op.src1_md
                assert md is not None
                expected[key] = ExpectedArg(key, md)
            elif post_op.kind == "prelu":
                key = Arg.post_op(index, Arg.WEIGHTS)
                dst = expected[int(Arg.DST)].md
                md = MemoryDesc.from_tag(_masked_dims(dst.dims, post_op.mask), DataType.f32)
                expected[key] = ExpectedArg(key, md, exact=False)
        return expected

    def check_args(self, args: Mapping[int, Memory]) -> None:
        """Raise ValueError unless `args` is exactly the expected set with matching mds."""
        expected = self.expected_args
        missing = [arg_name(a) for a in expected if a not in args]
        unexpected = [arg_name(a) for a in args if a not in expected]
        if missing or unexpected:
            raise ValueError(
                f"{self.name}: missing args {missing or '[]'}, unexpected args "
                f"{unexpected or '[]'}; expected {[arg_name(a) for a in expected]}")
        for arg, memory in args.items():
            if not isinstance(memory, Memory):
                raise TypeError(f"{self.name}: arg {arg_name(arg)} is a "
                                f"{type(memory).__name__}, not a Memory")
            problem = expected[arg].mismatch(memory.md)
            if problem:
                raise ValueError(f"{self.name}: arg {arg_name(arg)} is "
                                 f"{memory.md.describe()}, {problem}")

    def create(self) -> Primitive:
        """Create (and JIT-compile) the primitive: do this at compile time, not per run."""
        return Primitive(self)

    def __repr__(self) -> str:
        return f"PrimitiveDesc({self.name}; {self.attr.describe()})"


class Primitive(Native):
    """A created dnnl_primitive_t; keeps its PrimitiveDesc for validation and queries."""

    def __init__(self, pd: PrimitiveDesc) -> None:
        self.pd = pd
        _ = pd.expected_args  # compute while creating, not on the first execute
        handle = c_void_p()
        check(C.dnnl_primitive_create(byref(handle), pd.handle), "dnnl_primitive_create",
              pd.name)
        self._own(handle, C.dnnl_primitive_destroy)


    @property
    def name(self) -> str:
        return self.pd.name

    @property
    def impl_name(self) -> str:
        return self.pd.impl_name

    def scratchpad(self) -> Memory | None:
        """A new memory for the SCRATCHPAD argument, or None if the primitive needs none."""
        expected = self.pd.expected_args.get(int(Arg.SCRATCHPAD))
        return Memory(expected.md, engine=self.pd.engine) if expected else None

    def with_scratchpad(self, args: Mapping[int, Memory]) -> dict[int, Memory]:
        """`args` plus a new scratchpad memory if the primitive needs one."""
        scratchpad = self.scratchpad()
        full = dict(args)
        if scratchpad is not None:
            full[int(Arg.SCRATCHPAD)] = scratchpad
        return full

    def execute(self, args: Mapping[int, Memory], stream: Stream | None = None, *,
                wait: bool = True) -> None:
        """Validate `args` (ValueError before any C call), execute, and wait on the stream."""
        self.pd.check_args(args)
        _run(self, _exec_args(args), stream or default_stream(), wait)

    def bind(self, args: Mapping[int, Memory]) -> BoundPrimitive:
        """Validate `args` once and prepare the C argument array for repeated execution."""
        self.pd.check_args(args)
        return BoundPrimitive(self, dict(args))

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


class BoundPrimitive:
    """A primitive with a fixed, validated argument binding (the runtime's fast path).

    Holds references to the bound memories, so their buffers stay alive while it exists."""

    def __init__(self, primitive: Primitive, args: dict[int, Memory]) -> None:
        self.primitive = primitive
        self.args = args
        self._exec_args = _exec_args(args)

    def execute(self, stream: Stream | None = None, *, wait: bool = True) -> None:
        _run(self.primitive, self._exec_args, stream or default_stream(), wait)

    def call(self, stream: Stream) -> tuple[Callable[..., int], tuple[Any, ...]]:
        """``(function, arguments)``: ``function(*arguments)`` executes the primitive on
        ``stream`` and returns its dnnl_status_t (0: success), the arguments converted to
        ctypes once (``_lib.execute_preconverted``). They hold the handles' values, not the
        objects: the caller keeps this BoundPrimitive (its memories) alive while it calls."""
        return execute_preconverted, preconverted(
            c_void_p(self.primitive.handle.value), c_void_p(stream.handle.value),
            c_int(len(self._exec_args)), self._exec_args)

    def runner(self, stream: Stream) -> Callable[[], None]:
        """A closure that only calls ``dnnl_primitive_execute`` (no wait; a status other than
        success raises), ~1 us less per kernel than ``execute`` (``call``). On the CPU engine
        (OpenMP runtime) execute returns when the work is done."""
        execute, arguments = self.call(stream)

        def run() -> None:
            status = execute(*arguments)
            if status:  # naming self keeps the bound memories (their C handles) alive
                check(status, "dnnl_primitive_execute", self.primitive.name)

        return run


def _exec_args(args: Mapping[int, Memory]) -> Array[ExecArg]:
    return (ExecArg * len(args))(*(ExecArg(int(a), m.handle.value) for a, m in args.items()))


def _run(primitive: Primitive, exec_args: Array[ExecArg], stream: Stream, wait: bool) -> None:
    count = len(exec_args)
    check(C.dnnl_primitive_execute(primitive.handle, stream.handle, count, exec_args),
          "dnnl_primitive_execute", primitive.name)
    if wait:
        stream.wait()
