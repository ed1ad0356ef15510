"""Inputs whose dims the model leaves symbolic (compiler/api.py ``CompiledModel.run``): the
model compiles for the sizes the importer fixes (batch 1, or ``input_shapes``) and compiles
again, once per set of shapes, when a run feeds other sizes of those dims; a dim the model
fixes still has to match."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_builders import init

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import InputError


def _qdq_conv(dims: list[int | str]) -> onnx.ModelProto:
    """Q → DQ → Conv(DQ(w)) → Relu → Q → DQ with input dims ``dims`` (names are symbolic)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    inits = [init("xs", 0.02, np.float32), init("xz", 128, np.uint8),
             init("w", rng.integers(-100, 100, (8, 3, 3, 3)), np.int8),
             init("ws", 0.01, np.float32), init("b", np.linspace(-1, 1, 8), np.float32),
             init("ys", 0.05, np.float32), init("yz", 0, np.uint8)]
    out_dims = [dims[0], 8, dims[2], dims[3]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_symbolic_batch_compiles_again_for_another_batch() -> None:
    m = _qdq_conv(["batch", 3, 12, 10])
    compiled = compile_model(m)
    assert compiled.input_specs()["x"][0] == (1, 3, 12, 10)
    for batch in (1, 3, 1, 3):
        x = _x((batch, 3, 12, 10), batch)
        fixed = compile_model(m, input_shapes={"x": x.shape})
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], fixed.run({"x": x})["y"])
    assert list(compiled._specialized) == [(("x", (3, 3, 12, 10)),)]  # compiled once


def test_symbolic_spatial_dims_given_then_fed_other_sizes() -> None:
    m = _qdq_conv(["n", 3, "h", "w"])
    compiled = compile_model(m, input_shapes={"x": (1, 3, 12, 10)})
    x = _x((2, 3, 7, 9))
    fixed = compile_model(m, input_shapes={"x": x.shape})
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], fixed.run({"x": x})["y"])


def test_a_fixed_dim_still_has_to_match() -> None:
    compiled = compile_model(_qdq_conv(["batch", 3, 12, 10]))
    with pytest.raises(InputError, match=r"input 'x': got float32\[2, 3, 12, 11\]"):
        compiled.run({"x": _x((2, 3, 12, 11))})
    assert not compiled._specialized


def test_at_most_eight_shapes_are_kept() -> None:
    compiled = compile_model(_qdq_conv(["batch", 3, 4, 4]))
    for batch in range(2, 12):
        compiled.run({"x": _x((batch, 3, 4, 4))})
    assert [key[0][1][0] for key in compiled._specialized] == list(range(4, 12))


def test_cli_takes_symbolic_dims_from_the_inputs(tmp_path, capsys) -> None:
    """`qfuse run` / `qfuse bench` with --inputs on a model whose image size is symbolic: the
    inputs fix it, as --input-shape would (without --inputs the error names the dim)."""
    from qfuse.compiler.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(_qdq_conv(["n", 3, "h", "w"]), path)
    inputs = tmp_path / "x.npz"
    x = _x((2, 3, 7, 9))
    np.savez(inputs, x=x)
    assert main(["run", str(path), "--inputs", str(inputs), "--output",
                 str(tmp_path / "y.npz")]) == 0
    want = compile_model(_qdq_conv(["n", 3, "h", "w"]), input_shapes={"x": x.shape})
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["y"],
                                  want.run({"x": x})["y"])
    assert main(["bench", str(path), "--inputs", str(inputs), "--compare", "fused",
                 "--iters", "2", "--threads", "1"]) == 0
    capsys.readouterr()
    assert main(["run", str(path)]) == 1
    assert "symbolic dim 2 'h'" in capsys.readouterr().err
