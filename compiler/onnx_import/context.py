"""The state of one import: the IR graph being built, the constants known so far, and the
helpers converters use to read attributes and inputs and to emit IR nodes.

Constants (initializers, Constant nodes, folded subgraphs) are kept as numpy arrays and only
become IR values when an IR node reads them ("materialized"), so constants used only by
folding never reach the graph and an unsupported element type only matters where it is used.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from qfuse.compiler.errors import MalformedModelError, UnsupportedModelError
from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.shapes import infer_node
from qfuse.ir.types import DType, QuantParams, TensorInfo
from qfuse.passes.constant_fold import Cone
from qfuse.passes.post_op_match import constant_operand

logger = logging.getLogger(__name__)

DEFAULT_DOMAINS = ("", "ai.onnx")
OPENVINO_DOMAIN = "org.openvinotoolkit"
# onnxruntime's contrib QuantizeLinear / DequantizeLinear (ContribOperators.md,
# https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md): the ONNX ops'
# formula and attributes, plus 16- and 4-bit types before opset 21. quantize_static writes them
# for those types (and with UseQDQContribOps); the importer reads them as the ONNX ops.
CONTRIB_QDQ = frozenset({("com.microsoft", "QuantizeLinear"),
                         ("com.microsoft", "DequantizeLinear")})
# QOperator ops whose rewrite reads these integer inputs only through a DequantizeLinear of
# (input, scale, zero point) at the ports given (qoperator.py's rules take them from here,
# ``_Builder.dequantized``): to the importer such a reader is a DequantizeLinear of those
# parameters (convert_quant.py, ``_float_pair``).
DEQUANTIZED_PORTS: dict[tuple[str, str], tuple[tuple[int, int, int], ...]] = {
    **{("", op): ((0, 1, 2),) for op in ("QLinearConv", "QLinearMatMul")},
    **{("com.microsoft", op): ((0, 1, 2), (3, 4, 5)) for op in ("QLinearAdd", "QLinearMul")},
    **{("com.microsoft", op): ((0, 1, 2),)
       for op in ("QGemm", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSigmoid",
                  "QLinearLeakyRelu", "QLinearSoftmax")},
}

def symbolic_dims(tensor_type: onnx.TypeProto.Tensor) -> tuple[int, ...] | None:
    """The dims of a declared tensor type that hold no size (a name, or nothing); None when
    the rank itself is unknown."""
    if not tensor_type.HasField("shape"):
        return None
    return tuple(i for i, d in enumerate(tensor_type.shape.dim)
                 if not d.HasField("dim_value") or d.dim_value < 0)


# ONNX element types the IR can hold.
ONNX_TO_DTYPE: dict[int, DType] = {
    TensorProto.FLOAT: DType.F32,
    TensorProto.FLOAT16: DType.F16,
    TensorProto.DOUBLE: DType.F64,
    TensorProto.INT32: DType.S32,
    TensorProto.INT64: DType.S64,
    TensorProto.INT8: DType.S8,
    TensorProto.UINT8: DType.U8,
    TensorProto.INT16: DType.S16,
    TensorProto.UINT16: DType.U16,
    TensorProto.UINT32: DType.U32,
    TensorProto.UINT64: DType.U64,
    TensorProto.BOOL: DType.BOOL,
}


def onnx_type_name(elem_type: int) -> str:
    """'INT16', 'FLOAT8E4M3FN', ... (the name ONNX users know)."""
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"element type {elem_type}"


def dtype_onnx_name(dtype: DType) -> str:
    for elem, d in ONNX_TO_DTYPE.items():
        if d is dtype:
            return onnx_type_name(elem)
    return dtype.name


@dataclass
class NodeView:
    """One ONNX node (or a pattern standing for several), with attributes parsed to Python."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    origin: list[str] = field(default_factory=list)
    proto: onnx.NodeProto | None = None

    @classmethod
    def from_proto(cls, proto: onnx.NodeProto, name: str) -> NodeView:
        attrs: dict[str, Any] = {}
        for attr in proto.attribute:
            value = onnx.helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            attrs[attr.name] = value
        domain = "" if (proto.domain, proto.op_type) in CONTRIB_QDQ else proto.domain
        return cls(name, proto.op_type, domain, list(proto.input), list(proto.output),
                   attrs, [name], proto)

    def __str__(self) -> str:
        return f"'{self.name}' ({self.op_type})"

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, port: int) -> str:
        """Name of input ``port``; "" when the optional input is absent."""
        return self.inputs[port] if port < len(self.inputs) else ""


