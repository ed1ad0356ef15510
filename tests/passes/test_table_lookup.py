"""passes/table_lookup.py: an 8-bit tensor's elementwise chain with an island, up to a
quantize, as a table of its 256 values (compiler/lower/lower_island.py ``lower_table``).

The chains are quantize_static's GELU, x·(1 + erf(x/√2))·0.5 with a Q/DQ pair after each op
(timm EfficientFormer, FastViT, CaiT, PoolFormer). Every check is bit-exact: against
onnxruntime with its graph optimizations off (each op as written), the reference interpreter
and the unfused mode, which runs every op by itself.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler.lower.lower_island import pair_table


def _init(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def gelu(shape: tuple[int, ...] = (1, 16, 24, 24), dtype: type = np.uint8, zp: int = 128,
         *, per_channel_half: bool = False, second_input: bool = False,
         erf_output: bool = False, unary: str = "Erf") -> onnx.ModelProto:
    """x → Q/DQ → Div √2 → Erf → Q/DQ → Add 1 → Q/DQ → Mul x → Q/DQ → Mul 0.5 → Q/DQ → y,
    the constants 1 and 0.5 dequantized int8 constants as quantize_static writes them.
    ``per_channel_half``: 0.5 is a per-channel constant; ``second_input``: the Add adds a
    second graph input instead of 1; ``erf_output``: Erf's output is a graph output too."""
    nodes: list[onnx.NodeProto] = []
    inits = [_init("s_x", 0.04, np.float32), _init("z_x", zp, dtype),
             _init("s_e", 1 / 127, np.float32), _init("z_e", zp, dtype),
             _init("s_a", 2 / 255, np.float32), _init("z_a", 0, np.uint8),
             _init("s_m", 0.05, np.float32), _init("z_m", zp, dtype),
             _init("s_y", 0.025, np.float32), _init("z_y", zp, dtype),
             _init("sqrt2", 1.4142135, np.float32),
             _init("one_q", 127, np.int8), _init("one_s", 1 / 127, np.float32),
             _init("half_q", 127, np.int8), _init("half_s", 0.5 / 127, np.float32)]
    if per_channel_half:
        inits.append(_init("half", np.linspace(0.4, 0.6, shape[1]).reshape(
            1, shape[1], 1, 1), np.float32))
    def qdq(src: str, tag: str, dst: str) -> None:
        nodes.extend([
            helper.make_node("QuantizeLinear", [src, f"s_{tag}", f"z_{tag}"], [f"{dst}_q"]),
            helper.make_node("DequantizeLinear", [f"{dst}_q", f"s_{tag}", f"z_{tag}"], [dst])])
    qdq("x", "x", "xd")
    nodes += [helper.make_node("Div", ["xd", "sqrt2"], ["d"]),
              helper.make_node(unary, ["d"], ["e"])]
    qdq("e", "e", "ed")
    nodes += [helper.make_node("DequantizeLinear", ["one_q", "one_s"], ["one"]),
              helper.make_node("Add", ["ed", "w" if second_input else "one"], ["a"])]
    qdq("a", "a", "ad")
    nodes.append(helper.make_node("Mul", ["xd", "ad"], ["m"]))
    qdq("m", "m", "md")
    if not per_channel_half:
        nodes.append(helper.make_node("DequantizeLinear", ["half_q", "half_s"], ["half"]))
    nodes.append(helper.make_node("Mul", ["md", "half"], ["h"]))
    qdq("h", "y", "y")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    if second_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(shape)))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))]
    if erf_output:
        outputs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, list(shape)))
    graph = helper.make_graph(nodes, "gelu", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                     * 3).astype(np.float32) for i in model.graph.input}


def _kernels(model: onnx.ModelProto) -> list[dict]:
    return qfuse.compile_model(model).inspect()["kernels"]


def _check_exact(model: onnx.ModelProto, float_output: str | None = None) -> None:
    """Every output bit-exact in every mode; ``float_output`` (a float32 value read before
    its quantize) in the fused and unfused modes within one float32 ulp: they compute x/√2
    as x·(1/√2) (passes/canonicalize_arith.py, at most 1 ulp apart)."""
    feeds = _feeds(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in model.graph.output], session.run(None, feeds),
                    strict=True))
    for mode in ("fused", "unfused", "reference"):
        got = qfuse.compile_model(model, mode=mode).run(feeds)
        for name, array in want.items():
            if name == float_output and mode != "reference":
                assert np.all(np.abs(got[name] - array) <= np.spacing(np.abs(array))), name
                continue
            assert np.array_equal(got[name], array), (mode, name)


@pytest.mark.parametrize(("dtype", "zp", "shape"), [(np.uint8, 128, (1, 16, 24, 24)),
                                                     (np.int8, 0, (1, 16, 24, 24)),
                                                     (np.uint8, 128, (1, 7, 25, 27)),
                                                     (np.int8, 3, (1, 2, 3, 5))])
def test_gelu_chain_is_one_table(dtype: type, zp: int, shape: tuple[int, ...]) -> None:
    """The 13 nodes from x's dequantize to y's quantize are one table kernel, bit-exact
    (an odd element count: the last byte looked up alone; 30 elements: the table evaluated
    on several tensors of that shape)."""
    model = gelu(shape, dtype, zp)
    kernels = _kernels(model)
    tables = [k for k in kernels if "a table of x's 256 values" in k.get("note", "")]
    assert len(tables) == 1, [k["name"] for k in kernels]
    assert "13 ONNX nodes" in tables[0]["note"]
    assert not [k for k in kernels if k["primitive"] == "island"]
    assert not [k for k in qfuse.compile_model(model).inspect()["not_fused"]
                if k["op"] == "Table"]
    _check_exact(model)


