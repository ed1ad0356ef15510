"""NaN and infinity in float inputs: every mode gives onnxruntime's result, warns once.

onnxruntime's QuantizeLinear maps NaN and -inf to qmin and +inf to qmax (u8 and s8); before
compiler/nonfinite.py the compiled modes gave +127 for NaN on s8. Models: an input quantizer
alone (u8, s8), an int8 conv after it (scales chosen so no output lands on a rounding tie, so
the comparison is bit-exact), an input that reaches a float op before its quantizer (the
compiled modes reroute such runs to the reference interpreter), and a float conv in fp32 mode
(NaN propagates, as in onnxruntime's float run).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse import NonFiniteInputWarning
from qfuse.compiler.nonfinite import all_finite

QUANTIZED_MODES = ["fused", "unfused", "reference"]
SHAPE = [1, 3, 5, 5]


def _init(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(dtype: type, body: str) -> onnx.ModelProto:
    zp = 128 if dtype == np.uint8 else 0
    inits = [_init("s", 0.05, np.float32), _init("z", zp, dtype)]
    x = "x"
    nodes = []
    if body == "negate":  # a float op before the quantizer
        inits.append(_init("m", -1.0, np.float32))
        nodes.append(helper.make_node("Mul", ["x", "m"], ["xm"]))
        x = "xm"
    nodes += [helper.make_node("QuantizeLinear", [x, "s", "z"], ["xq"]),
              helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"])]
    out_shape = SHAPE
    if body == "conv":
        w = np.random.default_rng(0).integers(-20, 21, (4, 3, 3, 3)).astype(np.int8)
        inits += [numpy_helper.from_array(w, "w"), _init("ws", 0.01, np.float32),
                  _init("wz", 0, np.int8), _init("ys", 0.0937, np.float32),
                  _init("yz", zp, dtype)]
        nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
                  helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
                  helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
                  helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])]
        out_shape = [1, 4, 5, 5]
    else:
        nodes[-1] = helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"])
    graph = helper.make_graph(
        nodes, body, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _input() -> np.ndarray:
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    flat = x.reshape(-1)
    flat[[0, 7, 30, 31, 74]] = [np.nan, np.inf, -np.inf, -np.nan, np.nan]
    return x


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _run(model: qfuse.CompiledModel, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = model.run({"x": x})["y"]
        y2 = model.run({"x": x})["y"]  # a second run: no second warning
    assert np.array_equal(y, y2, equal_nan=True)
    return y, [str(w.message) for w in caught if issubclass(w.category, NonFiniteInputWarning)]


@pytest.mark.parametrize("mode", QUANTIZED_MODES)
@pytest.mark.parametrize("body", ["qdq", "conv", "negate"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_non_finite_inputs_give_onnxruntimes_result(dtype: type, body: str, mode: str) -> None:
    model = _model(dtype, body)
    x = _input()
    want = _ort(model, x)
    got, messages = _run(qfuse.compile_model(model, mode=mode), x)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
    assert len(messages) == 1 and "NaN or infinity" in messages[0]
    if body == "negate" and mode != "reference":
        assert "reference interpreter" in messages[0]


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32", "reference"])
def test_finite_inputs_do_not_warn(mode: str) -> None:
    model = qfuse.compile_model(_model(np.int8, "conv"), mode=mode)
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32) * 1e20  # large,
    with warnings.catch_warnings():                                            # finite
        warnings.simplefilter("error")
        model.run({"x": x})


def test_fp32_mode_propagates_nan_as_onnxruntime_runs_the_float_model() -> None:
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = _input()
    want = _ort(model, x)
    got, messages = _run(qfuse.compile_model(model, mode="fp32"), x)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).any()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)
    assert len(messages) == 1 and "propagate" in messages[0]


def test_all_finite() -> None:
    x = np.zeros(1000, np.float32)
    assert all_finite(x) and all_finite(x[:0]) and all_finite(np.full(10, 3e38, np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        for i in (0, 17, 999):
            y = x.copy()
            y[i] = bad
            assert not all_finite(y)


def test_a_rerouted_run_still_refuses_a_bad_feed() -> None:
    from qfuse.compiler.errors import InputError

    model = qfuse.compile_model(_model(np.int8, "negate"))
    x = np.full([1, 3, 5, 6], np.nan, np.float32)  # wrong shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteInputWarning)
        with pytest.raises(InputError, match="input 'x'"):
            model.run({"x": x})


def _made_inside(dtype: type, zp: int, chain: bool) -> onnx.ModelProto:
    """x / d, quantized (the graph output): 0/0 makes NaN inside the model from finite inputs
    (EfficientViT's linear attention divides by a quantized sum that is 0 where a row's keys
    are all 0).
    ``chain``: the quotient multiplied by x again first (a gate chain's binary primitive)."""
    inits = [_init("s", 0.05, np.float32), _init("z", zp, dtype)]
    nodes = [helper.make_node("Div", ["x", "d"], ["q"])]
    quotient = "q"
    if chain:
        nodes.append(helper.make_node("Mul", ["q", "x"], ["qx"]))
        quotient = "qx"
    nodes.append(helper.make_node("QuantizeLinear", [quotient, "s", "z"], ["y"]))
    graph = helper.make_graph(
        nodes, "made_inside", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE)
                               for n in ("x", "d")],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       SHAPE)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("mode", QUANTIZED_MODES)
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize(("dtype", "zp"), [(np.int8, 0), (np.int8, 3), (np.uint8, 128)])
def test_nan_made_inside_quantizes_to_qmin(dtype: type, zp: int, chain: bool,
                                           mode: str) -> None:
    """Measured before the fix: +127 on s8 in the fused and unfused modes (onnxruntime and the
    reference: -128), EfficientViT-B0 NNCF's output at cosine 0.23."""
    model = _made_inside(dtype, zp, chain)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    d = rng.standard_normal(SHAPE).astype(np.float32)
    x.reshape(-1)[::4] = 0.0
    d.reshape(-1)[::3] = 0.0  # every 12th element 0/0, others ±inf or finite
    feeds = {"x": x, "d": d}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite inputs: no warning, no rerouting
        got = qfuse.compile_model(model, mode=mode).run(feeds)["y"]
    assert np.all(want.reshape(-1)[::12] == np.iinfo(dtype).min)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
