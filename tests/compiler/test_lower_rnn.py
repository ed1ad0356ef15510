"""Recurrent islands (one LSTM, GRU or RNN node) as oneDNN's RNN primitive
(compiler/lower/lower_rnn.py): which run as it, which stay islands and why, and how close
they come to the ONNX specification's and onnxruntime's float32 outputs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import init, model, run_ort

from qfuse.compiler.api import compile_model

F = np.float32
FLOAT = TensorProto.FLOAT

with warnings.catch_warnings():  # the suite's generators overflow casts on purpose
    warnings.simplefilter("ignore")
    from onnx.backend.test.case.node import collect_testcases

    SUITE = {c.name: c for c in collect_testcases()
             if c.name.startswith(("test_lstm", "test_gru", "test_simple_rnn", "test_rnn"))
             and "expanded" not in c.name}


def _kernel(compiled) -> dict:
    """The one kernel of the recurrent node."""
    (kernel,) = [k for k in compiled.inspect()["kernels"] if k.get("op") == "Island"]
    return kernel


def _constant_weights(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The suite's case with every input but X (the first) as an initializer, as exported
    models hold their weights, and the feeds left."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    (feeds, _), = case.data_sets
    graph = m.graph
    names = [i.name for i in graph.input]
    for name, value in zip(names[1:], feeds[1:], strict=True):
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    del graph.input[1:]
    return m, {names[0]: feeds[0]}


def test_the_suite_cases_exist() -> None:
    assert len(SUITE) == 18, sorted(SUITE)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_onnx_suite_with_constant_weights(name: str) -> None:
    """Every LSTM / GRU / RNN case of the ONNX backend suite, weights made constants: runs as
    oneDNN's RNN primitive and gives the specification's outputs within float32 rounding
    (the seq_length cases have no sequence_lens: their sequence is 2 steps)."""
    case = SUITE[name]
    m, feeds = _constant_weights(case)
    compiled = compile_model(m, threads=2)
    kernel = _kernel(compiled)
    assert kernel["primitive"] == "rnn", kernel
    assert "as oneDNN's RNN primitive" in kernel["note"]
    got = compiled.run(feeds)
    (_, expected), = case.data_sets
    for out, want in zip(compiled.outputs, expected, strict=True):
        np.testing.assert_allclose(got[out], want, rtol=1e-5, atol=1e-6, err_msg=out)


def _layer(op: str, *, directions: int = 1, steps: int = 5, batch: int = 1, channels: int = 6,
           hidden: int = 4, layout: int = 0, outputs: tuple[str, ...] = ("y", "", ""),
           seed: int = 0, runtime_state: bool = False, peephole: bool = False,
           **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One recurrent node over random weights (bias, initial state constants or inputs)."""
    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    d = directions
    x_shape = [batch, steps, channels] if layout else [steps, batch, channels]
    state_shape = [batch, d, hidden] if layout else [d, batch, hidden]
    inits = [init("W", rng.standard_normal((d, gates * hidden, channels)).astype(F) * 0.5),
             init("R", rng.standard_normal((d, gates * hidden, hidden)).astype(F) * 0.5),
             init("B", rng.standard_normal((d, 2 * gates * hidden)).astype(F) * 0.5)]
    inputs = {"x": (x_shape, FLOAT)}
    names = ["x", "W", "R", "B", ""]
    if runtime_state:
        inputs["h0"] = (state_shape, FLOAT)
    else:
        inits.append(init("h0", rng.standard_normal(state_shape).astype(F)))
    names.append("h0")
    if op == "LSTM":
        inits.append(init("c0", rng.standard_normal(state_shape).astype(F)))
        names.append("c0")
        if peephole:
            inits.append(init("P", rng.standard_normal((d, 3 * hidden)).astype(F)))
            names.append("P")
    direction = {1: "forward", 2: "bidirectional"}[d] if "direction" not in attrs else \
        attrs.pop("direction")
    node = helper.make_node(op, names, list(outputs[:2 if op != "LSTM" else 3]), name="rnn",
                            hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)
    m = model([node], inputs, [o for o in outputs if o], inits, opset=14)
    feeds = {name: rng.standard_normal(shape).astype(F) for name, (shape, _) in inputs.items()}
    return m, feeds


