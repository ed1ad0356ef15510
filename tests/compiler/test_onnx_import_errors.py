"""Models the importer refuses, and how: every message names the node and op (or the opset,
input, tensor) and the problem. Also graph-level bookkeeping: inputs, outputs, names, shapes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from island_helpers import assert_island
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import init, model, single

from qfuse.compiler import onnx_import
from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.compiler.onnx_import.loading import max_opset
from qfuse.ir import Op

F = np.float32
FLOAT = TensorProto.FLOAT


def test_ops_without_a_native_lowering_are_islands() -> None:
    boxes = {"b": ([1, 4, 4], FLOAT), "s": ([1, 1, 4], FLOAT)}
    nms = helper.make_node("NonMaxSuppression", ["b", "s"], ["y"], name="nms1")
    island = assert_island(model([nms], boxes, ["y"]), {"NonMaxSuppression"},
                           r"^op NonMaxSuppression has no native lowering")
    assert island.attrs.dynamic == (True,)  # how many boxes survive is known at run time
    rng = np.random.default_rng(0)
    lstm = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="", hidden_size=2)
    m = model([lstm], {"x": ([1, 1, 3], FLOAT)}, ["y"],
              [init("W", rng.standard_normal((1, 8, 3)).astype(F)),
               init("R", rng.standard_normal((1, 8, 2)).astype(F))])
    assert assert_island(m, {"LSTM"}, r"^the IR has no LSTM op: oneDNN's RNN primitive runs "
                                      r"it where it can").name == "LSTM_0"
    import qfuse

    (found,) = qfuse.compile_model(m).inspect()["islands"]  # lowered: inspect says on what
    assert found["engine"].startswith("oneDNN rnn ("), found


def test_unknown_domain_is_named() -> None:
    node = helper.make_node("QLinearConv", ["x"], ["y"], name="qc", domain="com.microsoft")
    m = model([node], {"x": ([1], FLOAT)}, ["y"], extra_opsets={"com.microsoft": 1})
    with pytest.raises(UnsupportedModelError,
                       match=r"node 'qc' \(QLinearConv\): op QLinearConv of domain "
                             r"'com.microsoft' has no native lowering; as a float island: "):
        import_model(m)


def test_other_openvino_op_is_named() -> None:
    node = helper.make_node("Foo", ["x"], ["y"], name="foo", domain="org.openvinotoolkit")
    m = model([node], {"x": ([1], FLOAT)}, ["y"], extra_opsets={"org.openvinotoolkit": 1})
    with pytest.raises(UnsupportedModelError, match=r"'foo' \(Foo\): op Foo of domain "
                                                    r"'org.openvinotoolkit' has no native "
                                                    r"lowering; as a float island: "):
        import_model(m)


def test_opsets_below_11_run_as_islands_newer_than_onnx_and_ort_are_refused() -> None:
    m = single("Relu", [2], opset=10)
    m.ir_version = 8
    assert_island(m, {"Relu"}, r"^opset 10 is below 11")
    newest = max_opset()
    assert 21 <= newest <= onnx.defs.onnx_opset_version()
    assert [n.op for n in import_model(single("Relu", [2], opset=newest))] == [Op.RELU]
    with pytest.raises(UnsupportedModelError, match=f"opset {newest + 1} of the default ONNX "
                                                    f"domain is not supported"):
        import_model(single("Relu", [2], opset=newest + 1))


def test_dangling_input_is_malformed() -> None:
    node = helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")
    with pytest.raises(MalformedModelError, match="onnx.checker rejects the model: .*nowhere"):
        import_model(model([node], {"x": ([2], FLOAT)}, ["y"]))


def test_duplicate_output_names_are_malformed() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"),
             helper.make_node("Sigmoid", ["x"], ["y"], name="b")]
    with pytest.raises(MalformedModelError, match="onnx.checker rejects the model: .*'y'"):
        import_model(model(nodes, {"x": ([2], FLOAT)}, ["y"]))


def test_inconsistent_shapes_are_malformed_and_name_the_node() -> None:
    m = single("Conv", [1, 4, 8, 8], [init("w", np.zeros((2, 3, 3, 3), F))])
    with pytest.raises(MalformedModelError, match=r"node 'n' \(Conv\): input has 4 channels"):
        import_model(m)


def test_unexpected_exceptions_are_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: object, node: object) -> None:
        raise KeyError("boom")

    monkeypatch.setitem(onnx_import.CONVERTERS, ("", "Relu"), broken)
    with pytest.raises(MalformedModelError, match=r"node 'n' \(Relu\): cannot convert "
                                                  r"\(KeyError: 'boom'\)") as info:
        import_model(single("Relu", [2]))
    assert isinstance(info.value.__cause__, KeyError)


def test_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(MalformedModelError, match="junk.onnx"):
        import_model(path)


# ----------------------------------------------------------------------------- external data
def save_external(tmp_path: Path, location: str) -> Path:
    """A MatMul model whose weight 'w' lives in an external file called ``location``."""
    w = numpy_helper.from_array(np.arange(6, dtype=F).reshape(3, 2), "w")
    m = single("MatMul", [1, 3], [w])
    tensor = m.graph.initializer[0]
    data = tensor.raw_data
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(data)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    target = Path(location) if os.path.isabs(location) else folder / location
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    g = import_model(save_external(tmp_path, "weights/w.bin"))
    np.testing.assert_array_equal(g.constant("w"), np.arange(6, dtype=F).reshape(3, 2))
    assert g.info("y").shape == (1, 2)


@pytest.mark.parametrize("location", ["../outside.bin", "weights/../../outside.bin"])
def test_external_data_escaping_the_folder(tmp_path: Path, location: str) -> None:
    path = save_external(tmp_path, location)
    with pytest.raises(MalformedModelError, match=r"tensor 'w': external data location .* is "
                                                  r"outside the model's folder"):
        import_model(path)


def test_external_data_absolute_location(tmp_path: Path) -> None:
    path = save_external(tmp_path, str(tmp_path / "abs.bin"))
    with pytest.raises(MalformedModelError, match="tensor 'w': external data location"):
        import_model(path)


def test_external_data_symlink_out_of_the_folder(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    path = save_external(tmp_path, "link.bin")
    (path.parent / "link.bin").rename(secret)
    (path.parent / "link.bin").symlink_to(secret)
    with pytest.raises(MalformedModelError, match="tensor 'w': .*outside the model's folder"):
        import_model(path)


def test_external_data_in_an_in_memory_model(tmp_path: Path) -> None:
    m = onnx.load(str(save_external(tmp_path, "w.bin")), load_external_data=False)
    with pytest.raises(MalformedModelError, match="tensor 'w' keeps its data in an external"):
        import_model(m)


def test_external_data_missing_file(tmp_path: Path) -> None:
    path = save_external(tmp_path, "w.bin")
    (path.parent / "w.bin").unlink()
    with pytest.raises(MalformedModelError, match="tensor 'w': cannot read external data"):
        import_model(path)


# ---------------------------------------------------------------------- inputs and outputs
def test_symbolic_batch_becomes_one_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        g = import_model(single("Relu", ["N", 3]))
    assert g.info("x").shape == (1, 3)
    assert "symbolic batch dim" in caplog.text and "'x'" in caplog.text


def test_other_unknown_dims_need_input_shapes() -> None:
    m = single("Relu", [1, "H", 4])
    with pytest.raises(UnsupportedModelError, match=r"graph input 'x' has symbolic dim 1 'H' "
                                                    r"in \(1, H, 4\); fix it with input_shapes="
                                                    r".* or --input-shape x=1xNx4"):
        import_model(m)
    g = import_model(m, input_shapes={"x": (1, 7, 4)})
    assert g.info("y").shape == (1, 7, 4)


def test_input_shapes_must_agree_with_static_dims_and_name_inputs() -> None:
    m = single("Relu", [1, 3])
    with pytest.raises(UnsupportedModelError, match="input_shapes gives"):
        import_model(m, input_shapes={"x": (1, 4)})
    with pytest.raises(ValueError, match="input_shapes names \\['z'\\]"):
        import_model(m, input_shapes={"z": (1,)})


def test_initializers_listed_as_inputs_are_constants() -> None:
    m = single("Add", [2], [init("c", np.ones(2, F))])
    m.graph.input.append(helper.make_tensor_value_info("c", FLOAT, [2]))
    g = import_model(m)
    assert g.inputs == ["x"] and g.values["c"].is_constant


def test_names_order_and_origin() -> None:
    nodes = [helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
             helper.make_node("Add", ["r", "s"], ["sum"])]
    m = model(nodes, {"b": ([2], FLOAT), "a": ([2], FLOAT)}, ["sum", "r"])
    g = import_model(m)
    assert g.inputs == ["b", "a"] and g.outputs == ["sum", "r"]
    assert [n.name for n in g] == ["Relu_0", "sig", "Add_2"]
    assert [n.origin for n in g] == [["Relu_0"], ["sig"], ["Add_2"]]
    assert g.producer("sum").op is Op.ADD


def test_dead_unsupported_nodes_are_skipped() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r"),
             helper.make_node("Erf", ["x"], ["dead"], name="unused")]
    g = import_model(model(nodes, {"x": ([2], FLOAT)}, ["y"]))
    assert [n.name for n in g] == ["r"]


def test_output_that_is_a_constant() -> None:
    node = helper.make_node("Shape", ["x"], ["y"], name="shape")
    g = import_model(model([node], {"x": ([2, 5], FLOAT)}, ["y"]))
    assert len(g) == 0 and g.outputs == ["y"]
    np.testing.assert_array_equal(g.constant("y"), [2, 5])
