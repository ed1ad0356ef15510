"""Float islands end to end: which nodes join one island, quantized values around an island,
run-time shapes, concurrency, and what `inspect` and the CLI show."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from island_helpers import islands
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model
from qfuse.compiler.cli import main
from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op

F = np.float32
FLOAT = TensorProto.FLOAT


def _chain(ops: list[str]) -> list:
    names = ["x", *[f"v{i}" for i in range(len(ops) - 1)], "y"]
    return [helper.make_node(op, [names[i]], [names[i + 1]], name=f"n{i}")
            for i, op in enumerate(ops)]


def test_connected_islands_merge_native_nodes_split_them() -> None:
    g = import_model(model(_chain(["Erf", "Cos", "Sin"]), {"x": ([2, 3], FLOAT)}, ["y"]))
    assert [n.op for n in g] == [Op.ISLAND]
    assert islands(g)[0].attrs.ops == ("Erf", "Cos", "Sin")
    g = import_model(model(_chain(["Erf", "Relu", "Sin"]), {"x": ([2, 3], FLOAT)}, ["y"]))
    assert [n.op for n in g] == [Op.ISLAND, Op.RELU, Op.ISLAND]


def test_a_long_chain_of_islands_merges_with_one_sort_per_pass(monkeypatch) -> None:
    """60 island ops in a row join into one island, sorting the graph once per merging pass
    (two: one that joins, one that finds nothing), not once per join (a detector's
    post-processing holds thousands of island nodes)."""
    from qfuse.ir.graph import Graph

    sorts = []
    topo_order = Graph.topo_order
    monkeypatch.setattr(Graph, "topo_order", lambda g: sorts.append(1) or topo_order(g))
    ops = ["Erf", "Sin", "Cos"] * 20
    g = import_model(model(_chain(ops), {"x": ([2, 3], FLOAT)}, ["y"]))
    assert [n.op for n in g] == [Op.ISLAND] and islands(g)[0].attrs.ops == tuple(ops)
    assert len(sorts) < 10, len(sorts)


def test_islands_joined_through_a_native_node_stay_apart() -> None:
    # a = Erf(x); b = Relu(a); y = Add(Sin(a), b) with Add native: Erf and Sin both islands,
    # joined directly (a → Sin) and through Relu; merging them would need Relu inside.
    nodes = [helper.make_node("Erf", ["x"], ["a"], name="erf"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Sin", ["a"], ["c"], name="sin"),
             helper.make_node("Mul", ["c", "b"], ["d"], name="mul"),
             helper.make_node("Cos", ["d"], ["y"], name="cos")]
    m = model(nodes, {"x": ([4], FLOAT)}, ["y"])
    g = import_model(m)
    assert sorted(n.attrs.ops for n in islands(g)) == [("Cos",), ("Erf", "Sin")]
    x = np.linspace(-2, 2, 4, dtype=F)
    for mode in ("reference", "fused"):
        got = compile_model(m, mode=mode).run({"x": x})["y"]
        np.testing.assert_allclose(got, run_ort(m, {"x": x})[0], rtol=1e-6)


def test_quantized_values_are_dequantized_before_an_island_and_quantized_after() -> None:
    s, zp = init("s", np.array(0.05, F)), init("zp", np.array(128, np.uint8))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q0"),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dq0"),
             helper.make_node("Erf", ["xd"], ["e"], name="erf"),
             helper.make_node("QuantizeLinear", ["e", "s", "zp"], ["eq"], name="q1"),
             helper.make_node("DequantizeLinear", ["eq", "s", "zp"], ["y"], name="dq1")]
    m = model(nodes, {"x": ([1, 64], FLOAT)}, ["y"], [s, zp])
    g = import_model(m)
    assert [n.attrs.ops for n in islands(g)] == [("Erf",)]
    x = np.linspace(-3, 3, 64, dtype=F).reshape(1, 64)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    # the unfused mode keeps the island (the fused one makes DQ → Erf → Q a table of the 256
    # values, passes/table_lookup.py, whose values are the same)
    compiled = compile_model(m, mode="unfused")
    island = next(k for k in compiled.inspect()["kernels"] if k["primitive"] == "island")
    assert island["src_dtype"] == "f32" and island["dst_dtype"] == "f32"
    got = compiled.run({"x": x})["y"]
    steps = np.abs(got - want) / 0.05
    assert steps.max() <= 1 + 1e-4  # one quantization step at most (erf rounding at a tie)
    assert np.mean(steps < 1e-4) > 0.95
    assert np.array_equal(compile_model(m, mode="fused").run({"x": x})["y"], got)


def test_static_island_writes_its_outputs_in_place_from_any_thread() -> None:
    """An onnxruntime island with static shapes binds its inputs and outputs to the plan's
    buffers (IOBinding; no output allocation, no copy): `inspect` says so, and 8 threads
    running one compiled model each get onnxruntime's own result for their input."""
    nodes = [helper.make_node("Erf", ["x"], ["e"], name="erf"),
             helper.make_node("Relu", ["e"], ["y"], name="relu")]
    m = model(nodes, {"x": ([2, 3, 40], FLOAT)}, ["y", "e"])
    compiled = compile_model(m, mode="fused")
    island = next(k for k in compiled.inspect()["kernels"] if k["primitive"] == "island")
    assert "writing its outputs in place" in island["note"], island["note"]
    feeds = [np.random.default_rng(i).normal(0, 1.5, (2, 3, 40)).astype(F) for i in range(8)]
    want = [run_ort(m, {"x": f}, optimized=False) for f in feeds]
    results: dict[int, dict[str, np.ndarray]] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = compiled.run({"x": feeds[i]})

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (y, e) in enumerate(want):
        np.testing.assert_array_equal(results[i]["e"], e)
        np.testing.assert_array_equal(results[i]["y"], y)


