"""Errors users can act on: DnnlError names the C call and the status; argument problems raise
ValueError (or TypeError) before any C call; nothing takes the process down."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    DnnlError,
    FormatTag,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    Status,
    _lib,
    binary,
    convolution,
    pooling,
)

ROOT = Path(__file__).resolve().parents[2]


def u8(*dims: int, tag: FormatTag | None = None) -> MemoryDesc:
    return MemoryDesc.from_tag(dims, DataType.u8, tag)


def f32(*dims: int) -> MemoryDesc:
    return MemoryDesc.from_tag(dims, DataType.f32)


def test_mismatched_dims_raise_dnnl_error() -> None:
    with pytest.raises(DnnlError) as info:
        convolution(f32(1, 8, 5, 5), f32(4, 6, 3, 3), f32(1, 4, 3, 3))
    error = info.value
    assert error.call == "dnnl_convolution_forward_primitive_desc_create"
    assert error.status == Status.invalid_arguments
    assert "invalid_arguments" in str(error) and "weights=f32 (4, 6, 3, 3)" in str(error)
    with pytest.raises(DnnlError, match="dnnl_binary_primitive_desc_create.*invalid_arguments"):
        binary(Alg.binary_add, f32(2, 3), f32(3, 2), f32(2, 3))
    with pytest.raises(DnnlError, match="dnnl_memory_desc_create_with_tag.*tag=abcd"):
        MemoryDesc.from_tag((2, 3, 4), DataType.f32, FormatTag.abcd)


def test_unsupported_combinations_raise_dnnl_error() -> None:
    s8_weights = MemoryDesc.from_tag((4, 8, 3, 3), DataType.s8)
    with pytest.raises(DnnlError) as info:  # f32 activations with int8 weights
        convolution(f32(1, 8, 5, 5), s8_weights, f32(1, 4, 3, 3))
    assert info.value.call == "dnnl_convolution_forward_primitive_desc_create"
    attr = PrimitiveAttr().set_zero_points_mask(Arg.WEIGHTS, 0)  # conv: no weight zero points
    with pytest.raises(DnnlError) as info:
        convolution(u8(1, 8, 5, 5), s8_weights, u8(1, 4, 3, 3), attr=attr)
    assert info.value.status == Status.unimplemented
    with pytest.raises(DnnlError, match="dnnl_primitive_attr_set_scales_mask.*arg=BIAS"):
        PrimitiveAttr().set_scales_mask(Arg.BIAS, 0)


def test_python_side_argument_checks() -> None:
    with pytest.raises(ValueError, match="dims must be positive"):
        f32(2, 0)
    with pytest.raises(ValueError, match="1..12 dims"):
        MemoryDesc.from_tag((1,) * 13, DataType.f32)
    with pytest.raises(ValueError, match="more than"):  # oneDNN's size_t would wrap around
        MemoryDesc.from_tag((2**40, 2**30), DataType.f32)
    with pytest.raises(ValueError, match="not an eltwise"):
        PostOps().append_eltwise(Alg.binary_add)
    with pytest.raises(ValueError, match="not a binary"):
        PostOps().append_binary(Alg.eltwise_relu, f32(1, 4, 1, 1))
    with pytest.raises(ValueError, match="not a pooling"):
        pooling(Alg.eltwise_relu, f32(1, 1, 4, 4), f32(1, 1, 2, 2), kernel=(2, 2))
    with pytest.raises(ValueError, match="strides needs 2 spatial values"):
        convolution(f32(1, 8, 5, 5), f32(4, 8, 3, 3), f32(1, 4, 3, 3), strides=(1,))


@pytest.fixture
def no_execute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if dnnl_primitive_execute is reached."""
    def forbidden(*_: object) -> int:
        raise AssertionError("dnnl_primitive_execute was called")
    monkeypatch.setattr(_lib.C, "dnnl_primitive_execute", forbidden)


def int8_1x1_conv() -> tuple:
    """The AMX 1x1 path where a missing scale argument silently writes nothing."""
    src, dst = u8(1, 32, 4, 4, tag=FormatTag.nhwc), u8(1, 32, 4, 4, tag=FormatTag.nhwc)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, 1)
            .set_scales_mask(Arg.DST, 0).set_zero_points_mask(Arg.SRC, 0))
    pd = convolution(src, MemoryDesc.from_tag((32, 32, 1, 1), DataType.s8, FormatTag.any), dst,
                     attr=attr)
    primitive = pd.create()
    args = {Arg.SRC: Memory(src), Arg.WEIGHTS: Memory(pd.weights_md), Arg.DST: Memory(dst),
            Arg.scales(Arg.SRC): Memory.scales(1.0), Arg.scales(Arg.DST): Memory.scales(1.0),
            Arg.scales(Arg.WEIGHTS): Memory.scales(np.ones(32)),
            Arg.zero_points(Arg.SRC): Memory.zero_points(0)}
    return primitive, primitive.with_scratchpad(args)


