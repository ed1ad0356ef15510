"""Small ONNX models for the importer tests, built with onnx.helper."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnxruntime 1.x reads IR <= 10; 8 covers every opset up to 18


def ir_version(opset: int) -> int:
    return 10 if opset >= 21 else 9 if opset >= 19 else IR_VERSION


def init(name: str, value: object, dtype: object = None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, tuple[Sequence[int | str | None] | None, int]],
    outputs: Sequence[str],
    initializers: Sequence[onnx.TensorProto] = (),
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """``inputs``: name -> (shape, elem_type); outputs are declared without a type."""
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        list(initializers),
    )
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    m = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version(opset))
    return typed_outputs(m)


def typed_outputs(m: onnx.ModelProto) -> onnx.ModelProto:
    """Graph outputs typed by onnx.shape_inference (the checker wants a type and shape); when
    inference fails (models meant to be rejected), float with symbolic dims."""
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    except Exception:  # noqa: BLE001 - models meant to be rejected fall through
        inferred = None
    if inferred is not None and all(o.type.tensor_type.HasField("shape")
                                    for o in inferred.graph.output):
        return inferred
    rank = len(m.graph.input[0].type.tensor_type.shape.dim) if m.graph.input else 0
    for out in m.graph.output:
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(helper.make_tensor_value_info(
                out.name, TensorProto.FLOAT, [f"{out.name}_{i}" for i in range(rank)]))
    return m


def single(
    op_type: str,
    shape: Sequence[int],
    initializers: Sequence[onnx.TensorProto] = (),
    inputs: Sequence[str] | None = None,
    opset: int = 17,
    elem_type: int = TensorProto.FLOAT,
    n_outputs: int = 1,
    **attrs: object,
) -> onnx.ModelProto:
    """One node reading graph input ``x`` (plus ``initializers``), named 'n'."""
    names = list(inputs) if inputs is not None else ["x", *[t.name for t in initializers]]
    outs = ["y"] if n_outputs == 1 else [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name="n", **attrs)
    return model([node], {"x": (shape, elem_type)}, outs, initializers, opset)


def infer_onnx(m: onnx.ModelProto) -> list[tuple[int, ...]]:
    """Output shapes from onnx.shape_inference (strict)."""
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    shapes = []
    for out in inferred.graph.output:
        dims = out.type.tensor_type.shape.dim
        shapes.append(tuple(d.dim_value for d in dims))
    return shapes


def run_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray],
            optimized: bool = True) -> list[np.ndarray]:
    """ONNX Runtime's outputs; ``optimized=False`` keeps its graph as written (no QDQ fusion
    into QLinear kernels, which compute in other precisions)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_reference(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx.reference (for cases ONNX Runtime refuses, e.g. SAME auto_pad with dilation)."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]


def qdq_pair(name: str, src: str, dst: str) -> list[onnx.NodeProto]:
    """QuantizeLinear → DequantizeLinear of ``src`` into ``dst`` with initializers ``{name}s``
    (scale) and ``{name}z`` (zero point) the caller provides."""
    return [helper.make_node("QuantizeLinear", [src, f"{name}s", f"{name}z"], [f"{name}q"]),
            helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"], [dst])]


def image_repro() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Issue 13's repro: one Q/DQ pair (scale 2/255, zero point 128) fed an image normalized
    as (p/255 - 0.5)/0.5 in float32, p = 0..255 in three channels."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    inits = [init("s", np.array(2 / 255, np.float32)), init("z", np.array(128, np.uint8))]
    m = model(nodes, {"x": ((1, 3, 16, 16), TensorProto.FLOAT)}, ["y"], inits, opset=13)
    p = np.arange(256, dtype=np.float32)
    x = (p / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    return m, {"x": np.stack([x, x, x]).reshape(1, 3, 16, 16).astype(np.float32)}
