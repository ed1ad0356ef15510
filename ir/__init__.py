"""qfuse's graph IR: typed ops, tensor metadata and the graph itself."""

from qfuse.ir.graph import Graph, GraphError, Node, Value
from qfuse.ir.ops import ATTRS, Op
from qfuse.ir.types import DType, QuantParams, TensorInfo

__all__ = ["ATTRS", "DType", "Graph", "GraphError", "Node", "Op", "QuantParams", "TensorInfo",
           "Value"]