@pytest.mark.usefixtures("no_execute")
def test_execute_checks_the_argument_set() -> None:
    primitive, args = int8_1x1_conv()
    missing = {k: v for k, v in args.items() if k != Arg.scales(Arg.WEIGHTS)}
    with pytest.raises(ValueError, match=r"convolution \(.*\): missing args "
                                         r"\['ATTR_SCALES\|WEIGHTS'\]"):
        primitive.execute(missing)
    extra = {**args, Arg.BIAS: Memory.from_array(np.zeros(32, np.float32))}
    with pytest.raises(ValueError, match=r"unexpected args \['BIAS'\]"):
        primitive.execute(extra)
    with pytest.raises(ValueError, match="missing args"):
        primitive.bind(missing)


@pytest.mark.usefixtures("no_execute")
def test_execute_checks_each_descriptor() -> None:
    primitive, args = int8_1x1_conv()
    cases = {
        Arg.scales(Arg.WEIGHTS): Memory.zero_points(np.ones(32)),  # s32 scales: silent no-op
        Arg.scales(Arg.DST): Memory.scales(np.ones(2)),  # wrong length
        Arg.zero_points(Arg.SRC): Memory.scales(0.0),  # f32 zero point
        Arg.SRC: Memory(u8(1, 32, 4, 4)),  # nchw where the primitive wants nhwc
        Arg.WEIGHTS: Memory(MemoryDesc.from_tag((32, 32, 1, 1), DataType.s8)),  # plain, no reorder
        Arg.DST: Memory(MemoryDesc.from_tag((1, 32, 4, 4), DataType.s8, FormatTag.nhwc)),
    }
    for arg, wrong in cases.items():
        with pytest.raises(ValueError, match=r"arg .* is .*expected"):
            primitive.execute({**args, arg: wrong})
    with pytest.raises(TypeError, match="not a Memory"):
        primitive.execute({**args, Arg.SRC: np.zeros((1, 32, 4, 4), np.uint8)})


