"""Malformed models for test_bad_inputs.py, each a small change to one valid QDQ model.

``base()`` is x[1,3,8,8] float -> QuantizeLinear (u8) -> DequantizeLinear -> Conv 'conv' (s8
per-channel weights, 4 outputs, pads 1) -> Relu 'relu' -> y. The other builders return a
model (never checked: most are meant to be refused) or write files next to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.compiler.onnx_builders import typed_outputs

OPSET = 17


def init(name: str, value: object, dtype: object = None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def qdq_inits(scale: object = 0.05, zp: object = 128, zp_dtype: object = np.uint8,
              prefix: str = "x") -> list[onnx.TensorProto]:
    return [init(f"{prefix}_s", scale, np.float32), init(f"{prefix}_z", zp, zp_dtype)]


def weight_inits(c_out: int = 4, c_in: int = 3, k: int = 3) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [init("w", rng.integers(-100, 100, (c_out, c_in, k, k)), np.int8),
            init("w_s", np.full(c_out, 0.01), np.float32),
            init("w_z", np.zeros(c_out), np.int8)]


def graph_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
                outputs: Sequence[onnx.ValueInfoProto], inits: Sequence[onnx.TensorProto],
                opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "bad", list(inputs), list(outputs), list(inits))
    return typed_outputs(helper.make_model(graph, ir_version=8,
                                           opset_imports=[helper.make_opsetid("", opset)]))


def base(shape: Sequence[int | str] = (1, 3, 8, 8), **conv_attrs: object) -> onnx.ModelProto:
    attrs = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3], **conv_attrs}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], name="wdq",
                              axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", **attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return graph_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       qdq_inits() + weight_inits())


def replace_init(m: onnx.ModelProto, tensor: onnx.TensorProto) -> onnx.ModelProto:
    for i, t in enumerate(m.graph.initializer):
        if t.name == tensor.name:
            m.graph.initializer[i].CopyFrom(tensor)
            return m
    m.graph.initializer.append(tensor)
    return m


def node(m: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.name == name)


def set_attr(m: onnx.ModelProto, node_name: str, **attrs: object) -> onnx.ModelProto:
    n = node(m, node_name)
    for key, value in attrs.items():
        kept = [a for a in n.attribute if a.name != key]
        del n.attribute[:]
        n.attribute.extend(kept)
        if value is not None:
            n.attribute.append(helper.make_attribute(key, value))
    return m


def single(op: str, inputs: dict[str, tuple[Sequence[int], int]],
           inits: Sequence[onnx.TensorProto] = (), extra_inputs: Sequence[str] = (),
           n_outputs: int = 1, opset: int = OPSET, **attrs: object) -> onnx.ModelProto:
    """One float node 'n' reading the graph inputs then ``extra_inputs`` (initializers)."""
    outs = [f"y{i}" for i in range(n_outputs)] if n_outputs > 1 else ["y"]
    nodes = [helper.make_node(op, [*inputs, *extra_inputs], outs, name="n", **attrs)]
    return graph_model(nodes, [helper.make_tensor_value_info(k, t, s)
                               for k, (s, t) in inputs.items()],
                       [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                       inits, opset)


def f32(*shape: int) -> tuple[tuple[int, ...], int]:
    return tuple(shape), TensorProto.FLOAT


def external_weight(folder: Path, location: str, offset: int | None = None,
                    length: int | None = None, write_data: bool = True) -> Path:
    """base() with weight 'w' stored as external data at ``location`` (relative to folder);
    the data file is written (at folder/location) when ``write_data``."""
    m = base()
    w = next(t for t in m.graph.initializer if t.name == "w")
    raw = w.raw_data
    if write_data:
        target = folder / location
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if offset is not None:
        entries["offset"] = str(offset)
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        w.external_data.add(key=key, value=value)
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def raw_int32_data(name: str, data_type: int, values: Sequence[int],
                   dims: Sequence[int] = ()) -> onnx.TensorProto:
    """A tensor of an 8-bit type whose values sit in int32_data, as the spec stores them,
    unchecked (helper.make_tensor would wrap or refuse them)."""
    t = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
    t.int32_data.extend(values)
    return t
