"""What the quantization passes share: reading Q/DQ/FakeQuantize parameters, building the
quantize-only FakeQuantize and DequantizeLinear nodes, and rewiring that keeps value names.

Representation (the contract the fusion passes rely on):

- a *dequantize* is a DEQUANTIZE_LINEAR node ``(x_int, scale, zero_point) -> f32``, real =
  ``(x - zp)·scale``, per tensor or per channel along ``attrs.axis``;
- a *quantize-only FakeQuantize* is a FAKE_QUANTIZE node ``[x, il, ih, ol, oh]`` (constants)
  whose output is typed u8/s8 with QuantParams: ``ol``/``oh`` are the integer bounds of the
  quantized values (float32), so the FakeQuantize formula yields the integer ``q`` and
  ``real = scale·(q - zp)`` recovers the dequantized value.

Names: a rewrite that replaces the producer of a float tensor keeps the tensor's name (graph
outputs keep the model's names; ``qfuse compare`` matches tensors by name); new integer
tensors get new names. ``rebuild`` does that with the Graph API alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from qfuse.ir.chain import Quantize
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import DequantizeAttrs, FakeQuantizeAttrs, Op
from qfuse.ir.shapes import infer_node
from qfuse.ir.types import DType, OnnxQuantize, QuantParams, TensorInfo
from qfuse.passes.replace import replace_nodes

log = logging.getLogger(__name__)

F32 = np.float32

# Scales of u8/s8 tensors the int8 kernels compute with exactly (an INT32 bias may have any).
# Below the smallest normal float32, 1/scale overflows and oneDNN's kernels flush the scale
# to zero; above 1e30 the products of scales (and with accumulators) that the int8 kernels
# compute in float32 overflow where the QDQ arithmetic does not (a scale of 3e38 gives inf
# where the reference gives 0).
MIN_SCALE = float(np.finfo(np.float32).tiny)
MAX_SCALE = 1e30


@dataclass(frozen=True)
class DqParams:
    """A dequantize's constants: 1-D scale (f32) and zero point (int64), axis None = per
    tensor, and the integer type it reads."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    dtype: DType

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    def quant(self) -> QuantParams:
        if self.axis is None:
            return QuantParams.make(self.scale[0], self.zero_point[0])
        return QuantParams.make(self.scale, self.zero_point, self.axis)

    @property
    def common_zero_point(self) -> int | None:
        """The zero point when every channel has the same one (a padded 0 is then one
        integer), else None."""
        values = set(np.asarray(self.zero_point).tolist())
        return int(values.pop()) if len(values) == 1 else None

    def same_as(self, other: DqParams) -> bool:
        return (self.dtype is other.dtype and self.axis == other.axis
                and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))

    def describe(self) -> str:
        if self.axis is None:
            return f"{self.dtype.name.lower()} s={self.scale[0]:.6g} zp={self.zero_point[0]}"
        return f"{self.dtype.name.lower()} per-channel axis {self.axis} ({self.scale.size})"


def is_op(node: Node | None, op: Op) -> bool:
    return node is not None and node.op is op


def is_constant_operand(graph: Graph, value: str) -> bool:
    """``value`` is a constant, or a DequantizeLinear of constants (weights another quantizer
    requantizes: passes/fold_weight_quantize.py; post_op_match.constant_operand's data)."""
    if graph.constant(value) is not None:
        return True
    dq = graph.producer(value)
    return is_op(dq, Op.DEQUANTIZE_LINEAR) and all(
        graph.constant(v) is not None for v in dq.inputs if v)  # type: ignore[union-attr]