def test_elementwise_island_runs_on_its_inputs_own_layout() -> None:
    """A GELU's Erf island after a channels-last float32 kernel (an int8 convolution's
    dequantized output divided by √2): the island reads those bytes and writes its output in
    the same layout (no reorder to row-major and back), and its values are onnxruntime's Erf
    of its input, element for element."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("QuantizeLinear", ["in", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["Wq", "ws"], ["Wd"]),
             helper.make_node("Conv", ["xd", "Wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "cs", "xz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "cs", "xz"], ["cd"]),
             helper.make_node("Div", ["cd", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["y"])]
    inits = [init("xs", np.array(0.05, F)), init("xz", np.array(128, np.uint8)),
             init("ws", np.array(0.01, F)), init("cs", np.array(0.04, F)),
             init("Wq", rng.integers(-60, 60, (16, 8, 3, 3)).astype(np.int8)),
             init("sqrt2", np.array(1.4142135, F)), init("one", np.array(1.0, F))]
    m = model(nodes, {"in": ([1, 8, 10, 12], FLOAT)}, ["y"], inits)
    compiled = compile_model(m, mode="fused")
    kernels = compiled.inspect()["kernels"]
    island = next(k for k in kernels if k["primitive"] == "island")
    assert "on its input's own layout" in island["note"], island["note"]
    assert "strides=(1920, 1, 192, 16)" in island["note"], island["note"]  # channels-last
    assert sum(k["primitive"] == "reorder" and k["src_dtype"] == "f32" for k in kernels) == 1
    feeds = {"in": rng.normal(0, 1, (1, 8, 10, 12)).astype(F)}
    values = compiled.run_all(feeds)
    erf = model([helper.make_node("Erf", ["t"], ["e"])], {"t": ([1, 16, 10, 12], FLOAT)}, ["e"])
    np.testing.assert_array_equal(values["e"], run_ort(erf, {"t": values["t"]},
                                                       optimized=False)[0])
    np.testing.assert_array_equal(compiled.run(feeds)["y"], values["e"] + F(1))


def test_run_time_shapes_reach_the_outputs_and_runs_are_independent_per_thread() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Transpose", ["nz"], ["y"], name="t")]
    m = model(nodes, {"x": ([6], FLOAT)}, ["y"])
    g = import_model(m)
    assert [n.attrs.ops for n in islands(g)] == [("NonZero", "Transpose")]
    compiled = compile_model(m, mode="fused")
    feeds = [np.array([0, 1, 0, 2, 3, 0], F) * (i % 2) + (i % 3 == 0) for i in range(8)]
    want = [np.transpose(np.nonzero(f)).astype(np.int64) for f in feeds]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = compiled.run({"x": feeds[i]})["y"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        np.testing.assert_array_equal(results[i], w)


@pytest.mark.parametrize("mode", ["fused", "unfused", "reference"])
def test_outputs_come_in_the_model_order_when_one_has_a_run_time_shape(mode: str) -> None:
    """A detector's boxes / scores / labels: outputs of run-time shape (islands) and native
    ones, returned in the model's output order as onnxruntime does."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["x"], ["s"], name="sig")]
    m = model(nodes, {"x": ([6], FLOAT)}, ["s", "nz", "r"])
    out = compile_model(m, mode=mode).run({"x": np.linspace(-1, 1, 6).astype(F)})
    assert list(out) == ["s", "nz", "r"]


