"""Pooling: int8 max pooling, int8 average pooling with a fused chain (jit_int u8 → u8 with
post-ops, or the f32 route), float pooling; vs the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.chain import Fused, Scale
from qfuse.ir.ops import NoAttrs, PoolAttrs
from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import Alg, DataType, FormatTag, MemoryDesc, pooling
from tests.compiler.lower_helpers import (
    int_input,
    out_info,
    quantize_item,
    random_int,
    ref_eval,
    run_plan,
)

F32 = np.float32
U8, S8 = DType.U8, DType.S8


def _pool_attrs(k: int = 3, s: int = 2, p: int = 1, ceil: bool = False,
                include_pad: bool = False) -> PoolAttrs:
    return PoolAttrs((k, k), (s, s), (p, p, p, p), (1, 1), ceil, include_pad)


def _out(size: int, attrs: PoolAttrs) -> int:
    from qfuse.runtime.reference.ops_nn import window_out

    return window_out(size, attrs.kernel_shape[0], attrs.strides[0], 1, attrs.pads[0],
                      attrs.pads[2], attrs.ceil_mode)


@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("dtype", [U8, S8])
def test_int8_max_pool(dtype: DType, ceil: bool) -> None:
    g = Graph("maxpool")
    int_input(g, "x", (2, 16, 10, 10), dtype)
    attrs = _pool_attrs(ceil=ceil)
    o = _out(10, attrs)
    g.add_node(Op.MAX_POOL, ["x"], ["y"], attrs, infos=[TensorInfo((2, 16, o, o), dtype)])
    g.outputs.append("y")
    x = random_int(np.random.default_rng(0), (2, 16, 10, 10), dtype)
    out, plan = run_plan(g, {"x": x})
    np.testing.assert_array_equal(out["y"], ref_eval(g, {"x": x})["y"])
    pool = next(k for k in plan.kernels if k.kind == "pooling")
    assert pool.impl.startswith("jit_int"), pool.impl  # channels-last int8, not ref:any


def _int8_max_pool_impl(shape: tuple[int, ...], dtype: DataType) -> str:
    """The implementation oneDNN picks for a channels-last int8 2x2 max pooling on this CPU."""
    src = MemoryDesc.from_tag(shape, dtype, FormatTag.nhwc)
    out = (*shape[:2], shape[2] - 1, shape[3] - 1)
    dst = MemoryDesc.from_tag(out, dtype, FormatTag.nhwc)
    return pooling(Alg.pooling_max, src, dst, kernel=(2, 2), strides=(1, 1)).impl_name


@pytest.mark.parametrize(("channels", "hw"), [(48, (33, 34)), (72, (33, 34)), (64, (33, 34)),
                                         (48, (6, 20))])
@pytest.mark.parametrize("dtype", [U8, S8])
def test_int8_max_pool_with_a_channel_tail_pools_in_f32(dtype: DType, channels: int,
                                                        hw: tuple[int, int]) -> None:
    """oneDNN 3.2's AVX2 int8 pooling over more than 32 channels not a multiple of 32 takes
    about ten times the f32 pooling of the same values (lower_pool ``_channel_tail_is_slow``):
    the integers are converted, pooled in f32 and stored back, the same maximum. 64 channels,
    maps of fewer than TAIL_MIN_PIXELS output pixels (32x33 here is above, 5x19 below) and
    CPUs whose int8 pooling is not ``jit_int:avx2`` keep the int8 kernel."""
    from qfuse.compiler.lower.lower_pool import TAIL_MIN_PIXELS

    shape = (1, channels, *hw)
    out = (1, channels, hw[0] - 1, hw[1] - 1)
    g = Graph("maxpool_tail")
    int_input(g, "x", shape, dtype)
    attrs = PoolAttrs((2, 2), (1, 1), (0, 0, 0, 0), (1, 1), False, False)
    g.add_node(Op.MAX_POOL, ["x"], ["y"], attrs, infos=[TensorInfo(out, dtype)])
    g.outputs.append("y")
    x = random_int(np.random.default_rng(3), shape, dtype)
    result, plan = run_plan(g, {"x": x})
    np.testing.assert_array_equal(result["y"], ref_eval(g, {"x": x})["y"])
    [pool] = [k for k in plan.kernels if k.kind == "pooling"]
    onednn_type = DataType.u8 if dtype is U8 else DataType.s8
    assert 5 * 19 < TAIL_MIN_PIXELS <= 32 * 33
    in_f32 = (channels % 32 != 0 and hw != (6, 20)
              and _int8_max_pool_impl(shape, onednn_type) == "jit_int:avx2")
    assert pool.impl.startswith("jit:" if in_f32 else "jit_int"), pool.impl
    ops = [k.name for k in plan.kernels if k.info.role == "op"]  # not layout conversions
    assert len(ops) == (3 if in_f32 else 1), ops  # converted, pooled, stored


def _avg_graph(op: Op, src: DType, dst: DType, *, include_pad: bool = False, zp: int = 37,
               mode_shape: tuple[int, ...] = (2, 16, 9, 9)) -> tuple[Graph, dict]:
    g = Graph("avgpool")
    int_input(g, "x", mode_shape, src, 0.05, zp if src == U8 else -zp // 4)
    if op is Op.GLOBAL_AVG_POOL:
        attrs, oh = NoAttrs(), 1
    else:
        attrs = _pool_attrs(include_pad=include_pad)
        oh = _out(mode_shape[2], attrs)
    chain = [Scale.of(0.05)]
    if dst.is_integer:
        chain.append(quantize_item(0.0437, 11, dst))
    node = g.add_node(op, ["x"], ["y"], attrs, name="pool",
                      infos=[out_info((mode_shape[0], mode_shape[1], oh, oh), dst, 0.0437, 11)])
    node.fused = Fused(chain=chain, src_zero_point=g.info("x").quant.zero_point[0])
    g.outputs.append("y")
    x = random_int(np.random.default_rng(1), mode_shape, src)
    return g, {"x": x}


AVG_CASES = {
    "avg_u8_u8": (Op.AVG_POOL, U8, U8, False),
    "avg_include_pad_zp": (Op.AVG_POOL, U8, U8, True),
    "global_u8_u8": (Op.GLOBAL_AVG_POOL, U8, U8, False),
    "avg_s8_u8": (Op.AVG_POOL, S8, U8, False),
    "global_u8_f32": (Op.GLOBAL_AVG_POOL, U8, DType.F32, False),
    # 8 channels: oneDNN 3.2's int8 pooling on AVX2 is ref:any below one vector of channels,
    # so the pooling runs in f32 (jit) between a dequantize and a store; on AVX-512 it is jit
    "global_u8_u8_8ch": (Op.GLOBAL_AVG_POOL, U8, U8, False),
}
SHAPES = {"global_u8_u8_8ch": (1, 8, 12, 96)}


def _int8_global_pool_is_jit(shape: tuple[int, ...]) -> bool:
    """Has oneDNN a jit u8 average pooling over ``shape`` (channels-last) on this machine?
    With 8 channels: ref:any on AVX2 (less than one vector of int32), jit on AVX-512."""
    src = MemoryDesc.from_tag(shape, DataType.u8, FormatTag.nhwc)
    dst = MemoryDesc.from_tag((*shape[:2], 1, 1), DataType.u8, FormatTag.nhwc)
    pd = pooling(Alg.pooling_avg_exclude_padding, src, dst, kernel=shape[2:])
    return not pd.impl_name.startswith("ref")


@pytest.mark.parametrize("mode", ["fused", "unfused"])
@pytest.mark.parametrize("name", list(AVG_CASES))
def test_int8_avg_pool_with_chain(name: str, mode: str) -> None:
    op, src, dst, include_pad = AVG_CASES[name]
    g, feeds = _avg_graph(op, src, dst, include_pad=include_pad,
                          mode_shape=SHAPES.get(name, (2, 16, 9, 9)))
    out, plan = run_plan(g, feeds, mode=mode)
    expected = ref_eval(g, feeds)["y"]
    if dst == DType.F32:
        np.testing.assert_allclose(out["y"], expected, rtol=1e-5, atol=1e-6)
    else:
        worst, same = step_diff(out["y"], expected)
        assert worst <= 1 and same >= 0.999, (worst, same)
    pools = [k for k in plan.kernels if k.kind == "pooling"]
    assert len(pools) == 1 and not pools[0].impl.startswith("ref")
    ops = [k.name for k in plan.kernels if k.info.role == "op"]  # not layout conversions
    one_kernel = (mode == "fused" and src == dst and not include_pad
                  and (name not in SHAPES or _int8_global_pool_is_jit(SHAPES[name])))
    assert (len(ops) == 1) == one_kernel, ops


@pytest.mark.parametrize("kind", ["max", "avg_exclude", "avg_include", "avg_ceil", "global"])
def test_float_pooling(kind: str) -> None:
    g = Graph("fpool")
    g.add_input("x", TensorInfo((2, 8, 11, 11), DType.F32))
    if kind == "global":
        op, attrs, o = Op.GLOBAL_AVG_POOL, NoAttrs(), 1
    else:
        op = Op.MAX_POOL if kind == "max" else Op.AVG_POOL
        attrs = _pool_attrs(ceil=kind == "avg_ceil", include_pad=kind == "avg_include")
        o = _out(11, attrs)
    g.add_node(op, ["x"], ["y"], attrs, infos=[TensorInfo((2, 8, o, o), DType.F32)])
    g.outputs.append("y")
    x = np.random.default_rng(2).standard_normal((2, 8, 11, 11)).astype(F32)
    out, _ = run_plan(g, {"x": x})
    np.testing.assert_allclose(out["y"], ref_eval(g, {"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_ceil_mode_counted_padding_runs_in_numpy() -> None:
    g = Graph("ceil_include")
    g.add_input("x", TensorInfo((1, 4, 10, 10), DType.F32))
    attrs = _pool_attrs(k=3, s=2, p=0, ceil=True, include_pad=True)
    o = _out(10, attrs)
    g.add_node(Op.AVG_POOL, ["x"], ["y"], attrs, infos=[TensorInfo((1, 4, o, o), DType.F32)])
    g.outputs.append("y")
    x = np.random.default_rng(3).standard_normal((1, 4, 10, 10)).astype(F32)
    out, plan = run_plan(g, {"x": x})
    assert plan.kernels[-1].kind == "numpy"
    np.testing.assert_allclose(out["y"], ref_eval(g, {"x": x})["y"], rtol=1e-6)
