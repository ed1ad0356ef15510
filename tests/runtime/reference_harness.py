"""Single-node checks of the reference interpreter against ONNX Runtime.

``compare`` builds the same op twice — an ONNX node run by ONNX Runtime with graph
optimizations disabled, and the IR node (attributes already resolved, as the importer would)
run by ``evaluate`` — and compares the outputs:

- float outputs: ``max |ours - ort| <= 1e-5 * max(1, |ort|)`` element-wise (FLOAT_TOL);
- integer / bool outputs: equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.runtime.reference import evaluate

FLOAT_TOL = 1e-5
OPSET = 21


@dataclass
class Case:
    """One ONNX node and its IR twin. ``inputs`` are fed, ``constants`` are initializers;
    the IR node reads them in ``order`` (names; "" = missing optional input)."""

    onnx_op: str
    onnx_attrs: dict[str, Any]
    op: Op
    attrs: Any
    inputs: dict[str, np.ndarray]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    order: list[str] | None = None
    onnx_order: list[str] | None = None
    n_outputs: int = 1
    opset: int = OPSET


def run_ort(case: Case) -> list[np.ndarray]:
    names = case.onnx_order if case.onnx_order is not None else _order(case)
    outs = [f"y{i}" for i in range(case.n_outputs)]
    node = helper.make_node(case.onnx_op, names, outs, **case.onnx_attrs)
    graph = helper.make_graph(
        [node],
        "single",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in case.inputs.items()
        ],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in case.constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, dict(case.inputs))


def build_graph(case: Case) -> Graph:
    g = Graph(case.onnx_op)
    for name, array in case.inputs.items():
        g.add_input(name, TensorInfo(array.shape, DType.from_numpy(array.dtype)))
    for name, array in case.constants.items():
        g.add_constant(name, np.asarray(array))
    node = g.add_node(
        case.op, _order(case), [f"y{i}" for i in range(case.n_outputs)], case.attrs, name="node"
    )
    g.outputs = list(node.outputs)
    return g


def run_ours(case: Case) -> list[np.ndarray]:
    g = build_graph(case)
    result = evaluate(g, dict(case.inputs))
    return [result[name] for name in g.outputs]


def _order(case: Case) -> list[str]:
    if case.order is not None:
        return case.order
    return list(case.inputs) + list(case.constants)


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} vs {ref.dtype}"
    if ref.dtype.kind != "f":
        np.testing.assert_array_equal(ours, ref, err_msg=what)
        return
    both_nan = np.isnan(ours) & np.isnan(ref)
    bound = FLOAT_TOL * np.maximum(1.0, np.abs(ref.astype(np.float64)))
    diff = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    bad = ~both_nan & ~(diff <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {ref.size} elements off; worst |diff| "
        f"{np.nanmax(np.where(bad, diff, 0)):.3g} at ref {ref[bad][0]!r}, ours {ours[bad][0]!r}"
    )


def compare(case: Case) -> list[np.ndarray]:
    """Run both and assert they agree (module docstring); returns our outputs."""
    ref, ours = run_ort(case), run_ours(case)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert_close(a, b, f"{case.onnx_op} output {i}")
    return ours


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)
