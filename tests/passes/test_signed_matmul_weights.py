"""signed_matmul_weights: a u8 tensor read as int8 MatMul weights is written as s8 (zero point
- 128) by its producer (golden structure, declines, reference bit-identical)."""

from __future__ import annotations

import numpy as np
from fusion_helpers import S_X, ZP_X, add, feeds_for, int8_matmul, new_graph, reference, run

from qfuse.ir import DType, Graph, Op, QuantParams, TensorInfo
from qfuse.ir.chain import Fused, Quantize, Scale
from qfuse.ir.ops import SplitAttrs, TransposeAttrs
from qfuse.passes import signed_matmul_weights
from qfuse.passes.base import PassResult

S_K, ZP_K = 0.04, 131


def _quantize(scale: float, zp: int) -> Quantize:
    return Quantize((scale * (0 - zp),), (scale * (255 - zp),), (0.0,), (255.0,), 256,
                    DType.U8, scale=scale)


def attention_like(k_output: bool = False) -> Graph:
    """x (u8) → MatMul P (fused, quantize onto u8) → Transpose → weights of MatMul M."""
    graph = new_graph(shape=(2, 8, 8))
    p = int8_matmul(graph, "x", "k", n=8)
    assert p.fused is not None
    p.fused.chain.append(_quantize(S_K, ZP_K))
    graph.set_info("k", TensorInfo((2, 8, 8), DType.U8, QuantParams.make(S_K, ZP_K)))
    add(graph, Op.TRANSPOSE, ["k"], "kt", TransposeAttrs((0, 2, 1)))
    graph.add_input("a", TensorInfo((2, 8, 8), DType.U8, QuantParams.make(S_X, ZP_X)))
    m = add(graph, Op.MATMUL, ["a", "kt"], "y", info=TensorInfo((2, 8, 8), DType.F32))
    m.fused = Fused(chain=[Scale.of(np.float32(S_X) * np.float32(S_K))], src_zero_point=ZP_X,
                    wei_zero_point=ZP_K, absorbed=["y"])
    graph.outputs.append("y")
    if k_output:
        graph.outputs.append("k")
    return graph


def _run_exact(graph: Graph, changed: int) -> PassResult:
    feeds = feeds_for(graph)
    before = reference(graph, feeds)
    result = run(signed_matmul_weights, graph)
    assert result.changed == changed
    after = reference(graph, feeds)
    for name, array in before.items():
        if array.dtype == np.float32:
            np.testing.assert_array_equal(after[name], array)
    return result


def test_golden_shift_at_the_producer() -> None:
    graph = attention_like()
    _run_exact(graph, changed=1)
    p, m = graph.producer("k_s8"), graph.producer("y")
    assert p is not None and m is not None and p.fused is not None and m.fused is not None
    assert p.name == "k" and m.inputs == ["a", "kt_s8"]
    assert "k" not in graph.values and "kt" not in graph.values  # new values, new names
    last = p.fused.chain[-1]
    assert isinstance(last, Quantize)
    assert (last.output_low, last.output_high, last.dtype) == ((-128.0,), (127.0,), DType.S8)
    for value in ("k_s8", "kt_s8"):
        info = graph.info(value)
        assert info.dtype is DType.S8
        assert info.quant == QuantParams.make(S_K, ZP_K - 128)
    assert m.fused.wei_zero_point == ZP_K - 128


def test_values_are_shifted_exactly() -> None:
    graph = attention_like()
    feeds = feeds_for(graph)
    before = reference(graph, feeds)
    kt_before = _values(graph, feeds, "kt")
    run(signed_matmul_weights, graph)
    kt_after = _values(graph, feeds, "kt_s8")
    np.testing.assert_array_equal(kt_after.astype(np.int16), kt_before.astype(np.int16) - 128)
    np.testing.assert_array_equal(reference(graph, feeds)["y"], before["y"])