def test_inspect_lists_islands_with_engine_and_reason(tmp_path, capsys) -> None:
    path = tmp_path / "m.onnx"
    import onnx

    onnx.save(model(_chain(["Erf", "Relu"]), {"x": (["N", 3], FLOAT)}, ["y"]), str(path))
    assert main(["inspect", str(path), "--json", "--input-shape", "x=2x3"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["islands"] == [{"name": "n0", "nodes": ["n0"], "ops": ["Erf"],
                                "engine": "onnxruntime",
                                "reason": "op Erf has no native lowering",
                                "dynamic_outputs": []}]
    assert main(["inspect", str(path), "--input-shape", "x=2x3"]) == 0
    assert "float islands (1):\n  n0 on onnxruntime: 1 ONNX node(s), ops Erf" in (
        capsys.readouterr().out)
    assert main(["compile", str(path), "--input-shape", "x=2x3"]) == 0
    assert "float islands: 1 (1 on onnxruntime) — ops Erf" in capsys.readouterr().out


def test_a_symbolic_dim_left_unfixed_is_named() -> None:
    m = model(_chain(["Relu"]), {"x": ([1, "seq", 4], FLOAT)}, ["y"])
    with pytest.raises(UnsupportedModelError, match=r"'x' has symbolic dim 1 'seq' .*"
                                                    r"--input-shape x=1xNx4"):
        compile_model(m)
    assert compile_model(m, input_shapes={"x": (1, 5, 4)}).graph.info("y").shape == (1, 5, 4)


def test_inspect_text_summarizes_a_large_island() -> None:
    """A detector's post-processing island holds a thousand nodes and as many reasons: the
    text counts its ops and lists the first reasons (JSON keeps every one)."""
    from qfuse.compiler.cli_inspect import ISLAND_TEXT_ITEMS, format_inspect

    ops = ["NonZero", "Gather"] * 10 + ["TopK"]
    reasons = [f"reads 'v{i}', whose shape is known only at run time" for i in range(12)]
    info = {"kernels": [], "mode": "fused", "cpu_isa": "any", "reorders": 0, "io_reorders": 0,
            "in_place_sums": 0, "numpy_kernels": 0, "concats": [],
            "not_fused": [], "islands": [{"name": "post", "engine": "onnxruntime",
                                          "nodes": [f"n{i}" for i in range(21)], "ops": ops,
                                          "reason": "; ".join(reasons)}]}
    text = format_inspect(info).split("float islands (1):\n")[1]
    assert "21 ONNX node(s), ops NonZero ×10, Gather ×10, TopK\n" in text
    assert "v7" in text and "v8" not in text and f"; and {12 - ISLAND_TEXT_ITEMS} more" in text


def test_an_island_reading_only_constants_is_computed_at_import() -> None:
    """quantize_static's causal mask: DequantizeLinear(q, +inf) of a constant, added to the
    scores, whose quantizer (scale +inf as well) runs as an island. The mask's dequantize reads
    only constants: computed once by onnxruntime at import, no island of its own. Fused,
    reference and onnxruntime agree bit for bit (the NaN of 0·inf reaches a u8 quantizer)."""
    inf = np.float32(np.inf)
    nodes = [helper.make_node("DequantizeLinear", ["mq", "ms", "mz"], ["mask"], name="mask_dq"),
             helper.make_node("Add", ["x", "mask"], ["s"], name="add"),
             helper.make_node("QuantizeLinear", ["s", "ss", "sz"], ["sq"], name="s_q"),
             helper.make_node("DequantizeLinear", ["sq", "ss", "sz"], ["sd"], name="s_dq"),
             helper.make_node("Softmax", ["sd"], ["p"], name="softmax", axis=-1),
             helper.make_node("QuantizeLinear", ["p", "ps", "pz"], ["pq"], name="p_q"),
             helper.make_node("DequantizeLinear", ["pq", "ps", "pz"], ["y"], name="p_dq")]
    inits = [init("mq", np.zeros((8, 8), np.uint8)), init("ms", np.array(inf)),
             init("mz", np.array(0, np.uint8)), init("ss", np.array(inf)),
             init("sz", np.array(0, np.uint8)), init("ps", np.array(1 / 255, F)),
             init("pz", np.array(0, np.uint8))]
    m = model(nodes, {"x": ([1, 8, 8], FLOAT)}, ["y"], inits)
    g = import_model(m)
    assert [i.attrs.ops for i in islands(g)] == [("QuantizeLinear", "DequantizeLinear")]
    x = np.random.default_rng(3).standard_normal((1, 8, 8)).astype(F)
    want = run_ort(m, {"x": x})[0]
    for mode in ("fused", "reference"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"], want)


def _scatter_all(cover: str) -> onnx.ModelProto:
    """x + 1 written over x by a ScatterND whose constant indices name ``cover`` elements:
    "all" of them in row-major order (torch's in-place ``a[:, :, 0:, 0:] = b`` exported over
    the whole tensor, MViTv2), all but the first ("partial"), or all with the first named by
    an index past the end of its dim ("wrapped": invalid, onnxruntime refuses it at run)."""
    shape = (1, 2, 3, 4)
    index = np.stack(np.meshgrid(*[np.arange(d) for d in shape], indexing="ij"), -1)
    if cover == "partial":
        index = index.reshape(-1, 4)[1:].reshape(1, 23, 4)
    if cover == "wrapped":  # element (0, 0, 0, 0) named (0, 0, 0, 4): out of range
        index[0, 0, 0, 0, 3] = 4
    updates_shape = list(index.shape[:-1])
    nodes = [helper.make_node("Add", ["x", "one"], ["u0"]),
             helper.make_node("Reshape", ["u0", "ushape"], ["u"]),
             helper.make_node("ScatterND", ["x", "idx", "u"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(index.astype(np.int64), "idx"),
             numpy_helper.from_array(np.array(updates_shape, np.int64), "ushape")]
    if cover == "partial":  # the updates are the x + 1 of every element but the first
        nodes[0:2] = [helper.make_node("Add", ["x", "one"], ["u1"]),
                      helper.make_node("Reshape", ["u1", "flat"], ["u2"]),
                      helper.make_node("Slice", ["u2", "start", "end"], ["u3"]),
                      helper.make_node("Reshape", ["u3", "ushape"], ["u"])]
        inits += [numpy_helper.from_array(np.array([24], np.int64), "flat"),
                  numpy_helper.from_array(np.array([1], np.int64), "start"),
                  numpy_helper.from_array(np.array([24], np.int64), "end")]
    graph = helper.make_graph(nodes, "scatter", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


@pytest.mark.parametrize("cover", ["all", "partial", "wrapped"])
def test_scatter_nd_over_every_element_is_its_updates(cover: str) -> None:
    """A ScatterND island whose constant indices name every element once in row-major order
    is its updates (no kernel); any other stays an island onnxruntime runs. Both equal
    onnxruntime's output."""
    m = _scatter_all(cover)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    compiled = compile_model(m)
    if cover == "wrapped":  # no alias made of it: the island runs, and fails as onnxruntime
        assert [k for k in compiled.inspect()["kernels"] if k["primitive"] == "island"]
        with pytest.raises(Exception, match="ScatterND|out of bounds|index"):
            compiled.run({"x": x})
        return
    islands = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "island"]
    assert len(islands) == (0 if cover == "all" else 1), islands
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], session.run(None, {"x": x})[0])
