"""drop_identity: Identity / Dropout bypassed, graph output names kept, declines recorded.

Numerics: the rewrite is exact, so the reference outputs are bit-identical before and after.
"""

from __future__ import annotations

import numpy as np
from cleanup_harness import apply, assert_bit_exact, before_after, finish, op_sequence, reasons

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.ops import SplitAttrs
from qfuse.passes import drop_identity


def chain(*ops: Op) -> Graph:
    """x -> Relu -> ops... -> Relu -> y."""
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    value = g.add_node(Op.RELU, ["x"], ["r0"], name="relu0").outputs[0]
    for i, op in enumerate(ops):
        value = g.add_node(op, [value], [f"v{i}"], name=f"n{i}").outputs[0]
    g.add_node(Op.RELU, [value], ["y"], name="relu1")
    return finish(g, ["y"])


def test_identity_and_dropout_are_bypassed() -> None:
    g = chain(Op.IDENTITY, Op.DROPOUT, Op.IDENTITY)
    result, pairs = before_after(drop_identity, g)
    assert result.changed == 3 and not result.declined
    assert op_sequence(g) == ["Relu", "Relu"]
    assert g.node("relu1").inputs == ["r0"]
    assert_bit_exact(pairs)


def test_nothing_to_do() -> None:
    g = chain()
    assert apply(drop_identity, g).changed == 0
    assert op_sequence(g) == ["Relu", "Relu"]


def test_graph_output_name_survives() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_node(Op.RELU, ["x"], ["r"], name="relu")
    g.add_node(Op.SIGMOID, ["r"], ["s"], name="other_reader")
    g.add_node(Op.IDENTITY, ["r"], ["y"], name="id")
    finish(g, ["y", "s"])
    result, pairs = before_after(drop_identity, g)
    assert result.changed == 1
    assert g.outputs == ["y", "s"]
    relu = g.producer("y")
    assert relu is not None and relu.name == "relu" and relu.op is Op.RELU
    assert relu.origin == ["relu", "id"]
    assert "r" not in g.values and g.node("other_reader").inputs == ["y"]
    assert_bit_exact(pairs)


def test_identity_chain_into_graph_output() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((4,), DType.F32))
    g.add_node(Op.TANH, ["x"], ["t"], name="tanh")
    g.add_node(Op.IDENTITY, ["t"], ["i1"], name="id1")
    g.add_node(Op.DROPOUT, ["i1"], ["out"], name="drop")
    finish(g, ["out"])
    result, pairs = before_after(drop_identity, g)
    assert result.changed == 2
    assert op_sequence(g) == ["Tanh"] and g.producer("out").name == "tanh"
    assert_bit_exact(pairs)


def test_multi_output_producer_keeps_its_other_outputs() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((4, 6), DType.F32))
    g.add_node(Op.SPLIT, ["x"], ["a", "b"], SplitAttrs(1, (2, 4)), name="split")
    g.add_node(Op.IDENTITY, ["b"], ["y"], name="id")
    g.add_node(Op.RELU, ["a"], ["z"], name="relu")
    finish(g, ["z", "y"])
    result, pairs = before_after(drop_identity, g)
    assert result.changed == 1
    assert g.producer("y").name == "split" and g.producer("y").outputs == ["a", "y"]
    assert g.node("relu").inputs == ["a"]
    assert_bit_exact(pairs)


def test_declines_when_input_is_a_graph_input() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2,), DType.F32))
    g.add_node(Op.IDENTITY, ["x"], ["y"], name="id")
    finish(g, ["y"])
    result = apply(drop_identity, g)
    assert result.changed == 0
    assert reasons(result) == [
        "output 'y' is a graph output and its input 'x' is a graph input: both names must stay"
    ]
    assert op_sequence(g) == ["Identity"]


def test_declines_when_input_is_a_constant() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2,), DType.F32))
    g.add_constant("c", np.ones(2, np.float32))
    g.add_node(Op.IDENTITY, ["c"], ["y"], name="id")
    g.add_node(Op.RELU, ["x"], ["z"], name="relu")
    finish(g, ["z", "y"])
    result = apply(drop_identity, g)
    assert result.changed == 0
    assert reasons(result) == [
        "output 'y' is a graph output and its input 'c' is a constant: both names must stay"
    ]