def dq_params(graph: Graph, node: Node) -> DqParams | None:
    """Parameters of a DEQUANTIZE_LINEAR (or QUANTIZE_LINEAR) node; None when its scale or
    zero point is not a constant."""
    scale = graph.constant(node.inputs[1])
    if scale is None:
        return None
    zp_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zp = graph.constant(zp_name) if zp_name else np.zeros(scale.shape, np.int64)
    if zp is None:
        return None
    if node.op is Op.QUANTIZE_LINEAR:
        dtype = node.attrs.dtype
        rank = graph.info(node.inputs[0]).rank
    else:
        x = graph.info(node.inputs[0])
        dtype, rank = x.dtype, x.rank
    per_axis = scale.size > 1
    axis = (node.attrs.axis % rank if rank else 0) if per_axis else None
    return DqParams(scale.astype(F32).ravel(), zp.astype(np.int64).ravel(), axis, dtype)


def centered(q: np.ndarray, p: DqParams) -> np.ndarray:
    """``q − zp`` in int64, the zero points of ``p`` per tensor or along its axis: the
    integers a dequantize scales."""
    zp = p.zero_point
    if p.axis is not None:
        zp = zp.reshape([-1 if i == p.axis % q.ndim else 1 for i in range(q.ndim)])
    return q.astype(np.int64) - zp


def fq_ranges(graph: Graph, node: Node) -> tuple[np.ndarray, ...] | None:
    """(il, ih, ol, oh) of a FAKE_QUANTIZE as float32 arrays; None if one is not constant."""
    found = [graph.constant(name) for name in node.inputs[1:5]]
    if any(a is None for a in found):
        return None
    return tuple(np.asarray(a, dtype=F32) for a in found)  # type: ignore[arg-type]


def quantize_only(graph: Graph, node: Node | None) -> tuple[DType, QuantParams] | None:
    """(dtype, QuantParams) when ``node`` is a quantize-only FakeQuantize, else None."""
    if node is None or node.op is not Op.FAKE_QUANTIZE:
        return None
    info = graph.values[node.outputs[0]].info
    if info is None or not info.dtype.is_integer or info.quant is None:
        return None
    return info.dtype, info.quant


def per_tensor_quantize(graph: Graph, node: Node) -> Quantize | None:
    """The chain item of a quantize-only FakeQuantize with one constant range, per tensor
    (what a kernel's dst scale and zero point can store), else None."""
    found = quantize_only(graph, node)
    ranges = fq_ranges(graph, node) if found is not None else None
    if found is None or ranges is None or not found[1].per_tensor or any(
            r.size != 1 for r in ranges):
        return None
    dtype, quant = found
    il, ih, ol, oh = (tuple(float(v) for v in r.ravel()) for r in ranges)
    return Quantize(il, ih, ol, oh, levels=node.attrs.levels, dtype=dtype,
                    scale=quant.scale[0], onnx=node.attrs.onnx)


def range_axis(shape: tuple[int, ...], rank: int) -> int | None | str:
    """The one axis a range of ``shape`` varies along against a rank-``rank`` tensor: None
    when it is a scalar per tensor, "many" when it varies along more than one axis."""
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    axes = [i for i, d in enumerate(padded) if d != 1]
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else "many"