def test_unfused_mode_keeps_the_ops() -> None:
    kernels = qfuse.compile_model(gelu(), mode="unfused").inspect()["kernels"]
    assert [k for k in kernels if k["primitive"] == "island"]
    assert not [k for k in kernels if "a table" in k.get("note", "")]
    # the mode disables the pass on a copy of the caller's context
    from qfuse.compiler.api import import_graph
    from qfuse.compiler.modes import run_passes
    from qfuse.passes.base import PassContext

    ctx = PassContext()
    run_passes(import_graph(gelu()), "unfused", ctx)
    assert ctx.disabled_passes == frozenset()


@pytest.mark.parametrize(("variant", "nodes"), [({"per_channel_half": True}, 10),
                                               ({"second_input": True}, 4)])
def test_table_ends_before_what_it_cannot_hold(variant: dict, nodes: int) -> None:
    """A per-channel constant (the table would depend on the channel) or a second run-time
    tensor ends the table at the quantize before it: x → Mul x's quantize (10 nodes), x →
    Erf's quantize (4)."""
    model = gelu(**variant)
    tables = [k for k in _kernels(model) if "a table" in k.get("note", "")]
    assert len(tables) == 1 and f"{nodes} ONNX nodes" in tables[0]["note"], tables
    _check_exact(model)


@pytest.mark.parametrize("shape", [(1, 16, 24, 24), (1, 3, 5, 7)])
def test_a_chain_with_a_slow_jit_op_is_a_table(shape: tuple[int, ...]) -> None:
    """Tanh has a oneDNN eltwise, but its jit kernel alone costs more than the look-up
    (1.55 ns an element against 0.3-0.6): the chain is a table all the same, bit-exact."""
    model = gelu(shape, unary="Tanh")
    tables = [k for k in _kernels(model) if "a table" in k.get("note", "")]
    assert len(tables) == 1 and "13 ONNX nodes" in tables[0]["note"], tables
    _check_exact(model)


def test_a_slow_op_read_once_stays_post_ops() -> None:
    """x → Q/DQ → Tanh → Q/DQ: a chain reading each value once runs as post-ops of the
    kernel that writes q (here the input's quantize); a table would be one kernel more."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"]),
             helper.make_node("Tanh", ["xd"], ["t"]),
             helper.make_node("QuantizeLinear", ["t", "s_t", "z_t"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "s_t", "z_t"], ["y"])]
    inits = [_init("s_x", 0.04, np.float32), _init("z_x", 128, np.uint8),
             _init("s_t", 1 / 127, np.float32), _init("z_t", 128, np.uint8)]
    shape = [1, 8, 16, 16]
    graph = helper.make_graph(
        nodes, "tanh", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert not [k for k in _kernels(model) if "a table" in k.get("note", "")]


def test_no_table_without_an_island() -> None:
    """A chain of fast oneDNN operations only (a QDQ SiLU's sigmoid: its jit kernel is
    faster): no table, the same values."""
    model = gelu(unary="Sigmoid")
    assert not [k for k in _kernels(model) if "a table" in k.get("note", "")]
    _check_exact(model)


def test_value_read_outside_ends_the_table_before_it() -> None:
    """Erf's output is also a graph output: the table covers x → Erf's quantize at most,
    never past a value something else reads."""
    model = gelu(erf_output=True)
    kernels = _kernels(model)
    tables = [k for k in kernels if "a table" in k.get("note", "")]
    assert all("13 ONNX nodes" not in k.get("note", "") for k in tables)
    _check_exact(model, float_output="e")


def test_pair_table() -> None:
    """Two bytes per look-up give T of each byte, for every pair of bytes."""
    by_byte = np.random.default_rng(1).integers(0, 256, 256).astype(np.uint8)
    pairs = pair_table(by_byte)
    every = np.arange(65536, dtype=np.uint16)
    got = np.take(pairs, every).view(np.uint8)
    assert np.array_equal(got, by_byte[every.view(np.uint8)])


def mish(shape: tuple[int, ...] = (1, 8, 16, 16)) -> onnx.ModelProto:
    """Mish, x·tanh(softplus(x)), with a Q/DQ pair after each op (YOLOv4-style detectors):
    Softplus is an island, Tanh and the Mul are oneDNN operations."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def qdq(src: str, tag: str, dst: str, scale: float, zp: int) -> None:
        nodes.extend([
            helper.make_node("QuantizeLinear", [src, f"s_{tag}", f"z_{tag}"], [f"{dst}_q"]),
            helper.make_node("DequantizeLinear", [f"{dst}_q", f"s_{tag}", f"z_{tag}"], [dst])])
        inits.extend([_init(f"s_{tag}", scale, np.float32), _init(f"z_{tag}", zp, np.uint8)])

    qdq("x", "x", "xd", 0.04, 128)
    nodes.append(helper.make_node("Softplus", ["xd"], ["sp"]))
    qdq("sp", "sp", "spd", 0.03, 0)
    nodes.append(helper.make_node("Tanh", ["spd"], ["t"]))
    qdq("t", "t", "td", 1 / 255, 0)
    nodes.append(helper.make_node("Mul", ["xd", "td"], ["m"]))
    qdq("m", "m", "y", 0.03, 20)
    graph = helper.make_graph(
        nodes, "mish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_mish_is_one_table() -> None:
    """Any unary island op: Mish's 9 nodes from x's dequantize to y's quantize are a table."""
    model = mish()
    tables = [k for k in _kernels(model) if "a table" in k.get("note", "")]
    assert len(tables) == 1 and "9 ONNX nodes" in tables[0]["note"], tables
    _check_exact(model)