def _values(graph: Graph, feeds: dict[str, np.ndarray], name: str) -> np.ndarray:
    graph.outputs.append(name)
    try:
        return reference(graph, feeds)[name]
    finally:
        graph.outputs.remove(name)


def split_attention(a_reader: bool = True) -> Graph:
    """x (u8) → MatMul P (fused, quantize onto u8) → Split into q and k: q the source of MatMul
    M, k transposed its weights (EfficientViT-M0's cascaded attention); ``a_reader=False``:
    q is a graph output instead (a reader that cannot take s8)."""
    graph = new_graph(shape=(2, 8, 8))
    p = int8_matmul(graph, "x", "qk", n=16)
    assert p.fused is not None
    p.fused.chain.append(_quantize(S_K, ZP_K))
    quant = QuantParams.make(S_K, ZP_K)
    graph.set_info("qk", TensorInfo((2, 8, 16), DType.U8, quant))
    graph.add_node(Op.SPLIT, ["qk"], ["q", "k"], SplitAttrs(-1, (8, 8)), name="split",
                   infos=[TensorInfo((2, 8, 8), DType.U8, quant)] * 2)
    add(graph, Op.TRANSPOSE, ["k"], "kt", TransposeAttrs((0, 2, 1)))
    m = add(graph, Op.MATMUL, ["q", "kt"], "y", info=TensorInfo((2, 8, 8), DType.F32))
    m.fused = Fused(chain=[Scale.of(np.float32(S_K) * np.float32(S_K))], src_zero_point=ZP_K,
                    wei_zero_point=ZP_K, absorbed=["y"])
    graph.outputs.append("y")
    if not a_reader:
        graph.outputs.append("q")
    return graph


def test_through_a_split_every_part_shifts() -> None:
    """The projection P writes s8; both parts of the Split become s8 (zero point − 128), the
    matmul takes the 128 lower zero point on its source and its weights: no shift kernel for
    the weights, the same accumulator (bit-exact)."""
    graph = split_attention()
    _run_exact(graph, changed=1)
    m = graph.producer("y")
    assert m is not None and m.fused is not None
    assert m.inputs == ["q_s8", "kt_s8"]
    assert (m.fused.src_zero_point, m.fused.wei_zero_point) == (ZP_K - 128, ZP_K - 128)
    for value in ("qk_s8", "q_s8", "k_s8", "kt_s8"):
        assert graph.info(value).dtype is DType.S8
        assert graph.info(value).quant == QuantParams.make(S_K, ZP_K - 128)


def test_a_split_part_read_otherwise_declines() -> None:
    graph = split_attention(a_reader=False)
    result = _run_exact(graph, changed=0)
    assert "other readers" in result.declined[0].reason and graph.info("q").dtype is DType.U8


def test_other_reader_declines() -> None:
    graph = attention_like(k_output=True)
    result = _run_exact(graph, changed=0)
    assert [d.node for d in result.declined] == ["y"]
    assert "other readers" in result.declined[0].reason
    assert graph.info("k").dtype is DType.U8


def test_producer_must_be_a_fused_compute_node() -> None:
    graph = Graph("t")
    graph.add_input("w", TensorInfo((2, 8, 8), DType.U8, QuantParams.make(S_K, ZP_K)))
    graph.add_input("a", TensorInfo((2, 8, 8), DType.U8, QuantParams.make(S_X, ZP_X)))
    m = add(graph, Op.MATMUL, ["a", "w"], "y", info=TensorInfo((2, 8, 8), DType.F32))
    m.fused = Fused(chain=[Scale.of(S_X * S_K)], src_zero_point=ZP_X, wei_zero_point=ZP_K)
    graph.outputs.append("y")
    result = _run_exact(graph, changed=0)
    assert "not produced by a fused compute node" in result.declined[0].reason


def test_constant_weights_are_no_pattern() -> None:
    graph = new_graph(shape=(2, 8, 8))
    int8_matmul(graph, "x", "y", n=8)
    graph.outputs.append("y")
    result = _run_exact(graph, changed=0)
    assert result.declined == []