def along(values: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    """1-D ``values`` shaped to broadcast on ``axis`` of a rank-``rank`` tensor (a scalar
    array when per tensor)."""
    v = np.asarray(values, dtype=F32).ravel()
    if axis is None or v.size == 1:
        return v.reshape(())
    shape = [1] * rank
    shape[axis] = v.size
    return v.reshape(shape)


def add_dequantize(graph: Graph, x: str, quant: QuantParams, out: str | None = None, *,
                   origin: Sequence[str] = (), name: str | None = None) -> Node:
    """DEQUANTIZE_LINEAR(x, scale, zp) -> f32 with ``quant``'s parameters (new constants)."""
    info = graph.info(x)
    base = name or f"{x}/dequantize"
    per_tensor = quant.axis is None
    scale = quant.scale_array()
    zp = quant.zero_point_array().astype(info.dtype.np)
    s_name = graph.unique_name(f"{base}/scale")
    graph.add_constant(s_name, scale.reshape(()) if per_tensor else scale)
    z_name = graph.unique_name(f"{base}/zero_point")
    graph.add_constant(z_name, zp.reshape(()) if per_tensor else zp)
    return graph.add_node(
        Op.DEQUANTIZE_LINEAR, [x, s_name, z_name], [out or graph.unique_name(f"{x}_dq")],
        DequantizeAttrs(1 if per_tensor else int(quant.axis)),  # type: ignore[arg-type]
        name=base, infos=[TensorInfo(info.shape, DType.F32)], origin=origin)


def add_fake_quantize(graph: Graph, x: str, ranges: Sequence[np.ndarray], levels: int,
                      out_info: TensorInfo, out: str | None = None, *,
                      origin: Sequence[str] = (), name: str | None = None,
                      onnx: OnnxQuantize | None = None) -> Node:
    """FAKE_QUANTIZE(x, il, ih, ol, oh) with new constants; ``out_info`` types its output;
    ``onnx``: the Q/DQ pair it stands for (FakeQuantizeAttrs)."""
    base = name or f"{x}/fake_quantize"
    names = [x]
    for what, array in zip(("il", "ih", "ol", "oh"), ranges, strict=True):
        const = graph.unique_name(f"{base}/{what}")
        graph.add_constant(const, np.asarray(array, dtype=F32))
        names.append(const)
    return graph.add_node(Op.FAKE_QUANTIZE, names, [out or graph.unique_name(f"{x}_fq")],
                          FakeQuantizeAttrs(levels, onnx), name=base, infos=[out_info],
                          origin=origin)


def infer_into(graph: Graph, node: Node) -> list[TensorInfo]:
    """Infer ``node``'s output infos and store them."""
    infos = infer_node(graph, node)
    for out, info in zip(node.outputs, infos, strict=True):
        graph.set_info(out, info)
    return infos


def rebuild(graph: Graph, remove: Sequence[Node], build: Callable[[], None]) -> None:
    """Remove the nodes ``remove`` and call ``build``, which must create nodes producing —
    under the same names — every output of the removed nodes that is read elsewhere (or is a
    graph output). Those readers then read the new values (passes/replace.py)."""
    replace_nodes(graph, remove, build)


def move_before(graph: Graph, node: Node, chain: Sequence[Node]) -> None:
    """``x → node → chain[0] → … → chain[-1]`` as ``x → chain[0] → … → node``: elementwise
    nodes (each reading the one before it first, constants otherwise) that commute with
    ``node`` run on its input, and ``node`` writes the chain's last output (its name, info
    and readers). Names, attributes, origins and metas stay; the moved values are named
    ``<output>/before_<node>`` and take ``x``'s shape."""
    x, y = node.inputs[0], chain[-1].outputs[0]
    shape = graph.info(x).shape
    moved = [(graph.unique_name(f"{n.outputs[0]}/before_{node.name}"),
              graph.info(n.outputs[0]).with_shape(shape)) for n in chain]
    final = graph.info(y)
    added: list[tuple[Node, dict]] = []  # (new node, the meta of the node it replaces)

    def build() -> None:
        source = x
        for n, (out, info) in zip(chain, moved, strict=True):
            added.append((graph.add_node(n.op, [source, *n.inputs[1:]], [out], n.attrs,
                                         name=n.name, infos=[info], origin=n.origin),
                          dict(n.meta)))
            source = out
        added.append((graph.add_node(node.op, [source, *node.inputs[1:]], [y], node.attrs,
                                     name=node.name, infos=[final], origin=node.origin),
                      dict(node.meta)))

    rebuild(graph, [node, *chain], build)
    # by the new nodes themselves: a name the graph already uses for a value (onnxruntime's
    # QOperator files name some nodes as values) is given a suffix by add_node
    for new, meta in added:
        new.meta.update(meta)


def remove_if_unused(graph: Graph, node: Node) -> bool:
    """Remove ``node`` when none of its outputs is read; True if it went."""
    if graph.has_node(node.name) and not any(graph.uses(o) for o in node.outputs):
        graph.remove_node(node)
        return True
    return False


def readers(graph: Graph, value: str) -> list[Node]:
    """The distinct nodes reading ``value``."""
    return list({n.name: n for n, _ in graph.consumers(value)}.values())
