"""A MatMul chain may walk through a Reshape that keeps the last dim (part of fuse_post_ops).

ONNX Runtime's MatMulAddFusion turns a 3-D ``MatMul(x[B,T,K], W) + b`` into
``Reshape(x → [B·T, K]) → Gemm → Reshape(→ [B, T, N])``; the output Reshape then separates
the MatMul from what follows it (the residual Add of a transformer block, GELU, the output
quantize), and a post-op chain could not reach them.

Identity: for a constant 2-D weight ``W[K, N]``, ``MatMul`` works row by row on the last dim,
``out[r, :] = src[r, :] @ W``, and a row-major reshape that keeps the last dim keeps the row
order. So for any such reshape R of the output, ``R(MatMul(src, W)) = MatMul(R'(src), W)``
with R' the reshape of src to ``R's leading dims + (K,)``. The chain's items are per tensor
or per last-dim channel, so they commute with R too. Exact (the integer accumulator is the
same sum), so the rewrite is bit-exact.

Precondition checked here: the node is a MatMul with a constant 2-D weight, the reshape keeps
the last dim, the chain has no residual or tensor operand yet (either input would keep the
old shape: a GeGLU's gate product between ONNX Runtime's two Reshapes was read at [1, T, N]
by a [T, N] matmul, on ref:any), and the source's quantization is per tensor (a per-axis one
would not follow a reshape).
At commit, the MatMul reads ``R'(src)``: a new Reshape of the tensor before the source's own
Reshape when the source is one (a Reshape of a Reshape is one Reshape).
"""

from __future__ import annotations

from qfuse.ir import Graph, Node, Op, TensorInfo
from qfuse.ir.chain import ChainOp, Residual, TensorOperand
from qfuse.ir.ops import ReshapeAttrs

SHAPE_OPS = frozenset({Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE})


def why_not(graph: Graph, node: Node, chain: list[ChainOp], before: TensorInfo,
            after: TensorInfo) -> str:
    """"" when the chain of ``node`` may walk from shape ``before`` to ``after``, else why."""
    if node.op is not Op.MATMUL:
        return "changes the shape"
    weights = graph.constant(node.inputs[1])
    if weights is None or weights.ndim != 2:
        return "changes the shape (the MatMul's weights are not a 2-D constant)"
    if after.rank < 2 or after.shape[-1] != before.shape[-1]:
        return f"changes the last dim {before.shape[-1]} of the MatMul output"
    if any(isinstance(item, Residual) for item in chain):
        return "changes the shape after the residual sum"
    if any(isinstance(item, TensorOperand) for item in chain):
        return "changes the shape after a tensor operand (read at the shape it joined)"
    src = graph.info(node.inputs[0])
    if src.quant is not None and not src.quant.per_tensor:
        return "changes the shape of a per-axis quantized MatMul source"
    return ""


def reshaped_source(
    graph: Graph, node: Node, out_shape: tuple[int, ...]
) -> tuple[str, Node | None]:
    """The MatMul source reshaped for an output of ``out_shape`` (adds a Reshape when needed).

    Returns (value name, the source's old Reshape node or None)."""
    src = node.inputs[0]
    old = graph.producer(src)
    base = old.inputs[0] if old is not None and old.op in SHAPE_OPS else src
    k = graph.info(src).shape[-1]
    target = (*out_shape[:-1], k)
    info = graph.info(base)
    if info.shape == target:
        return base, old if base != src else None
    reshape = graph.add_node(Op.RESHAPE, [base], [graph.unique_name(f"{src}/{len(target)}d")],
                             ReshapeAttrs(target), name=graph.unique_name(f"{node.name}/src"),
                             infos=[info.with_shape(target)],
                             origin=old.origin if old is not None and base != src else ())
    return reshape.outputs[0], old if base != src else None