def test_declines_when_input_is_also_a_graph_output() -> None:
    g = Graph("t")
    g.add_input("x", TensorInfo((2,), DType.F32))
    g.add_node(Op.RELU, ["x"], ["r"], name="relu")
    g.add_node(Op.IDENTITY, ["r"], ["y"], name="id")
    finish(g, ["r", "y"])
    result = apply(drop_identity, g)
    assert result.changed == 0
    assert reasons(result) == [
        "output 'y' is a graph output and so is its input 'r': both names must stay"
    ]
    assert op_sequence(g) == ["Relu", "Identity"]


def _transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> Graph:
    from qfuse.ir.ops import TransposeAttrs

    g = Graph("t")
    g.add_input("x", TensorInfo(shape, DType.F32))
    g.add_node(Op.RELU, ["x"], ["r"], name="relu0")
    out = tuple(shape[p] for p in perm)
    g.add_node(Op.TRANSPOSE, ["r"], ["t"], TransposeAttrs(perm), name="tr",
               infos=[TensorInfo(out, DType.F32)])
    g.add_node(Op.RELU, ["t"], ["y"], name="relu1")
    return finish(g, ["y"])


def test_transpose_of_unit_dims_becomes_a_reshape() -> None:
    """[197, 1, 8] → [1, 197, 8] (batch-1 attention's transpose(0, 1)) and NCHW → NHWC of a
    1x1 image move no data: a Reshape with the Transpose's name, outputs bit-identical."""
    for shape, perm in (((197, 1, 8), (1, 0, 2)), ((1, 6, 1, 1), (0, 2, 3, 1))):
        g = _transpose(shape, perm)
        result, pairs = before_after(drop_identity, g)
        assert result.changed == 1
        assert op_sequence(g) == ["Relu", "Reshape", "Relu"]
        reshape = g.node("tr")
        assert reshape.op is Op.RESHAPE
        assert reshape.attrs.shape == tuple(shape[p] for p in perm)
        assert_bit_exact(pairs)


def test_transpose_that_moves_data_stays() -> None:
    for shape, perm in (((2, 3, 1), (1, 0, 2)), ((1, 6, 2, 2), (0, 2, 3, 1)),
                        ((2, 3), (0, 1))):
        g = _transpose(shape, perm)
        assert apply(drop_identity, g).changed == 0
        assert g.node("tr").op is Op.TRANSPOSE


def _normalize(reader: Op, port: int, out: tuple[int, ...] = (4, 3, 8)) -> Graph:
    """F.normalize's denominator: n = ReduceL2(x, -1) → Expand(n, out) → reader."""
    from qfuse.ir.ops import ExpandAttrs, ReduceAttrs

    g = Graph("t")
    g.add_input("x", TensorInfo((4, 3, 8), DType.F32))
    g.add_node(Op.REDUCE_L2, ["x"], ["n"], ReduceAttrs((2,), True), name="norm")
    g.add_node(Op.EXPAND, ["n"], ["e"], ExpandAttrs(out), name="expand")
    inputs = ["e"] if reader is Op.RELU else ["x", "e"] if port == 1 else ["e", "x"]
    g.add_node(reader, inputs, ["y"], name="reader")
    return finish(g, ["y"])


def test_an_expand_read_by_broadcasting_ops_is_bypassed() -> None:
    for op, port in ((Op.DIV, 1), (Op.SUB, 1), (Op.MUL, 0), (Op.ADD, 1)):
        g = _normalize(op, port)
        result, pairs = before_after(drop_identity, g)
        assert result.changed == 1, op
        assert op_sequence(g) == ["ReduceL2", op.value]
        assert g.node("reader").inputs[port] == "n"
        assert_bit_exact(pairs)


def test_an_expand_the_reader_needs_stays() -> None:
    g = _normalize(Op.DIV, 0)  # a broadcast first input of a Div would run in numpy
    result = apply(drop_identity, g)
    assert result.changed == 0 and any("first input of Div" in r for r in reasons(result))
    result = apply(drop_identity, _normalize(Op.RELU, 0))
    assert result.changed == 0 and any("does not broadcast" in r for r in reasons(result))
