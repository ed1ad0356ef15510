"""`qfuse quantize` end to end on small zoo models: the written model is valid ONNX, runs in
ONNX Runtime, OpenVINO and qfuse; placement, scale groups, options, data forms, CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import qfuse
from qfuse.compiler.cli import main as cli_main
from qfuse.compiler.quantize import quantize
from qfuse.examples import zoo
from qfuse.runtime.numerics.error import cosine

ACTIVATIONS = {"Relu", "Clip", "BatchNormalization", "Sigmoid", "HardSwish"}



@pytest.fixture(scope="module")
def resnet() -> tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]:
    fm = zoo.float_model("resnet")
    return fm, zoo.sample_inputs(fm, 4, seed=0)


def _openvino_isa_capped() -> bool:
    """True under ONEDNN_MAX_CPU_ISA: OpenVINO's CPU plugin still reads the CPU's features
    (it reports BF16 on an AVX-512 CPU capped to AVX2) while the cap lowers its oneDNN int8
    kernels to ones that sum u8·s8 pairs in int16; measured on an AVX-512 VNNI EPYC capped to
    AVX2, its output moves to cosine 0.958 of its uncapped one. Not a machine users have."""
    return bool(os.environ.get("ONEDNN_MAX_CPU_ISA"))


def _readers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for v in n.input:
            out.setdefault(v, []).append(n)
    return out


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("fmt", ["qdq", "fakequantize"])
def test_written_model_is_valid_and_runs_everywhere(resnet, tmp_path, fmt: str) -> None:
    import openvino as ov

    fm, calib = resnet
    path = tmp_path / f"q_{fmt}.onnx"
    q = quantize(fm, calib, path, method="minmax", format=fmt)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    x = zoo.sample_inputs(fm, 1, seed=5)[0]
    ref = ort.InferenceSession(fm.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, x)[0]
    ours = qfuse.compile_model(q).run(x)["logits"]
    exact = qfuse.compile_model(q, mode="reference").run(x)["logits"]
    core = ov.Core()
    openvino = core.compile_model(core.read_model(str(path)), "CPU")(x)[0]
    assert cosine(ours, ref) > 0.999
    assert np.abs(ours - exact).max() <= 1e-5 * np.abs(exact).max()  # fused == reference
    assert cosine(openvino, ours) > 0.9999 or _openvino_isa_capped()
    if fmt == "qdq":
        onnxrt = ort.InferenceSession(q.SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, x)[0]
        assert cosine(onnxrt, ours) > 0.9999
        n_q = sum(n.op_type == "QuantizeLinear" for n in q.graph.node)
    else:
        assert {n.op_type for n in q.graph.node if n.domain == "org.openvinotoolkit"} == {
            "FakeQuantize"}
        n_q = sum(n.op_type == "FakeQuantize" for n in q.graph.node)
    assert n_q > 0


def test_formats_agree_in_qfuse(resnet) -> None:
    fm, calib = resnet
    x = zoo.sample_inputs(fm, 1, seed=6)[0]
    a = qfuse.compile_model(quantize(fm, calib, method="minmax")).run(x)["logits"]
    b = qfuse.compile_model(quantize(fm, calib, method="minmax", format="fakequantize")).run(
        x)["logits"]
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


def test_placement_never_splits_a_conv_from_what_it_absorbs(resnet) -> None:
    fm, calib = resnet
    q = quantize(fm, calib, method="minmax")
    readers, inits = _readers(q), _inits(q)
    assert not any(n.op_type == "BatchNormalization" for n in q.graph.node)  # folded first
    for dq in (n for n in q.graph.node if n.op_type == "DequantizeLinear"):
        assert not {r.op_type for r in readers.get(dq.output[0], [])} & ACTIVATIONS, dq.name
    convs = [n for n in q.graph.node if n.op_type in ("Conv", "Gemm")]
    producer = {o: n for n in q.graph.node for o in n.output}
    for conv in convs:
        w = producer[conv.input[1]]
        assert w.op_type == "DequantizeLinear" and inits[w.input[0]].dtype == np.int8
        axis = next(a.i for a in w.attribute if a.name == "axis")
        cout = inits[w.input[0]].shape[axis]
        assert inits[w.input[1]].shape == (cout,) and not inits[w.input[2]].any()
        assert conv.input[2] in inits and inits[conv.input[2]].dtype == np.float32  # bias float
        src = producer[conv.input[0]]
        while src.op_type in ("Flatten", "Reshape"):  # data movement keeps the grid
            src = producer[src.input[0]]
        assert src.op_type == "DequantizeLinear", conv.name


@pytest.mark.parametrize("name", ["inception", "unet", "shufflenet"])
def test_concat_inputs_share_one_scale(name: str) -> None:
    fm = zoo.float_model(name)
    q = quantize(fm, zoo.sample_inputs(fm, 2, seed=0), method="minmax")
    producer = {o: n for n in q.graph.node for o in n.output}
    inits = _inits(q)

    def grid(value: str) -> tuple[float, int]:
        p = producer[value]
        while p.op_type != "DequantizeLinear":  # through data movement (MaxPool, Split, ...)
            p = producer[p.input[0]]
        return float(inits[p.input[1]]), int(inits[p.input[2]])

    concats = [n for n in q.graph.node if n.op_type == "Concat"]
    assert concats
    for c in concats:
        assert len({grid(v) for v in c.input}) == 1, c.name


def test_exclude_keeps_a_node_float(resnet) -> None:
    fm, calib = resnet
    q = quantize(fm, calib, method="minmax", exclude=["/layer1.0/conv1/Conv"])
    producer = {o: n for n in q.graph.node for o in n.output}
    conv = next(n for n in q.graph.node if n.name == "/layer1.0/conv1/Conv")
    assert conv.input[1] in _inits(q)  # float weights
    assert conv.input[0] == "/stem/Relu" and producer[conv.input[0]].op_type == "Relu"
    # the other readers of that value (the residual Add) still read it quantized
    add = next(n for n in q.graph.node if n.name == "/layer1.0/Add")
    assert producer[add.input[1]].op_type == "DequantizeLinear"
    with pytest.raises(ValueError, match="exclude names no node"):
        quantize(fm, calib, exclude=["nope"])


def test_options_per_tensor_s8_symmetric(resnet) -> None:
    fm, calib = resnet
    q = quantize(fm, calib, method="minmax", per_channel=False, activations="s8",
                 symmetric=True)
    inits = _inits(q)
    for n in q.graph.node:
        if n.op_type == "QuantizeLinear":
            assert inits[n.input[2]].dtype == np.int8 and int(inits[n.input[2]]) == 0
        if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None:
            assert inits[n.input[1]].size == 1  # per-tensor weights
    x = zoo.sample_inputs(fm, 1, seed=5)[0]
    ref = ort.InferenceSession(fm.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, x)[0]
    assert cosine(qfuse.compile_model(q).run(x)["logits"], ref) > 0.995


def test_calibration_data_forms(resnet, tmp_path) -> None:
    fm, calib = resnet
    stacked = np.concatenate([c["input"] for c in calib])
    np.savez(tmp_path / "all.npz", input=stacked)
    folder = tmp_path / "npy"
    folder.mkdir()
    for i, c in enumerate(calib):
        np.save(folder / f"{i:02d}.npy", c["input"])
    models = [quantize(fm, src, method="minmax")
              for src in (calib, {"input": stacked}, tmp_path / "all.npz", folder)]
    scales = [sorted(float(t.float_data[0]) if t.float_data else
                     float(numpy_helper.to_array(t)) for t in m.graph.initializer
                     if t.name.endswith("_scale") and not t.dims) for m in models]
    assert all(s == scales[0] for s in scales[1:])
    np.savez(tmp_path / "bad.npz", image=stacked)
    with pytest.raises(ValueError, match=r"lacks model inputs \['input'\]"):
        quantize(fm, tmp_path / "bad.npz")


def test_cli_quantize_with_report(resnet, tmp_path, capsys) -> None:
    fm, calib = resnet
    onnx.save(fm, tmp_path / "f.onnx")
    np.savez(tmp_path / "c.npz", input=np.concatenate([c["input"] for c in calib]))
    code = cli_main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"),
                     "--calibration", str(tmp_path / "c.npz"), "--method", "percentile",
                     "--report"])
    assert code == 0
    text = capsys.readouterr().out
    assert "per-layer SQNR" in text
    rows = [line for line in text.splitlines() if line.startswith(("/", "input"))]
    sqnr = [float(line.split()[2]) for line in rows]
    assert len(rows) >= 10 and sqnr == sorted(sqnr)
    onnx.checker.check_model(onnx.load(str(tmp_path / "q.onnx")))
    code = cli_main(["quantize", str(tmp_path / "f.onnx"), str(tmp_path / "q2.onnx"),
                     "--calibration", str(tmp_path / "c.npz"), "--method", "minmax",
                     "--format", "fakequantize", "--report", "--json", "--bias-correction"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["format"] == "fakequantize" and payload["quantizers"] > 0
    assert payload["bias_correction"] is True
    names = {t.name for t in onnx.load(str(tmp_path / "q2.onnx")).graph.initializer}
    assert any(n.endswith("_bias_corrected") for n in names)
    assert [r["sqnr_db"] for r in payload["layers"]] == sorted(
        r["sqnr_db"] for r in payload["layers"])


def test_older_opset_and_symbolic_batch() -> None:
    """Opset 11 is converted to 13 (per-axis DequantizeLinear); a symbolic batch axis is fed
    the calibration samples 16 at a time."""
    fm = zoo.float_model("resnet", opset=11)
    q = quantize(fm, zoo.sample_inputs(fm, 2, seed=0), method="minmax")
    assert next(o.version for o in q.opset_import if o.domain == "") == 13
    assert len(qfuse.compile_model(q).inspect()["kernels"]) > 0
    fm = zoo.float_model("vgg")
    for vi in (fm.graph.input[0], fm.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    x = np.concatenate([d["input"] for d in zoo.sample_inputs(fm, 20, seed=0)])
    q = quantize(fm, {"input": x}, method="minmax")
    compiled = qfuse.compile_model(q, input_shapes={"input": (1, 3, 32, 32)})
    ref = ort.InferenceSession(fm.SerializeToString(), providers=["CPUExecutionProvider"])
    assert cosine(compiled.run({"input": x[:1]})["logits"], ref.run(None, {"input": x[:1]})[0]) \
        > 0.999


def test_weights_in_constant_nodes_are_quantized(resnet) -> None:
    """paddle2onnx writes weights and BN parameters as Constant nodes: they are found too."""
    fm, calib = resnet
    as_constants = onnx.ModelProto()
    as_constants.CopyFrom(fm)
    g = as_constants.graph
    nodes = [onnx.helper.make_node("Constant", [], [t.name], value=t) for t in g.initializer]
    del g.initializer[:]
    kept = list(g.node)
    del g.node[:]
    g.node.extend(nodes + kept)
    a, b = (quantize(m, calib, method="minmax") for m in (fm, as_constants))
    int8 = [sorted(t.name for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8
                   and t.dims) for m in (a, b)]
    assert int8[0] and int8[0] == int8[1]
    assert not any(n.op_type == "BatchNormalization" for n in b.graph.node)
