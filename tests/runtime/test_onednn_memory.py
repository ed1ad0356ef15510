"""Memory descriptors, memory objects and their lifetimes; bound (pre-packed) execution;
library settings (threads, version)."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    FormatKind,
    FormatTag,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    PrimitiveDesc,
    convolution,
    default_stream,
    eltwise,
    get_num_threads,
    set_num_threads,
    version,
)
from qfuse.runtime.onednn import _lib


def test_descriptor_queries() -> None:
    md = MemoryDesc.from_tag((2, 3, 4, 5), DataType.u8, FormatTag.nhwc)
    assert (md.ndims, md.dims, md.dtype, md.size) == (4, (2, 3, 4, 5), DataType.u8, 120)
    assert md.format_kind == FormatKind.blocked and md.is_plain
    assert md.strides == (60, 1, 15, 3)
    assert md.inner_blocks == ()
    same = MemoryDesc.from_strides((2, 3, 4, 5), DataType.u8, (60, 1, 15, 3))
    assert md == same and hash(md) == hash(same)
    assert md != MemoryDesc.from_tag((2, 3, 4, 5), DataType.u8)
    assert md != MemoryDesc.from_tag((2, 3, 4, 5), DataType.s8, FormatTag.nhwc)
    pitched = MemoryDesc.from_strides((2, 3), DataType.f32, (8, 1))  # row pitch 8
    assert pitched.size == 2 * 8 * 4 and pitched.is_plain  # oneDNN: dims[0] * strides[0]
    memory = Memory(pitched)
    memory.write(np.ones((2, 3), np.float32))
    assert memory.array.strides == (32, 4) and memory.read().sum() == 6


def test_any_layout_resolves_to_a_blocked_weights_descriptor() -> None:
    src = MemoryDesc.from_tag((1, 32, 8, 8), DataType.u8, FormatTag.nhwc)
    wei = MemoryDesc.from_tag((32, 32, 3, 3), DataType.s8, FormatTag.any)
    assert wei.format_kind == FormatKind.any
    attr = PrimitiveAttr().set_zero_points_mask(Arg.SRC, 0)  # needs compensation in weights
    pd = convolution(src, wei, MemoryDesc.from_tag((1, 32, 6, 6), DataType.u8, FormatTag.nhwc),
                     attr=attr)
    weights = pd.weights_md
    assert weights is not None and weights.format_kind == FormatKind.blocked
    assert weights.inner_blocks and not weights.is_plain
    assert weights.size > 32 * 32 * 9  # zero-point compensation stored after the values
    del pd
    gc.collect()
    assert weights.dims == (32, 32, 3, 3) and weights.size > 0  # the clone outlives the pd


def test_memory_keeps_its_numpy_buffer_alive() -> None:
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    alive = weakref.ref(values)
    memory = Memory.from_array(values)
    del values
    gc.collect()
    assert alive() is not None  # held by the Memory
    md = memory.md
    primitive = eltwise(Alg.eltwise_relu, md).create()
    out = Memory(md)
    primitive.execute(primitive.with_scratchpad({Arg.SRC: memory, Arg.DST: out}))
    np.testing.assert_array_equal(out.read(), np.maximum(np.arange(24) - 10, 0).reshape(2, 3, 4))
    del memory, primitive
    gc.collect()
    assert alive() is None  # released with it


def test_allocated_memory_is_aligned_zeroed_and_viewable() -> None:
    md = MemoryDesc.from_tag((3, 5), DataType.s32)
    memory = Memory(md)
    assert memory.data_ptr % 64 == 0
    assert np.all(memory.array == 0) and memory.array.dtype == np.int32
    memory.array[1, 2] = 7  # the view writes through
    assert memory.read()[1, 2] == 7
    nhwc = Memory(MemoryDesc.from_tag((1, 2, 2, 3), DataType.f32, FormatTag.nhwc))
    values = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    nhwc.write(values)
    np.testing.assert_array_equal(nhwc.read(), values)
    assert nhwc.read().flags.c_contiguous


def test_scale_and_zero_point_memories() -> None:
    scales = Memory.scales([0.5, 0.25])
    assert scales.md == MemoryDesc.from_tag((2,), DataType.f32, FormatTag.a)
    zero_point = Memory.zero_points(3)
    assert zero_point.md == MemoryDesc.from_tag((1,), DataType.s32, FormatTag.a)
    assert zero_point.read().tolist() == [3]


def test_expected_args_include_attr_and_post_op_args() -> None:
    src = MemoryDesc.from_tag((1, 16, 6, 6), DataType.u8, FormatTag.nhwc)
    per_channel = MemoryDesc.from_tag((1, 16, 1, 1), DataType.f32)
    post_ops = (PostOps().append_eltwise(Alg.eltwise_relu).append_binary(Alg.binary_mul,
                                                                          per_channel)
                .append_sum(0.5, 3).append_prelu(2))
    assert len(post_ops) == 4
    assert post_ops.names() == ["eltwise_relu", "binary_mul", "sum", "prelu"]
    attr = (PrimitiveAttr().set_scales_mask(Arg.WEIGHTS, 1).set_zero_points_mask(Arg.SRC, 0)
            .set_post_ops(post_ops))
    pd = convolution(src, MemoryDesc.from_tag((16, 16, 3, 3), DataType.s8, FormatTag.any), src,
                     padding_l=(1, 1), padding_r=(1, 1), attr=attr)
    expected = pd.expected_args
    assert expected[Arg.scales(Arg.WEIGHTS)].md.dims == (16,)
    assert expected[Arg.zero_points(Arg.SRC)].md.dtype == DataType.s32
    assert expected[Arg.post_op(1, Arg.SRC_1)].md == per_channel
    assert expected[Arg.post_op(3, Arg.WEIGHTS)].md.nelems == 16
    assert Arg.BIAS not in expected and Arg.SCRATCHPAD in expected


def test_bound_execution_reuses_the_binding() -> None:
    md = MemoryDesc.from_tag((4, 8), DataType.f32)
    primitive = eltwise(Alg.eltwise_linear, md, alpha=2.0, beta=1.0).create()
    src, dst = Memory(md), Memory(md)
    bound = primitive.bind(primitive.with_scratchpad({Arg.SRC: src, Arg.DST: dst}))
    for step in range(3):
        src.array[...] = step
        bound.execute()
        assert np.all(dst.array == 2 * step + 1)


def test_runner_keeps_the_binding_alive() -> None:
    md = MemoryDesc.from_tag((4, 8), DataType.f32)
    primitive = eltwise(Alg.eltwise_linear, md, alpha=2.0, beta=1.0).create()
    src, dst = Memory(md), Memory(md)
    run = primitive.bind(primitive.with_scratchpad({Arg.SRC: src, Arg.DST: dst})).runner(
        default_stream())
    gc.collect()  # the BoundPrimitive is only referenced by the closure
    src.array[...] = 3
    run()
    assert np.all(dst.array == 7)


def test_the_runner_passes_arguments_of_the_declared_types() -> None:
    """The run loop's execute has no argtypes (_lib.execute_preconverted): what it is given
    must already be the declared ctypes types, or ``preconverted`` refuses it."""
    md = MemoryDesc.from_tag((2, 3), DataType.f32)
    primitive = eltwise(Alg.eltwise_linear, md, alpha=2.0, beta=1.0).create()
    args = _lib.ExecArg * 2
    good = (ctypes.c_void_p(1), ctypes.c_void_p(2), ctypes.c_int(2), args())
    assert _lib.preconverted(*good) == good
    for index, bad in ((0, 1), (1, None), (2, 2), (3, (ctypes.c_int * 2)()), (3, None)):
        values = list(good)
        values[index] = bad
        with pytest.raises(TypeError, match=f"argument {index}"):
            _lib.preconverted(*values)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        _lib.preconverted(*good[:3])
    assert _lib.execute_preconverted.argtypes is None
    assert _lib.C.dnnl_primitive_execute.argtypes is not None  # the declared one is untouched
    src, dst = Memory(md), Memory(md)
    run = primitive.bind(primitive.with_scratchpad({Arg.SRC: src, Arg.DST: dst})).runner(
        default_stream())
    src.array[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    run()
    assert np.array_equal(dst.array, 2 * src.array + 1)


def test_next_impl_walks_the_implementation_list() -> None:
    def make() -> PrimitiveDesc:
        return convolution(MemoryDesc.from_tag((1, 16, 8, 8), DataType.u8, FormatTag.any),
                           MemoryDesc.from_tag((16, 16, 1, 1), DataType.s8, FormatTag.any),
                           MemoryDesc.from_tag((1, 16, 8, 8), DataType.u8, FormatTag.any))

    pd = make()
    names = [pd.impl_name]
    while pd.next_impl():
        names.append(pd.impl_name)
    assert names[0] == make().impl_name and names[-1] == "ref:any"
    assert len(names) > 1 and pd.impl_name == "ref:any"


def test_threads_and_version() -> None:
    info = version()
    assert (info.major, info.minor) == (3, 2)
    before = get_num_threads()
    try:
        set_num_threads(1)
        assert get_num_threads() == 1
    finally:
        set_num_threads(before)
    assert get_num_threads() == before
