"""The interpreter loop: feed checks, errors that name the node and op, keep=True, output
types declared by the graph."""

from __future__ import annotations

import numpy as np
import pytest

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.ops import ClipAttrs, ConvAttrs, FakeQuantizeAttrs, GemmAttrs, NoAttrs
from qfuse.runtime.reference import IMPLS, EvaluationError, MissingImplError, evaluate


def chain() -> Graph:
    g = Graph("chain")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_constant("w", np.full((3, 4), 0.5, np.float32))
    g.add_node(Op.MATMUL, ["x", "w"], ["h"], NoAttrs(), name="mm")
    g.add_node(Op.RELU, ["h"], ["r"], NoAttrs(), name="relu")
    g.add_node(Op.CLIP, ["r"], ["y"], ClipAttrs(0.0, 1.0), name="clip")
    g.outputs = ["y"]
    return g


X = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)


def test_runs_and_returns_outputs() -> None:
    out = evaluate(chain(), {"x": X})
    assert list(out) == ["y"]
    np.testing.assert_array_equal(out["y"], np.clip(np.maximum(X @ np.full((3, 4), 0.5), 0), 0, 1))


def test_keep_returns_every_intermediate() -> None:
    out = evaluate(chain(), {"x": X}, keep=True)
    assert set(out) == {"x", "h", "r", "y"}
    np.testing.assert_array_equal(out["h"], X @ np.full((3, 4), 0.5, np.float32))
    np.testing.assert_array_equal(out["r"], np.maximum(out["h"], 0))


@pytest.mark.parametrize("feeds, message", [
    ({}, "input 'x' is not fed"),
    ({"x": X.reshape(3, 2)}, "input 'x'"),
    ({"x": X.astype(np.float64)}, "input 'x'"),
    ({"x": X, "z": X}, "'z'"),
])
def test_feed_errors_name_the_input(feeds: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(chain(), feeds)


def test_missing_implementation_names_node_and_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(IMPLS, Op.RELU)
    with pytest.raises(NotImplementedError, match=r"'relu'.*Relu") as info:
        evaluate(chain(), {"x": X})
    assert isinstance(info.value, MissingImplError)


def test_op_failure_names_the_node() -> None:
    g = Graph("bad")
    g.add_input("x", TensorInfo((1, 3, 4, 4), DType.F32))
    g.add_constant("w", np.ones((2, 2, 3, 3), np.float32))  # C/group = 3 != 2
    g.add_node(Op.CONV, ["x", "w"], ["y"], ConvAttrs((3, 3), (1, 1), (0,) * 4, (1, 1)),
               name="conv7")
    g.outputs = ["y"]
    with pytest.raises(EvaluationError, match=r"'conv7' \(Conv\)") as info:
        evaluate(g, {"x": np.zeros((1, 3, 4, 4), np.float32)})
    assert info.value.__cause__ is not None


def test_missing_optional_input_is_none() -> None:
    g = Graph("gemm")
    g.add_input("a", TensorInfo((2, 3), DType.F32))
    g.add_constant("b", np.ones((3, 2), np.float32))
    g.add_node(Op.GEMM, ["a", "b", ""], ["y"], GemmAttrs(alpha=2.0), name="gemm")
    g.outputs = ["y"]
    np.testing.assert_array_equal(evaluate(g, {"a": X[:, :3]})["y"], 2 * X @ np.ones((3, 2)))


def test_constant_and_input_outputs() -> None:
    g = chain()
    g.outputs = ["y", "w", "x"]
    out = evaluate(g, {"x": X})
    np.testing.assert_array_equal(out["w"], g.constant("w"))
    np.testing.assert_array_equal(out["x"], X)


def _quantize_only_fq(out_dtype: DType, high: float) -> Graph:
    g = Graph("fq")
    g.add_input("x", TensorInfo((6,), DType.F32))
    for name, value in (("il", 0.0), ("ih", 2.55), ("ol", 0.0), ("oh", high)):
        g.add_constant(name, np.array(value, np.float32))
    g.add_node(Op.FAKE_QUANTIZE, ["x", "il", "ih", "ol", "oh"], ["q"], FakeQuantizeAttrs(256),
               name="fq", infos=[TensorInfo((6,), out_dtype)])
    g.outputs = ["q"]
    return g


def test_quantize_only_fake_quantize_takes_the_declared_integer_type() -> None:
    x = np.array([-1, 0, 0.014, 0.016, 1.0, 9], np.float32)
    q = evaluate(_quantize_only_fq(DType.U8, 255.0), {"x": x})["q"]
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, [0, 0, 1, 2, 100, 255])


def test_inexact_conversion_to_declared_type_is_an_error() -> None:
    x = np.array([-1, 0, 0.014, 0.016, 1.0, 9], np.float32)
    with pytest.raises(EvaluationError, match="'fq'.*do not convert exactly"):
        evaluate(_quantize_only_fq(DType.U8, 2.55), {"x": x})


def test_declared_shape_mismatch_is_an_error() -> None:
    g = chain()
    g.set_info("r", TensorInfo((2, 5), DType.F32))
    with pytest.raises(EvaluationError, match="'relu'.*shape"):
        evaluate(g, {"x": X})