def test_memory_refuses_bad_buffers() -> None:
    md = f32(2, 3)
    with pytest.raises(ValueError, match="has 20 bytes"):
        Memory(md, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="dtype int32 does not match"):
        Memory(md, np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        Memory(md, np.zeros((3, 2), np.float32).T)
    readonly = np.zeros((2, 3), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        Memory(md, readonly)
    with pytest.raises(TypeError, match="numpy array"):
        Memory(md, bytearray(24))  # type: ignore[arg-type]
    memory = Memory(md)
    with pytest.raises(ValueError, match="cannot write float64"):
        memory.write(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"cannot write float32 \(3, 2\)"):
        memory.write(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        Memory.from_array(np.zeros((4, 4), np.float32)[:, ::2])


def test_blocked_memory_has_no_numpy_view() -> None:
    pd = convolution(u8(1, 32, 4, 4, tag=FormatTag.nhwc),
                     MemoryDesc.from_tag((32, 32, 3, 3), DataType.s8, FormatTag.any),
                     u8(1, 32, 2, 2, tag=FormatTag.nhwc))
    weights = Memory(pd.weights_md)
    assert not weights.md.is_plain
    with pytest.raises(ValueError, match="not plain; reorder"):
        _ = weights.array


NASTY = textwrap.dedent("""
    import gc
    import numpy as np
    from qfuse.runtime.onednn import *

    def attempt(label, action):
        try:
            action()
            print(label, "ok")
        except Exception as error:  # noqa: BLE001 - report every kind
            print(label, type(error).__name__, str(error).splitlines()[0][:120])

    src = MemoryDesc.from_tag((1, 32, 4, 4), DataType.u8, FormatTag.nhwc)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, 1)
            .set_scales_mask(Arg.DST, 0))
    pd = convolution(src, MemoryDesc.from_tag((32, 32, 1, 1), DataType.s8, FormatTag.any), src,
                     attr=attr)
    conv = pd.create()
    weights_md = pd.weights_md
    del pd, attr  # the primitive and the cloned md outlive them
    gc.collect()
    base = {Arg.SRC: Memory(src), Arg.WEIGHTS: Memory(weights_md), Arg.DST: Memory(src)}
    attempt("missing-scales", lambda: conv.execute(conv.with_scratchpad(base)))
    scales = {Arg.scales(Arg.SRC): Memory.scales(1.0), Arg.scales(Arg.DST): Memory.scales(1.0),
              Arg.scales(Arg.WEIGHTS): Memory.zero_points(np.ones(32))}
    attempt("s32-scales", lambda: conv.execute(conv.with_scratchpad({**base, **scales})))
    attempt("garbage-arg", lambda: conv.execute({**base, 999999: base[Arg.SRC]}))
    attempt("huge-md", lambda: MemoryDesc.from_tag((2**31, 2**31, 2**31), DataType.f32))
    attempt("bad-enum", lambda: MemoryDesc.from_tag((2, 2), 99, FormatTag.ab))
    attempt("bad-tag", lambda: MemoryDesc.from_tag((2, 2), DataType.f32, 12345))
    attempt("bad-alg", lambda: eltwise(Alg.binary_add, src))
    attempt("bad-arg-index", lambda: PrimitiveAttr().set_scales_mask(-5, 0))
    attempt("late-isa", lambda: set_max_cpu_isa(CpuIsa.sse41))
    keep = [Memory(src) for _ in range(3)]  # alive at interpreter exit: destructors must cope
    print("end")
""")


def test_nasty_cases_do_not_crash_the_process() -> None:
    result = subprocess.run([sys.executable, "-c", NASTY], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["missing-scales"].startswith("ValueError") and "ATTR_SCALES|SRC" in (
        lines["missing-scales"])
    assert lines["s32-scales"].startswith("ValueError")
    assert lines["garbage-arg"].startswith("ValueError")
    assert lines["huge-md"].startswith("ValueError")
    assert lines["bad-enum"].startswith("ValueError")  # 99 is not a DataType
    assert lines["bad-tag"].startswith("ValueError")
    assert lines["bad-alg"].startswith("ValueError")
    assert lines["bad-arg-index"].startswith("ValueError")
    assert lines["late-isa"].startswith("DnnlError") and "invalid_arguments" in lines["late-isa"]
    assert result.stdout.rstrip().endswith("end")
    assert "Exception ignored" not in result.stderr, result.stderr


def test_why_execute_validates_scales() -> None:
    """The silent no-op of docs/onednn.md, reproduced under the binding: calling dnnl_primitive_execute
    directly without the weight scales returns success on brgconv_1x1:avx512_core_amx and
    leaves dst untouched (jit_1x1 returns invalid_arguments instead)."""
    from qfuse.runtime.onednn import default_stream, filled
    from qfuse.runtime.onednn.primitive import _exec_args

    src = u8(1, 32, 4, 4, tag=FormatTag.nhwc)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, 1)
            .set_scales_mask(Arg.DST, 0))
    pd = convolution(src, MemoryDesc.from_tag((32, 32, 1, 1), DataType.s8, FormatTag.any), src,
                     attr=attr)
    if not pd.impl_name.startswith("brgconv_1x1"):
        pytest.skip(f"the silent no-op was seen on brgconv_1x1 only, not {pd.impl_name}")
    conv = pd.create()
    dst = filled(src, np.full((1, 32, 4, 4), 77, np.uint8))
    args = conv.with_scratchpad({
        Arg.SRC: filled(src, np.ones((1, 32, 4, 4), np.uint8)), Arg.DST: dst,
        Arg.WEIGHTS: filled(pd.weights_md, np.ones((32, 32, 1, 1), np.int8)),
        Arg.scales(Arg.SRC): Memory.scales(1.0), Arg.scales(Arg.DST): Memory.scales(1.0)})
    raw = _exec_args(args)
    stream = default_stream()
    assert _lib.C.dnnl_primitive_execute(conv.handle, stream.handle, len(raw), raw) == 0
    stream.wait()
    assert np.all(dst.read() == 77)  # success, and nothing written
    with pytest.raises(ValueError, match="ATTR_SCALES"):
        conv.execute(args)
    conv.execute({**args, Arg.scales(Arg.WEIGHTS): Memory.scales(np.ones(32))})
    assert np.all(dst.read() == 32)
