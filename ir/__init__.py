"""qfuse's graph IR: typed ops, tensor metadata and the graph itself."""

from ir.graph import Graph, GraphError, Node, Value
from ir.ops import ATTRS, Op
from ir.types import DType, QuantParams, TensorInfo

__all__ = ["ATTRS", "DType", "Graph", "GraphError", "Node", "Op", "QuantParams", "TensorInfo",
           "Value"]
