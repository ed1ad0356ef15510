"""A transformer encoder block, written the way `torch.onnx.export` emits nn.TransformerEncoderLayer
(post-norm) built from nn.Linear / matmul / softmax: no fused Attention or Gelu contrib ops.
"""

from __future__ import annotations

import math

import onnx

from .builder import GraphBuilder

GELU_KINDS = ("erf", "tanh", "op")


def _gelu(b: GraphBuilder, x: str, kind: str) -> str:
    """GELU in one of the three forms found in exported models.

    erf:  0.5 * x * (1 + erf(x / sqrt(2)))  — PyTorch export at opset < 20, node order
          Div(x, 1.4142135) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5).
    tanh: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  — GELU(approximate="tanh")
          decomposed, with x^3 as Pow(x, 3).
    op:   the ONNX Gelu op (opset 20), approximate="none".
    """
    with b.scope("gelu"):
        if kind == "erf":
            y = b.unary("Erf", b.div(x, 1.4142135381698608))
            return b.mul(b.mul(x, b.add(y, 1.0)), 0.5)
        if kind == "tanh":
            inner = b.add(x, b.mul(b.pow(x, 3.0), 0.044715))
            t = b.unary("Tanh", b.mul(inner, 0.7978845834732056))
            return b.mul(b.mul(x, 0.5), b.add(t, 1.0))
        if kind == "op":
            assert b.opset >= 20, "the Gelu op needs opset 20"
            return b.unary("Gelu", x, approximate="none")
    raise ValueError(f"gelu must be one of {GELU_KINDS}, got {kind!r}")


def transformer(
    *,
    batch: int = 1,
    seq: int = 16,
    d_model: int = 64,
    heads: int = 4,
    d_ff: int = 256,
    gelu: str = "op",
    seed: int = 0,
    opset: int | None = None,
) -> onnx.ModelProto:
    """One post-norm transformer encoder block on ``input`` [batch, seq, d_model]:
    Q, K, V = MatMul(x, W) + b; each Reshape(b, s, h, dk) -> Transpose to heads (K transposed
    to [b, h, dk, s]); scores = MatMul(Q, K^T) * 1/sqrt(dk) (a Mul); Softmax(axis=-1);
    MatMul with V; Transpose/Reshape back to [b, s, d]; output projection MatMul + Add; residual
    Add; LayerNormalization; FFN MatMul+Add -> GELU -> MatMul+Add; residual Add;
    LayerNormalization. Output ``output`` [batch, seq, d_model].

    `gelu` picks the GELU form ("erf", "tanh" decomposed, or the opset-20 "op"); `opset`
    defaults to 20 for "op" and 17 otherwise (LayerNormalization needs 17).

    Exercises: MatMul with a constant weight (per-channel on axis 1 of the [K, N] weight) and
    MatMul of two activations (QK^T, PV: both inputs quantized per-tensor), Add of a bias after
    MatMul (bias fusion), 4-D Reshape/Transpose of quantized tensors, Softmax on u8, two
    LayerNorms, residual Adds, the GELU patterns.
    """
    if gelu not in GELU_KINDS:
        raise ValueError(f"gelu must be one of {GELU_KINDS}, got {gelu!r}")
    opset = opset if opset is not None else (20 if gelu == "op" else 17)
    dk = d_model // heads
    b = GraphBuilder("transformer", opset=opset, seed=seed)
    x = b.input("input", (batch, seq, d_model))

    def heads_of(t: str, perm: tuple[int, ...]) -> str:
        return b.transpose(b.reshape(t, (batch, seq, heads, dk)), perm)

    with b.scope("attn"):
        q = heads_of(b.linear(x, d_model, name="q_proj"), (0, 2, 1, 3))  # [b, h, s, dk]
        k = heads_of(b.linear(x, d_model, name="k_proj"), (0, 2, 3, 1))  # [b, h, dk, s]
        v = heads_of(b.linear(x, d_model, name="v_proj"), (0, 2, 1, 3))  # [b, h, s, dk]
        scores = b.mul(b.matmul(q, k), 1.0 / math.sqrt(dk))
        ctx = b.matmul(b.softmax(scores, axis=-1), v)  # [b, h, s, dk]
        ctx = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (batch, seq, d_model))
        attn = b.linear(ctx, d_model, name="out_proj")
    x = b.layernorm(b.add(x, attn), name="norm1")
    with b.scope("ffn"):
        h = _gelu(b, b.linear(x, d_ff, name="fc1"), gelu)
        h = b.linear(h, d_model, gain=0.5, name="fc2")
    x = b.layernorm(b.add(x, h), name="norm2")
    b.output(x, "output")
    return b.build(doc=transformer.__doc__ or "")
