"""`qfuse quantize --bias-correction` (compiler/quantize/bias_correction.py): each layer's
shift is the mean over calibration data and output positions of ``op(x, ΔW)``, checked against
an independent numpy computation (padding counted where it falls), written into the bias
(added where absent, Gemm's alpha / beta and a MatMul's bias Add respected), and it removes the
systematic error the weights' quantization adds."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import compile_model
from qfuse.compiler.quantize import bias_correction, quantize
from qfuse.compiler.quantize.writer import quantize_weight
from tests.compiler.onnx_builders import typed_outputs

RNG = np.random.default_rng(7)


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x_shape: list[int]
           ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = typed_outputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    onnx.checker.check_model(model)
    return model


def _calibration(shape: list[int], n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)  # mostly positive inputs, as after a ReLU
    return [{"x": (rng.standard_normal(shape) + 1.0).astype(np.float32)} for _ in range(n)]


def _delta(w: np.ndarray, axis: int | None) -> np.ndarray:
    q, s = quantize_weight(w, axis)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    return q.astype(np.float64) * s.reshape(shape).astype(np.float64) - w.astype(np.float64)


def _conv2d(x: np.ndarray, w: np.ndarray, pad: int, group: int) -> np.ndarray:
    """Direct grouped 2-D convolution, stride 1, zero padding (float64)."""
    n, c, _, _ = x.shape
    cout, cin_g, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    per = cout // group
    out = []
    for o in range(cout):
        g = o // per
        patch = win[:, g * cin_g:(g + 1) * cin_g]  # N, cin_g, H, W, kh, kw
        out.append(np.einsum("nchwij,cij->nhw", patch, w[o]))
    return np.stack(out, axis=1)


@pytest.mark.parametrize("group", [1, 4])
def test_conv_shift_is_the_mean_of_the_convolution_with_the_weight_error(group: int) -> None:
    c, k = 8, 3
    w = RNG.standard_normal((c, c // group, k, k)).astype(np.float32)
    # an unnamed node: corrections are keyed by the output's name
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, group=group)],
                   {"w": w}, [1, c, 5, 6])
    calib = _calibration([1, c, 5, 6], 6, seed=1)
    got = bias_correction.measure(model, {"w": 0}, calib).shifts["y"]
    dw = _delta(w, 0)
    want = np.mean([_conv2d(f["x"], dw, 1, group) for f in calib], axis=(0, 1, 3, 4))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # a 5x6 map padded by one: the mean of ΔW·E[x] over the input is not it
    naive = np.array([(dw[o].sum(axis=(1, 2)) * np.mean([f["x"] for f in calib], axis=(0, 1, 3, 4))[
        (o // (c // group)) * (c // group):(o // (c // group) + 1) * (c // group)]).sum()
        for o in range(c)])
    assert np.abs(naive - want).max() > 10 * np.abs(got - want).max()
    fixed = bias_correction.apply(model, bias_correction.Corrections({"y": got}))
    conv = fixed.graph.node[0]
    bias = numpy_helper.to_array(next(t for t in fixed.graph.initializer
                                      if t.name == conv.input[2]))
    np.testing.assert_array_equal(bias, (-got).astype(np.float32))
    onnx.checker.check_model(fixed)


def test_gemm_alpha_beta_and_matmul_bias_add() -> None:
    k, n = 12, 5
    wg = RNG.standard_normal((n, k)).astype(np.float32)
    wm = RNG.standard_normal((n, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "wg", "c"], ["g"], "gemm", transB=1, alpha=0.5,
                              beta=2.0),
             helper.make_node("MatMul", ["g", "wm"], ["m"], "mm"),
             helper.make_node("Add", ["m", "b"], ["y"], "add")]
    model = _model(nodes, {"wg": wg, "wm": wm, "c": c, "b": b}, [3, k])
    calib = _calibration([3, k], 5, seed=2)
    shifts = bias_correction.measure(model, {"wg": 0, "wm": 1}, calib).shifts
    xs = np.concatenate([f["x"] for f in calib]).astype(np.float64)
    np.testing.assert_allclose(shifts["g"], 0.5 * (xs @ _delta(wg, 0).T).mean(0),
                               rtol=1e-5, atol=1e-7)
    gs = 0.5 * xs @ wg.T.astype(np.float64) + 2.0 * c  # the Gemm's float output, MatMul's input
    np.testing.assert_allclose(shifts["m"], (gs @ _delta(wm, 1)).mean(0), rtol=1e-4,
                               atol=1e-6)
    fixed = bias_correction.apply(model, bias_correction.Corrections(shifts))
    inits = {t.name: numpy_helper.to_array(t) for t in fixed.graph.initializer}
    gemm, _, add = fixed.graph.node
    np.testing.assert_allclose(inits[gemm.input[2]], c - shifts["g"] / 2.0, rtol=1e-6)
    np.testing.assert_allclose(inits[add.input[1]], b - shifts["m"], rtol=1e-6)
    assert "c" in inits and "b" in inits  # the originals are left for other readers


def test_the_corrected_model_has_no_mean_error_from_its_weights() -> None:
    """One convolution quantized per tensor (large weight errors) on positive inputs: the
    mean over held-out outputs of (qfuse fused - float) per channel shrinks with the
    correction."""
    c = 16
    w = RNG.standard_normal((c, c, 3, 3)).astype(np.float32)
    w[:, :, 1, 1] *= 8  # one large tap per channel: coarse per-tensor steps elsewhere
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1] * 4)],
                   {"w": w}, [1, c, 8, 8])
    calib, held = _calibration([1, c, 8, 8], 16, seed=3), _calibration([1, c, 8, 8], 8, seed=4)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def mean_error(correct: bool) -> float:
        q = compile_model(quantize(model, calib, per_channel=False, correct_bias=correct))
        err = np.mean([q.run(f)["y"] - sess.run(None, f)[0] for f in held], axis=(0, 1, 3, 4))
        return float(np.abs(err).mean())

    plain, corrected = mean_error(False), mean_error(True)
    print(f"mean |error| per channel: {plain:.5f} plain, {corrected:.5f} corrected")
    assert corrected < 0.5 * plain, (plain, corrected)
