"""Helpers for the shape-rule tests: infer one IR node, and ask onnx.shape_inference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.shapes import infer_node

F32 = DType.F32

Input = TensorInfo | np.ndarray | None


def rule(op: Op, attrs: object, inputs: Sequence[Input], n_out: int = 1,
         out_info: TensorInfo | None = None) -> list[TensorInfo]:
    """Infer one node; TensorInfo inputs are graph inputs, arrays are constants."""
    g = Graph("t")
    names = []
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
        elif isinstance(value, TensorInfo):
            names.append(g.add_input(f"i{i}", value).name)
        else:
            names.append(g.add_constant(f"i{i}", value).name)
    node = g.add_node(op, names, n_out, attrs, name="n")
    if out_info is not None:
        g.set_info(node.outputs[0], out_info)
    return infer_node(g, node)


def f32(*shape: int) -> TensorInfo:
    return TensorInfo(tuple(shape), F32)


def onnx_shapes(op_type: str, inputs: Sequence[tuple[int, ...] | np.ndarray],
                n_out: int = 1, opset: int = 18, **attrs: object) -> list[tuple[int, ...]]:
    """Output shapes onnx.shape_inference gives for one node (arrays become initializers)."""
    names, infos, inits = [], [], []
    for i, value in enumerate(inputs):
        name = f"i{i}"
        names.append(name)
        if isinstance(value, np.ndarray):
            inits.append(numpy_helper.from_array(value, name))
        else:
            infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, value))
    outs = [f"o{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph([node], "g", infos,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    return [tuple(d.dim_value for d in o.type.tensor_type.shape.dim)
            for o in inferred.graph.output]