def _reference(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs; onnx.reference's where onnxruntime has no kernel (layout 1)."""
    try:
        return run_ort(m, feeds, optimized=False)
    except Exception:  # noqa: BLE001 - onnxruntime refuses batch-first recurrent layers
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(m).run(None, feeds)


CASES = [
    dict(op="LSTM", directions=2, batch=3),
    dict(op="LSTM", directions=2, batch=3, layout=1, outputs=("y", "yh", "yc")),
    dict(op="LSTM", batch=2, outputs=("", "yh", ""), peephole=True),
    dict(op="LSTM", directions=2, batch=2, outputs=("y", "", "yc"), runtime_state=True),
    dict(op="LSTM", direction="reverse", batch=2, layout=1, runtime_state=True,
         outputs=("y", "yh", "")),
    dict(op="GRU", directions=2, batch=3, outputs=("y", "yh")),
    dict(op="GRU", directions=2, batch=2, linear_before_reset=1, outputs=("y", "yh")),
    dict(op="GRU", batch=2, layout=1, linear_before_reset=1, runtime_state=True,
         outputs=("y", "yh")),
    dict(op="RNN", directions=2, batch=3, outputs=("y", "yh")),
    dict(op="RNN", batch=2, activations=["Relu"], outputs=("y", "yh")),
    dict(op="RNN", directions=2, batch=2, activations=["Sigmoid", "Sigmoid"],
         outputs=("y", "yh")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_runs_as_onednn_rnn(case: dict) -> None:
    """Directions, batch-first layout, batch > 1 (Y and the batch-first states are strided
    views of oneDNN's outputs), missing outputs, initial states given at run time, peepholes,
    LBR GRU and RNN's activations: oneDNN's outputs within float32 rounding of the
    reference's."""
    m, feeds = _layer(**dict(case))
    compiled = compile_model(m, threads=2)
    kernel = _kernel(compiled)
    assert kernel["primitive"] == "rnn" and not kernel["impl"].startswith("numpy"), kernel
    got = compiled.run(feeds)
    for out, want in zip(compiled.outputs, _reference(m, feeds), strict=True):
        assert got[out].shape == want.shape, out
        np.testing.assert_allclose(got[out], want, rtol=1e-5, atol=2e-6, err_msg=out)


@pytest.mark.parametrize(("case", "why"), [
    (dict(op="LSTM", clip=0.5), "clip: oneDNN's cells do not clip"),
    (dict(op="LSTM", input_forget=1), "input_forget"),
    (dict(op="GRU", activations=["Sigmoid", "Relu"], outputs=("y", "yh")),
     "activations ['Sigmoid', 'Relu']"),
    (dict(op="RNN", directions=2, activations=["Tanh", "Relu"], outputs=("y", "yh")),
     "oneDNN's RNN cell takes one of"),
])
def test_declined_layers_stay_islands_and_say_why(case: dict, why: str) -> None:
    m, feeds = _layer(**dict(case))
    compiled = compile_model(m, threads=2)
    kernel = _kernel(compiled)
    assert kernel["impl"] == "numpy" and "not oneDNN's RNN" in kernel["note"], kernel
    assert why in kernel["note"], kernel["note"]
    got = compiled.run(feeds)
    for out, want in zip(compiled.outputs, _reference(m, feeds), strict=True):
        np.testing.assert_allclose(got[out], want, rtol=1e-5, atol=1e-6, err_msg=out)


@pytest.mark.parametrize("batch", [1, 3])
def test_quantized_lstm_between_dequantize_and_quantize(batch: int) -> None:
    """An LSTM in a QDQ model (onnxruntime's quantize_static leaves it float between a
    DequantizeLinear and a QuantizeLinear): the quantized output is at most 1 LSB from
    onnxruntime's, where float32 rounding moves a value across a rounding tie. The
    quantize reads Y in oneDNN's layout ([T, D, N, H] strided over {T, N, D·H})."""
    m, feeds = _layer("LSTM", directions=2, batch=batch, steps=8, channels=16, hidden=8)
    graph = m.graph
    scale, zero = init("s", np.array(0.02, F)), init("z", np.array(128, np.uint8))
    graph.initializer.extend([scale, zero])
    graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]))
    graph.node.insert(1, helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]))
    graph.node[2].input[0] = "xd"
    graph.node.append(helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"]))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("yq", TensorProto.UINT8, [8, 2, batch, 8]))
    compiled = compile_model(m, threads=2)
    assert _kernel(compiled)["primitive"] == "rnn"
    (want,) = run_ort(m, feeds, optimized=False)
    got = compiled.run(feeds)["yq"]
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and np.mean(diff != 0) < 0.01, (diff.max(), np.mean(diff != 0))


@pytest.mark.parametrize(("hidden", "team"), [(96, 1), (256, None)])
def test_a_small_gemm_driven_layer_runs_on_one_thread(hidden: int, team: int | None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's GRU (linear before reset) has only oneDNN's GEMM-driven ("ref") RNN: up to
    ``ONE_THREAD_HIDDEN`` hidden channels its primitive is made for and runs on one thread
    (its steps' GEMMs are too small to share: 64 → 96 over 100 steps 161 → 105 µs), and the
    plan's team size is back for the kernels after it; larger layers keep the plan's threads.
    The same outputs bit for bit as the layer on two threads."""
    from qfuse.compiler.lower import lower_rnn
    from qfuse.runtime.onednn import get_num_threads

    m, feeds = _layer("GRU", hidden=hidden, channels=64, steps=20, linear_before_reset=1,
                      outputs=("y", "yh"))
    compiled = compile_model(m, threads=2)
    [kernel] = [k for k in compiled.plan.kernels if k.kind == "rnn"]
    assert kernel.impl.startswith("ref") and kernel.team == team
    assert ("on one thread" in kernel.info.note) is (team == 1)
    monkeypatch.setattr(lower_rnn, "ONE_THREAD_HIDDEN", 0)
    shared = compile_model(m, threads=2)
    got = compiled.run(feeds)
    assert get_num_threads() == 2
    for name, want in shared.run(feeds).items():
        np.testing.assert_array_equal(got[name], want)
