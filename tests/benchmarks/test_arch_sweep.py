"""benchmarks/arch_sweep.py's ``ov/ix`` column: without VNNI, OpenVINO's latency over the
plan that does not pay for exact sums (``exact_int8=False``), which is the exact plan itself
on a VNNI CPU (no column there)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from qfuse.benchmarks import arch_sweep
from qfuse.benchmarks.arch_sweep import HEADER, _inexact_plan, format_row
from qfuse.compiler.lower.no_vnni import isa_is_exact

ROW = {"model": "m", "quantizer": "qdq", "kernels": 3, "numpy": 0, "ref": 0, "cos_ref": 1.0,
       "cos_ort": 1.0, "ms": 1.0, "ort_over_qfuse": 1.5, "ov_over_qfuse": 0.8}


def test_the_column_follows_the_row() -> None:
    assert format_row({**ROW, "ov_over_inexact": 0.95}).split()[-2:] == ["0.80", "0.95"]
    assert format_row(ROW).split()[-1] == "0.80"  # a VNNI CPU: no column
    assert len(format_row(ROW)) == len(HEADER)


def _qdq_conv(path: str) -> dict[str, np.ndarray]:
    """A QDQ 3x3 convolution whose full-range weights saturate int16 pairs without VNNI."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             h.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("QuantizeLinear", ["c", "cs", "z"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "cs", "z"], ["y"])]
    inits = [nh.from_array(np.array(0.02, np.float32), "s"),
             nh.from_array(np.array(0, np.uint8), "z"),
             nh.from_array(rng.choice([-127, 127], (16, 16, 3, 3)).astype(np.int8), "w"),
             nh.from_array(np.full(16, 0.001, np.float32), "ws"),
             nh.from_array(np.array(0.5, np.float32), "cs")]
    graph = h.make_graph(nodes, "conv",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return {"x": rng.uniform(0, 5, (1, 16, 8, 8)).astype(np.float32)}


def test_the_inexact_plan_is_timed_only_without_vnni(tmp_path) -> None:
    path = tmp_path / "conv.onnx"
    feeds = _qdq_conv(str(path))
    plan = _inexact_plan(path, 1, feeds)
    if isa_is_exact():
        assert plan is None
        return
    assert plan is not None
    notes = plan.inspect()
    assert notes["exact_int8"] == {}, notes["exact_int8"]  # nothing split: it saturates
    assert not notes["exact_int8_dot_products"]


def test_zero_initialized_weights_are_revived() -> None:
    """A zero-initialized residual scale or head (timm's zero_init_last, LeViT, ViT's head)
    gets a trained network's kind of value; other weights are left as they are."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(4, 2))
    torch.nn.init.zeros_(model[1].weight)
    torch.nn.init.zeros_(model[3].weight)
    conv = model[0].weight.detach().clone()
    assert arch_sweep._revive_zero_init(model) == ["1", "3"]
    assert torch.all(model[1].weight == 1)
    assert torch.all(model[3].weight != 0)
    assert torch.equal(model[0].weight, conv)
    assert arch_sweep._revive_zero_init(model) == []


def test_layer_scales_are_revived() -> None:
    """A layer scale left at its tiny initial constant (CaiT's 1e-5) gets a trained network's
    order of value; a parameter of distinct small values, or of one ordinary value, stays."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Module()
    model.gamma = torch.nn.Parameter(1e-5 * torch.ones(8))
    model.small = torch.nn.Parameter(torch.linspace(1e-5, 2e-5, 8))
    model.ones = torch.nn.Parameter(torch.ones(8))
    small = model.small.detach().clone()
    assert arch_sweep._revive_zero_init(model) == ["gamma"]
    assert torch.all(model.gamma == arch_sweep.LAYER_SCALE)
    assert torch.equal(model.small, small) and torch.all(model.ones == 1)


def test_a_row_onnxruntime_refused_keeps_its_other_columns() -> None:
    """ONNX Runtime's own int8 kernels may refuse a model its reference run takes (NNCF's
    per-channel activation zero points in a QLinearConv its optimizer fuses): the row shows
    ``-`` there and qfuse's and OpenVINO's columns as measured."""
    row = {k: v for k, v in ROW.items() if k not in ("cos_ort", "ort_over_qfuse")}
    cells = format_row(row).split()
    assert cells[-5:] == ["1.00000", "-", "1.00", "-", "0.80"]
    assert len(format_row(row)) == len(HEADER)


def test_a_wheel_model_is_read_out_of_its_pinned_wheel_and_fed_its_inputs(tmp_path,
                                                                          monkeypatch) -> None:
    """``wheel_<name>``: the member of a pinned wheel (here a zip made in the test, placed
    where the download would put it, its sha256 pinned), its dynamic batch made static, fed
    the spec's inputs (an int64 one besides the signal, as silero-vad's sample rate): the row
    is measured like a torch export's."""
    import hashlib
    import zipfile

    x = h.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    sr = h.make_tensor_value_info("sr", TensorProto.INT64, [])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = nh.from_array(np.random.default_rng(0).normal(0, 0.1, (64, 16)).astype(np.float32), "w")
    graph = h.make_graph([h.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
                          h.make_node("Mul", ["x", "srf"], ["xs"]),
                          h.make_node("MatMul", ["xs", "w"], ["m"]),
                          h.make_node("Relu", ["m"], ["y"])], "g", [x, sr], [y], [w])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    path = wheels / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tiny/model.onnx", model.SerializeToString())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    seen: list[dict[str, np.ndarray]] = []

    def feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        made = {"x": rng.standard_normal((1, 64)).astype(np.float32),
                "sr": np.array(2, np.int64)}
        seen.append(made)
        return made

    spec = arch_sweep.WheelModel(("tiny", "1.0", path.name, digest), "tiny/model.onnx",
                                 {"x": (1, 64), "sr": ()}, feeds)
    monkeypatch.setitem(arch_sweep.WHEEL_MODELS, "wheel_tiny", spec)
    arch_sweep.export(["wheel_tiny"], tmp_path, 224)
    exported = onnx.load(tmp_path / "float" / "wheel_tiny.onnx")
    assert [d.dim_value for d in exported.graph.input[0].type.tensor_type.shape.dim] == [1, 64]
    row = arch_sweep.measure("wheel_tiny", "qdq", tmp_path, 2, openvino=False)
    assert "error" not in row, row
    assert len(seen) == 10 and row["cos_ref"] > 0.99, row


def test_a_torchfx_row_without_its_export_says_so(tmp_path) -> None:
    """``torchfx`` models are made by the export step from the torch model (PyTorch's FX
    quantization, then torch.onnx): where that step refused, the row's error says where to
    look, and nothing is quantized from the float model in its place."""
    (tmp_path / "float").mkdir()
    x = h.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])
    y = h.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])
    graph = h.make_graph([h.make_node("Relu", ["input"], ["output"])], "g", [x], [y])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
              tmp_path / "float" / "m.onnx")
    row = arch_sweep.measure("m", "torchfx", tmp_path, 1, openvino=False)
    assert row["error"].startswith("quantize / reference: FileNotFoundError: torchfx: not "
                                   "exported"), row
    assert not (tmp_path / "quantized" / "m.torchfx.onnx").exists()
