"""``qfuse inspect --error``: the rebuilt float model, ``--float``, exact and zero tensors.

A HardSwish block the way quantize_static leaves it (its Clip(0, 6) removed, the quantizer's
range [0, 6] doing the clamp): the rebuilt float model must put the cap back (the old rule,
a ReLU only, reported x·relu(x+3)/6 and an SQNR below 0 dB), and agree with the real float
model given by --float. Tensors with no error and all-zero references print words, never
inf or NaN; quantizers with no float tensor of their name are listed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qfuse.compiler.api import import_graph
from qfuse.compiler.cli import main
from qfuse.compiler.error_report import error_report, format_text

SHAPE = [1, 4, 6, 6]


def _arr(name: str, value: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _int8_exact(values: np.ndarray) -> np.ndarray:
    """Weights int8 holds exactly at scale 0.05: the rebuilt model's dequantized weights are the
    float model's."""
    return np.clip(np.rint(values * 40), -127, 127).astype(np.float32) * np.float32(0.05)


def _models(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(float model, its QDQ form without the Clip, feeds): y = conv(x)·clip(conv(x)+3, 0, 6)/6."""
    rng = np.random.default_rng(0)
    w = _int8_exact(rng.standard_normal((4, 4, 1, 1)))
    x = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    consts = [_arr("w", w), _arr("three", 3.0), _arr("six", 6.0), _arr("lo", 0.0),
              _arr("hi", 6.0)]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    float_graph = helper.make_graph([
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Add", ["c", "three"], ["a"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["clip"]),
        helper.make_node("Mul", ["c", "clip"], ["m"]),
        helper.make_node("Div", ["m", "six"], ["y"])], "hswish", *io, consts)
    # quantize_static's form: Clip removed, Add's output renamed to the Clip's ('clip')
    q = []

    # MinMax ranges (always holding 0) of the float tensors, as quantize_static calibrates
    c = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x)
    hsig = np.clip(c + 3, 0, 6)
    ranges = {"x": x, "c": c, "clip": hsig, "m": c * hsig, "y": c * hsig / 6}

    def qdq(name: str) -> str:
        lo, hi = min(float(ranges[name].min()), 0.0), max(float(ranges[name].max()), 0.0)
        scale = (hi - lo) / 255
        zp = int(np.rint(-lo / scale))
        q.extend([_arr(f"{name}_s", scale), _arr(f"{name}_z", zp, np.uint8)])
        nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"],
                                      [f"{name}_QuantizeLinear_Output"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_QuantizeLinear_Output",
                                                           f"{name}_s", f"{name}_z"],
                                      [f"{name}_DequantizeLinear_Output"]))
        return f"{name}_DequantizeLinear_Output"

    nodes: list[onnx.NodeProto] = []
    xd = qdq("x")
    wq = np.rint(w / np.float32(0.05)).astype(np.int8)
    q += [numpy_helper.from_array(wq, "wq"), _arr("ws", 0.05), _arr("wz", 0, np.int8)]
    nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]))
    nodes.append(helper.make_node("Conv", [xd, "wd"], ["c"]))
    cd = qdq("c")
    nodes.append(helper.make_node("Add", [cd, "three"], ["clip"]))
    clipd = qdq("clip")  # range [0, 6]: the quantizer is the Clip
    nodes.append(helper.make_node("Mul", [cd, clipd], ["m"]))
    md = qdq("m")
    nodes.append(helper.make_node("Div", [md, "six"], ["y_QuantizeLinear_Input"]))
    nodes[-1].output[0] = "y_QuantizeLinear_Input"
    ys = (float(ranges["y"].max()) - min(float(ranges["y"].min()), 0.0)) / 255
    q += [_arr("y_QuantizeLinear_Input_s", ys),
          _arr("y_QuantizeLinear_Input_z", np.rint(-min(float(ranges["y"].min()), 0.0) / ys),
               np.uint8)]
    nodes.append(helper.make_node("QuantizeLinear", ["y_QuantizeLinear_Input",
                                                     "y_QuantizeLinear_Input_s",
                                                     "y_QuantizeLinear_Input_z"], ["yq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["yq", "y_QuantizeLinear_Input_s",
                                                      "y_QuantizeLinear_Input_z"], ["y"]))
    quant_graph = helper.make_graph(nodes, "hswish_qdq", *io,
                                    [_arr("three", 3.0), _arr("six", 6.0)] + q)
    paths = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    for graph, path in zip((float_graph, quant_graph), paths, strict=True):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        onnx.checker.check_model(model)
        onnx.save(model, path)
    return paths[0], paths[1], {"x": x}


def test_rebuilt_float_model_keeps_the_removed_clip_cap(tmp_path: Path) -> None:
    float_path, qdq_path, feeds = _models(tmp_path)
    graph = import_graph(qdq_path)
    rebuilt, _ = error_report(graph, feeds)
    given, reference = error_report(graph, feeds, float_path)
    assert not reference.unmatched
    by_tensor = {r["tensor"]: r for r in given}
    assert by_tensor["yq"]["float_tensor"] == "y"  # the graph output's float name
    for row in rebuilt:
        other = by_tensor[row["tensor"]]
        assert row["sqnr_db"] is not None and row["sqnr_db"] > 20, row
        # weights are exact multiples of 0.05 here, so the rebuild misses nothing
        assert row["sqnr_db"] == pytest.approx(other["sqnr_db"], abs=0.5), (row, other)


def test_exact_and_zero_reference_tensors_print_words(tmp_path: Path) -> None:
    s, z = _arr("s", 0.1), _arr("z", 0, np.uint8)
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])

    def model(k: float, path: Path) -> None:
        nodes = [helper.make_node("Mul", ["x", "k"], ["m"]),
                 helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"]),
                 helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["y"])]
        graph = helper.make_graph(nodes, "g", *io, [s, z, _arr("k", k)])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)

    model(1.0, tmp_path / "q.onnx")
    model(0.0, tmp_path / "zero.onnx")  # a 'float model' whose m is all zeros
    feeds = {"x": np.array([0.0, 0.1, 0.2, 0.3], np.float32)}
    np.save(tmp_path / "x.npy", feeds["x"])
    graph = import_graph(tmp_path / "q.onnx")
    (exact,), ref = error_report(graph, feeds)
    assert exact["note"] == "exact" and exact["sqnr_db"] is None and exact["max_error_lsb"] == 0
    (zero,), ref_zero = error_report(graph, feeds, tmp_path / "zero.onnx")
    assert zero["note"] == "zero reference" and zero["sqnr_db"] is None
    for row, r in ((exact, ref), (zero, ref_zero)):
        tokens = {t.lower() for t in format_text([row], r, "x").split()}
        assert not tokens & {"nan", "inf", "-inf"}
    code = main(["inspect", str(tmp_path / "q.onnx"), "--error", "--json", "--float",
                 str(tmp_path / "zero.onnx"), "--inputs", str(tmp_path / "x.npy")])
    assert code == 0


def test_unmatched_quantizers_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    float_path, qdq_path, _ = _models(tmp_path)
    model = onnx.load(float_path)
    for node in model.graph.node:  # rename the Conv's output in the float model
        node.input[:] = ["conv_out" if i == "c" else i for i in node.input]
        node.output[:] = ["conv_out" if o == "c" else o for o in node.output]
    onnx.save(model, tmp_path / "renamed.onnx")
    code = main(["inspect", str(qdq_path), "--error", "--json", "--float",
                 str(tmp_path / "renamed.onnx")])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["unmatched"] == ["c_QuantizeLinear_Output"]
    assert data["reference"].endswith("int8 values by onnxruntime")  # QDQ: exact in ORT
    assert "c_QuantizeLinear_Output" not in {r["tensor"] for r in data["layers"]}
    assert main(["inspect", str(qdq_path), "--float", str(float_path)]) == 1


def test_float_name_candidates_follow_the_quantizers_naming() -> None:
    from qfuse.compiler.float_model import candidates

    assert candidates("relu_0", "relu_0_QuantizeLinear_Output") == ["relu_0"]
    assert candidates("y_QuantizeLinear_Input", "yq") == ["y_QuantizeLinear_Input", "y"]
    assert candidates("Conv@1_quant/Conv_out", "bn_1_quantized")[1:] == ["bn_1"]
    assert candidates("/m/Split_out", "/m/Split_output_0quantized")[1:] == ["/m/Split_output_0"]


def test_rebuilt_float_model_reports_what_the_quantizer_clips(tmp_path: Path) -> None:
    """A Relu folded into a quantizer whose range stops at half the data's maximum: the rebuild
    puts the ReLU back without the calibrated top as a cap, so the clipping is error, as
    against the real float model (a cap there reported the tensor as nearly exact)."""
    rng = np.random.default_rng(3)
    w = _int8_exact(rng.standard_normal((4, 4, 1, 1)))
    x = rng.standard_normal(SHAPE).astype(np.float32)
    c = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x)
    top = float(c.max()) / 2
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    float_graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]),
                                     helper.make_node("Relu", ["c"], ["r"]),
                                     helper.make_node("Identity", ["r"], ["y"])],
                                    "relu", *io, [_arr("w", w)])
    wq = np.rint(w / np.float32(0.05)).astype(np.int8)
    quant_graph = helper.make_graph([
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["x", "wd"], ["r"]),  # quantize_static's rename: Relu gone
        helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["y"])], "relu_qdq", *io,
        [numpy_helper.from_array(wq, "wq"), _arr("ws", 0.05), _arr("wz", 0, np.int8),
         _arr("rs", top / 255), _arr("rz", 0, np.uint8)])
    for graph, name in ((float_graph, "f.onnx"), (quant_graph, "q.onnx")):
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                  tmp_path / name)
    graph = import_graph(tmp_path / "q.onnx")
    (rebuilt,), reference = error_report(graph, {"x": x})
    (given,), _ = error_report(graph, {"x": x}, tmp_path / "f.onnx")
    assert given["float_tensor"] == "r" and given["sqnr_db"] < 20
    assert rebuilt["sqnr_db"] == pytest.approx(given["sqnr_db"], abs=0.01)
    assert "1 activation(s)" in reference.notes[0] and "0 of them capped" in reference.notes[0]
