"""compiler/lower/lower_gate.py: a chain whose post-ops pass oneDNN's limit of 32 a
primitive (``_in_parts``, ``_too_long``): several kernels, each writing the float32 value
where it stops, instead of a lowering error (EfficientViT-L1 QDQ's written-out tanh GELU, 45
post-ops, failed to compile). Bit-identical with the unfused mode, which runs every op by
itself."""

from __future__ import annotations

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import qfuse
from tests.compiler.lower_helpers import onnx_qdq


def _init(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                     * 3).astype(np.float32) for i in model.graph.input}


def _kernels(model: onnx.ModelProto) -> list[dict]:
    return qfuse.compile_model(model).inspect()["kernels"]


def _long_chain(steps: list[tuple[str, str]], two_inputs: bool,
                shape: tuple[int, ...] = (1, 8, 12, 12)) -> onnx.ModelProto:
    """x (and w) quantized, then one op per step, ``(op, operand)`` with the operand "x",
    "w", "prev" (the running value) or a constant name, each followed by a Q/DQ pair."""
    nodes: list[onnx.NodeProto] = []
    inits = [_init("c0.5", 0.5, np.float32), _init("c1", 1.0, np.float32),
             _init("c0.044715", 0.044715, np.float32), _init("c0.79788", 0.7978846, np.float32)]

    def qdq(src: str, dst: str, scale: float, zp: int) -> None:
        onnx_qdq(nodes, inits, src, dst, scale, zp)

    qdq("x", "xd", 0.04, 128)
    if two_inputs:
        qdq("w", "wd", 0.03, 120)
    prev = "xd"
    for i, (op, operand) in enumerate(steps):
        other = {"x": "xd", "w": "wd", "prev": prev}.get(operand, operand)
        unary = op in ("Tanh", "Sigmoid")
        nodes.append(helper.make_node(op, [prev] if unary else [prev, other], [f"o{i}"]))
        prev = f"o{i}d" if i < len(steps) - 1 else "y"
        qdq(f"o{i}", prev, 0.05 if op != "Tanh" else 1 / 127, 128 if op != "Tanh" else 127)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    if two_inputs:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(shape)))
    graph = helper.make_graph(nodes, "long_chain", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# GELU's tanh form, x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³))), one Q/DQ pair after each op
GELU_TANH = [("Mul", "x"), ("Mul", "x"), ("Mul", "c0.044715"), ("Add", "x"),
             ("Mul", "c0.79788"), ("Tanh", ""), ("Add", "c1"), ("Mul", "x"), ("Mul", "c0.5")]


# the same with a sigmoid where GELU has tanh: no op whose jit kernel is slow, so no table
SIGMOID_GELU = [("Sigmoid", "") if op == "Tanh" else (op, arg) for op, arg in GELU_TANH]


def test_chain_too_long_for_post_ops_runs_in_two_kernels() -> None:
    """Nine oneDNN operations, no island, no slow one, but with their quantizers more
    post-ops than a oneDNN primitive holds (EfficientViT-L1 QDQ's GELU: 45): no table; two
    jit kernels, the first writing the chain's float32 value where it splits (exact),
    bit-identical to the unfused mode."""
    model = _long_chain(SIGMOID_GELU, two_inputs=False)
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if "a table" in k.get("note", "")]
    parts = [k for k in kernels if "more than oneDNN's 32" in k.get("note", "")]
    assert [k["impl"] for k in parts] == ["jit:uni", "jit:uni"], parts
    feeds = _feeds(model)
    assert np.array_equal(compiled.run(feeds)["y"],
                          qfuse.compile_model(model, mode="unfused").run(feeds)["y"])


def test_chain_too_long_with_two_inputs_splits_too() -> None:
    """The same length reading a second run-time tensor: split alike, and says why."""
    steps = [("Mul", "w"), ("Mul", "x"), ("Add", "w"), ("Mul", "x"), ("Add", "w"),
             ("Mul", "x"), ("Add", "w"), ("Mul", "x"), ("Add", "w")]
    model = _long_chain(steps, two_inputs=True)
    compiled = qfuse.compile_model(model)
    notes = [k.get("note", "") for k in compiled.inspect()["kernels"]]
    assert any("more than oneDNN's 32" in n for n in notes), notes
    feeds = _feeds(model)
    assert np.array_equal(compiled.run(feeds)["y"],
                          qfuse.compile_model(model, mode="unfused").run(feeds)["y"])


def _centered(op: str) -> onnx.ModelProto:
    """A LayerNorm written out over the middle axis (magika's, from jax2tf): ``x ∘ mean`` with
    the mean [1, 1, C] of x [1, T, C] (``op``: Sub or Div), quantized, times a second quantized
    tensor, plus a constant along T ([T, 1]), quantized."""
    nodes: list[onnx.NodeProto] = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
        helper.make_node(op, ["x", "m"], ["d"])]
    inits = [_init("c", np.random.default_rng(1).normal(0, 1, (64, 1)), np.float32)]
    for src, dst, scale in (("d", "dd", 0.02), ("g", "gd", 0.03), ("a", "y", 0.05)):
        nodes += [helper.make_node("QuantizeLinear", [src, f"{dst}s", f"{dst}z"], [f"{dst}q"]),
                  helper.make_node("DequantizeLinear", [f"{dst}q", f"{dst}s", f"{dst}z"],
                                   [dst])]
        inits += [_init(f"{dst}s", scale, np.float32), _init(f"{dst}z", 0, np.int8)]
        if dst == "gd":
            nodes += [helper.make_node("Mul", ["dd", "gd"], ["p"]),
                      helper.make_node("Add", ["p", "c"], ["a"])]
    shape = [1, 64, 256]
    graph = helper.make_graph(
        nodes, "centered", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                            for n in ("x", "g")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("op", ["Sub", "Div"])
def test_a_chain_from_x_minus_a_broadcast_operand_takes_it_as_its_own(op: str) -> None:
    """``x − r`` / ``x / r`` with r broadcast along the middle axis starts a chain whose other
    post-ops (a per-T constant, a full-size operand) keep it from being regrouped: as a binary
    post-op of ``x·1`` r ran on ``ref:any`` (magika: 11 ms of a 13.5 ms run); as the
    primitive's own operand, jit. The same float32 operations: bit-identical to the unfused
    mode."""
    model = _centered(op)
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    chain = next(k for k in kernels if k["node"].endswith(f"{op}_1"))
    assert chain["post_ops"][0] == f"binary_{op.lower()}", chain
    assert "(the primitive's own)" in chain["post_op_details"][0], chain
    assert not [k for k in kernels if k["impl"].startswith("ref")], kernels
    feeds = _feeds(model)
    assert np.array_equal(compiled.run(feeds)["y"],
                          qfuse.compile_model(model, mode="unfused").run(feeds)["y"])


def test_a_chain_still_on_a_reference_kernel_runs_op_by_op(monkeypatch) -> None:
    """The safety net: with the own-operand rule above switched off, the chain's one kernel
    runs on ``ref:any``; lower_gate then emits it op by op (the unfused mode's kernels, each
    jit) and says so. Bit-identical to the unfused mode."""
    from qfuse.compiler.lower import lower_gate

    monkeypatch.setattr(lower_gate, "_slow_as_post_op", lambda *args: False)
    model = _centered("Sub")
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    assert not [k for k in kernels if k["impl"].startswith("ref")], kernels
    assert any("runs on ref:any: op by op" in k.get("note", "") for k in kernels), kernels
    feeds = _feeds(model)
    assert np.array_equal(compiled.run(feeds)["y"],
                          qfuse.compile_model(model, mode="unfused").run(feeds)["y"])