class Context:
    def __init__(self, graph: Graph, opset: int, graph_outputs: list[str]) -> None:
        self.graph = graph
        self.opset = opset
        self.consts: dict[str, np.ndarray] = {}
        self.const_quant: dict[str, QuantParams] = {}
        self.graph_outputs = list(graph_outputs)
        self.uses: Counter[str] = Counter(graph_outputs)
        # value -> the nodes reading it (import_model fills it before converting)
        self.readers: dict[str, list[NodeView]] = {}
        # outputs of 16-bit QuantizeLinear nodes imported as float fake quantization (their
        # DequantizeLinear readers become identities; convert_quant.quantize_linear)
        self.fake_quantized: set[str] = set()
        # The model (opsets, functions) island models copy; values whose shape is only known
        # at run time (outputs of islands, see islands.py).
        self.model = onnx.ModelProto()
        self.dynamic: set[str] = set()

    # ------------------------------------------------------------------ errors
    @staticmethod
    def unsupported(node: NodeView, message: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"node {node}: {message}")

    @staticmethod
    def malformed(node: NodeView, message: str) -> MalformedModelError:
        return MalformedModelError(f"node {node}: {message}")

    # ------------------------------------------------------------------ values
    def is_const(self, name: str) -> bool:
        return name in self.consts

    def info(self, node: NodeView, name: str) -> TensorInfo:
        """Shape and type of value ``name`` as read by ``node``."""
        if name in self.consts:
            data = self.consts[name]
            return TensorInfo(tuple(data.shape), self._dtype(node, name, data),
                              self.const_quant.get(name))
        value = self.graph.values.get(name)
        if value is None or value.info is None:
            raise self.malformed(node, f"reads '{name}', which no earlier node produces")
        return value.info

    def input_info(self, node: NodeView, port: int) -> TensorInfo:
        name = node.input(port)
        if not name:
            raise self.malformed(node, f"required input {port} is missing")
        return self.info(node, name)

    def const(self, node: NodeView, port: int, what: str) -> np.ndarray:
        """The constant value of input ``port``; it must be present and constant."""
        name = node.input(port)
        if not name:
            raise self.malformed(node, f"{what} (input {port}) is missing")
        if name in self.consts:
            return self.consts[name]
        data = self.computed_from_constants(name)
        if data is None:
            raise self.unsupported(node, f"{what} '{name}' must be a constant (it is computed "
                                         f"at run time)")
        return data

    def computed_from_constants(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when the nodes already imported compute it from constants
        alone, quantization ops included (folding stops at those: a weight's dequantize must
        reach the passes): evaluated by the reference interpreter's own ops, as
        passes/constant_fold.py evaluates. Where it matters: quantize_static without
        quant_pre_process quantizes the float arithmetic of TF-style "same" padding (timm's
        ``tf_`` models: the pads from the input's shape, Q/DQ pairs on the way), so a Pad's
        pads were a run-time value and the model from there on an onnxruntime island."""
        if name not in self.graph.values or name in self.dynamic:
            return None
        return Cone(self.graph)(name)

    def parameter(self, node: NodeView, port: int, what: str) -> np.ndarray:
        """Like ``const``, also through a DequantizeLinear of constants, dequantized as ONNX
        does: quantize_static quantizes some parameters read at import as weights (the
        scale and B of InstanceNormalization, Pad's constant_value)."""
        name = node.input(port)
        if name and not self.is_const(name) and name in self.graph.values:
            data, _ = constant_operand(self.graph, name)
            if data is not None:
                return np.asarray(data)
        return self.const(node, port, what)

    def optional_parameter(self, node: NodeView, port: int, what: str) -> np.ndarray | None:
        return self.parameter(node, port, what) if node.input(port) else None

    def optional_const(self, node: NodeView, port: int, what: str) -> np.ndarray | None:
        """Like ``const`` but None when the optional input is absent."""
        return self.const(node, port, what) if node.input(port) else None

    def _dtype(self, node: NodeView, name: str, data: np.ndarray) -> DType:
        try:
            return DType.from_numpy(data.dtype)
        except (ValueError, TypeError) as exc:
            raise self.unsupported(
                node, f"constant '{name}' has element type {data.dtype}, which is not supported"
            ) from exc

    def materialize(self, node: NodeView, name: str, quant: QuantParams | None = None) -> str:
        """The IR value for ``name`` (adding the constant on first use). When ``quant`` is
        given and the constant is already in the graph with other QuantParams, it is copied
        under a new name (one initializer read by two DequantizeLinear with different
        scales)."""
        if not name or name not in self.consts:
            return name
        quant = quant if quant is not None else self.const_quant.get(name)
        data = self.consts[name]
        existing = self.graph.values.get(name)
        if existing is not None:
            if quant is None or existing.info is None or existing.info.quant == quant:
                return name
            name = self.graph.unique_name(f"{name}_{node.name}")
        info = TensorInfo(tuple(data.shape), self._dtype(node, name, data), quant)
        self.graph.add_constant(name, data, info)
        return name

    def constant(self, node: NodeView, tag: str, values: np.ndarray) -> str:
        """A new constant, named after ``node``'s output and ``tag``, for the ops ``node``
        becomes."""
        return self.new_const(f"{node.outputs[0]}@{tag}", values)

    def new_const(self, base: str, values: np.ndarray) -> str:
        """A new constant named ``base`` or, when that is taken (by a graph value or a
        constant not materialized yet), ``base`` with a suffix."""
        name = self.graph.unique_name(base)
        while name in self.consts:
            name = self.graph.unique_name(f"{name}_")
        self.set_const(name, values)
        return name

    def set_const(self, name: str, data: np.ndarray, quant: QuantParams | None = None) -> None:
        if name in self.consts or name in self.graph.values:
            raise MalformedModelError(f"value '{name}' is defined twice")
        self.consts[name] = np.asarray(data)
        if quant is not None:
            self.const_quant[name] = quant

    # ------------------------------------------------------------------- nodes
    def check_unused(self, node: NodeView, first: int, what: str) -> None:
        """Outputs from ``first`` on must not be read (e.g. MaxPool's Indices)."""
        for out in node.outputs[first:]:
            if out and self.uses[out]:
                raise self.unsupported(node, f"output '{out}' ({what}) is used, which is not "
                                             f"supported")

    def emit(self, node: NodeView, op: Op, inputs: list[str], attrs: Any = None,
             outputs: list[str] | None = None) -> Node:
        """Add the IR node for ``node`` and infer its output infos right away (later
        converters need shapes, e.g. for auto_pad or Reshape's 0 and -1)."""
        outputs = list(node.outputs[:1] if outputs is None else outputs)
        ir_inputs = [self.materialize(node, name) for name in inputs]
        for name in ir_inputs:
            if name and name not in self.graph.values:
                raise self.malformed(node, f"reads '{name}', which no earlier node produces")
        for name in outputs:
            if name in self.graph.values or name in self.consts:
                raise self.malformed(node, f"output '{name}' is already defined")
        ir_node = self.graph.add_node(op, ir_inputs, outputs, attrs, name=node.name,
                                      origin=node.origin)
        infos = infer_node(self.graph, ir_node)
        for out, info in zip(ir_node.outputs, infos, strict=True):
            if 0 in info.shape:
                self.graph.remove_node(ir_node)  # nothing emitted: the node may be an island
                raise self.unsupported(node, f"output '{out}' would be empty (shape "
                                             f"{info.shape}); native kernels take no empty "
                                             f"tensors")
        for out, info in zip(ir_node.outputs, infos, strict=True):
            self.graph.set_info(out, info)
        return ir_node
