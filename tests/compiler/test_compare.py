"""``qfuse compare --emulate X`` and ``qfuse inspect --error`` end to end through the CLI.

compare: text (aligned table, first-divergence line) and --json (``tensors`` with ``name``,
``identical`` in [0, 1], ``max_lsb``; ``first_divergence`` the first tensor below 1) on a zoo
model, against the reference interpreter. inspect --error: sorted worst (lowest SQNR) first,
and the SQNR of a conv layer recomputed here by hand from numpy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.cli import main
from qfuse.examples import zoo
from qfuse.runtime.numerics import dequantize, quantize


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture(scope="module")
def mobilenet() -> Path:
    return zoo.model_path("mobilenetv2", quantized=True)


def test_compare_json(mobilenet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "compare", str(mobilenet), "--emulate", "tflite", "--json",
                   "--against", "reference")
    assert rc == 0
    result = json.loads(out)
    assert {"tensors", "first_divergence"} <= set(result)
    tensors = result["tensors"]
    assert len(tensors) == 23 and all({"name", "identical", "max_lsb"} <= set(t) for t in tensors)
    assert all(0.0 <= t["identical"] <= 1.0 and t["max_lsb"] >= 0 for t in tensors)
    assert tensors[0]["name"] == "input_QuantizeLinear_Output"  # topological order
    below = [t["name"] for t in tensors if t["identical"] < 1]
    assert result["first_divergence"] == (below[0] if below else None)
    # TFLite's depthwise convs round twice (D2): they are where TFLite departs from the exact
    # reference on this model.
    assert result["first_divergence"] is not None and "dw" in result["first_divergence"]
    assert "reference" in result["baseline"]


def test_compare_text(mobilenet: Path, capsys: pytest.CaptureFixture[str],
                      tmp_path: Path) -> None:
    feeds = zoo.sample_inputs(mobilenet, 1, seed=4)[0]
    np.savez(tmp_path / "in.npz", **feeds)
    rc, out = _run(capsys, "compare", str(mobilenet), "--emulate", "onnxruntime",
                   "--inputs", str(tmp_path / "in.npz"), "--against", "reference")
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("emulating onnxruntime vs reference interpreter")
    header = lines[1]
    assert header.split()[:4] == ["tensor", "identical", "max", "LSB"]
    rows = lines[2:-1]
    assert len(rows) == 23
    column = header.index("identical")
    assert all(row[column:column + 9].strip().endswith("%") for row in rows)  # aligned
    assert lines[-1].startswith("first divergence: ")


def test_compare_default_baseline_is_named(mobilenet: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "compare", str(mobilenet), "--emulate", "caffe2")
    assert rc == 0 and ("vs fused" in out or "vs reference interpreter" in out)


def test_run_emulate(mobilenet: Path, capsys: pytest.CaptureFixture[str],
                     tmp_path: Path) -> None:
    rc, out = _run(capsys, "run", str(mobilenet), "--emulate", "tpu-mlir",
                   "--output", str(tmp_path / "out.npz"))
    assert rc == 0 and "logits" in out
    with np.load(tmp_path / "out.npz") as npz:
        assert npz["logits"].shape == (1, 10)


def _conv_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """float x -> Q -> DQ -> Conv(DQ(w), DQ(b)) -> Q -> DQ -> y (zero points away from qmin, so
    no ReLU is folded into the quantizers)."""
    rng = np.random.default_rng(9)
    p = {
        "x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
        "xs": np.float32(0.02), "xz": np.uint8(120),
        "w": rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        "ws": rng.uniform(0.002, 0.01, 4).astype(np.float32), "wz": np.zeros(4, np.int8),
        "ys": np.float32(0.05), "yz": np.uint8(130),
    }
    p["bs"] = (p["xs"] * p["ws"]).astype(np.float32)
    p["b"] = rng.integers(-2000, 2000, 4).astype(np.int32)
    p["bz"] = np.zeros(4, np.int32)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in p.items() if k != "x"]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
        helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model), {"x": p["x"]}, p


def _conv_by_hand(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, w.shape[0], 8, 8))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + 8, j:j + 8], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


def test_inspect_error_sorted_and_conv_sqnr_by_hand(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model, feeds, p = _conv_model()
    onnx.save(model, tmp_path / "conv.onnx")
    np.savez(tmp_path / "in.npz", **feeds)
    rc, out = _run(capsys, "inspect", str(tmp_path / "conv.onnx"), "--error", "--json",
                   "--inputs", str(tmp_path / "in.npz"))
    assert rc == 0
    layers = json.loads(out)["layers"]
    sqnr = [r["sqnr_db"] for r in layers]
    assert None not in sqnr and sqnr == sorted(sqnr)
    conv = next(r for r in layers if r["layer"] == "conv")
    assert conv["op"] == "Conv" and conv["tensor"] == "cq"

    # By hand: the float model is the conv of the *float* input with dequantized weights and
    # bias; the quantized model quantizes x first, and the conv output after.
    w = dequantize(p["w"], p["ws"], axis=0).astype(np.float64)
    b = dequantize(p["b"], p["bs"], axis=0).astype(np.float64)
    shadow = _conv_by_hand(p["x"], w, b)
    xq = dequantize(quantize(p["x"], p["xs"], p["xz"], np.uint8), p["xs"], p["xz"])
    actual = dequantize(quantize(_conv_by_hand(xq, w, b).astype(np.float32), p["ys"], p["yz"],
                                 np.uint8), p["ys"], p["yz"]).astype(np.float64)
    sqnr = 10 * math.log10(np.sum(shadow**2) / np.sum((actual - shadow) ** 2))
    assert conv["sqnr_db"] == pytest.approx(sqnr, rel=1e-6)
    assert conv["max_error_lsb"] == pytest.approx(
        np.max(np.abs(actual - shadow)) / float(p["ys"]), rel=1e-5)
    assert conv["relative_l2"] == pytest.approx(10 ** (-sqnr / 20), rel=1e-6)

    rc, text = _run(capsys, "inspect", str(tmp_path / "conv.onnx"), "--error")
    assert rc == 0 and "SQNR dB" in text.splitlines()[1] and "conv (Conv)" in text


def test_inspect_error_on_zoo_model_is_worst_first(mobilenet: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "inspect", str(mobilenet), "--error", "--json")
    assert rc == 0
    sqnr = [r["sqnr_db"] for r in json.loads(out)["layers"]]
    finite = [s for s in sqnr if s is not None]
    assert finite == sorted(finite) and sqnr[: len(finite)] == finite  # exact (null) last


def test_cli_offers_every_emulated_framework() -> None:
    from qfuse.compiler.cli import EMULATED
    from qfuse.runtime.emulate import FRAMEWORKS

    assert tuple(EMULATED) == FRAMEWORKS
