"""Constant folding at import time.

A node of the default domain whose inputs are all constants is evaluated with
onnx.reference.ReferenceEvaluator (at the model's opset) and its outputs become constants.
Shape and Size need no constant input: every value has a static shape, so they always fold.
This turns the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains exporters write into
static attributes, and evaluates Erf/Sqrt/Pow/Range/Where/Expand/... on constants even though
the IR has no such ops.

Not folded: DequantizeLinear (an integer weight and its scale must reach the passes as they
are), QuantizeLinear (its converter folds it and records the QuantParams of the result),
nondeterministic ops and control flow.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from qfuse.compiler.onnx_import.context import DEFAULT_DOMAINS, Context, NodeView

logger = logging.getLogger(__name__)

NOT_FOLDED = frozenset({
    "DequantizeLinear", "QuantizeLinear", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan",
})
ALWAYS_FOLDED = frozenset({"Shape", "Size"})
_CONSTANT_SCALARS = {
    "value_float": np.float32, "value_int": np.int64,
    "value_floats": np.float32, "value_ints": np.int64,
}


def foldable(ctx: Context, node: NodeView) -> bool:
    if node.proto is None or node.domain not in DEFAULT_DOMAINS:
        return False
    if node.op_type in ALWAYS_FOLDED or node.op_type == "Constant":
        return True
    if node.op_type in NOT_FOLDED or not any(node.inputs):
        return False
    return all(ctx.is_const(name) for name in node.inputs if name)


def fold(ctx: Context, node: NodeView) -> None:
    """Evaluate ``node`` (``foldable`` said yes) and record its outputs as constants."""
    if node.op_type == "Constant":
        outputs = [constant_value(ctx, node)]
    elif node.op_type in ALWAYS_FOLDED:
        outputs = [_shape_or_size(ctx, node)]
    else:
        outputs = evaluate(ctx, node)
    for name, value in zip(node.outputs, outputs, strict=False):
        if name:
            ctx.set_const(name, np.asarray(value))
    logger.debug("folded %s", node)


def evaluate(ctx: Context, node: NodeView) -> list[np.ndarray]:
    assert node.proto is not None
    feeds = {name: ctx.consts[name] for name in node.inputs if name}
    try:
        evaluator = ReferenceEvaluator(node.proto, opsets={"": ctx.opset})
        results = evaluator.run(None, feeds)
    except Exception as exc:  # any evaluator failure is reported on the node
        raise ctx.unsupported(
            node, f"cannot fold this op on constant inputs ({type(exc).__name__}: {exc}); it "
                  f"is otherwise not supported"
        ) from exc
    return [np.asarray(r) for r in results]


def _shape_or_size(ctx: Context, node: NodeView) -> np.ndarray:
    shape = ctx.input_info(node, 0).shape
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    rank = len(shape)
    start = node.attr("start", 0)
    end = node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(shape[start:end], dtype=np.int64)


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A SparseTensorProto as a dense array (indices linear [NNZ] or per dim [NNZ, rank])."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def constant_value(ctx: Context, node: NodeView) -> np.ndarray:
    """The value of a Constant node, whatever attribute holds it."""
    if len(node.attrs) != 1:
        raise ctx.malformed(node, f"Constant needs exactly one value attribute, got "
                                  f"{sorted(node.attrs)}")
    key, value = next(iter(node.attrs.items()))
    if key == "value":
        return numpy_helper.to_array(value)
    if key == "sparse_value":
        return sparse_to_dense(value)
    if key in _CONSTANT_SCALARS:
        return np.array(value, dtype=_CONSTANT_SCALARS[key])
    raise ctx.unsupported(node, f"Constant with attribute '{key}' is not supported")
