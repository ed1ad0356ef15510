"""Recognizing the decomposed GELU and LayerNorm that exporters write (PyTorch before opsets
20 / 17, Paddle), so that each becomes one node instead of Erf / Pow / ReduceMean / Sqrt ops
the IR does not have (which would otherwise run as float islands).

    erf form:  0.5 · x · (1 + erf(x / √2))          x/√2 written Div(x, 1.4142…) or Mul(x, 0.7071…)
    tanh form: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))     x³ = Pow(x, 3) or x·x·x

LayerNorm (``fuse_layer_norm``), over trailing axes -k..-1 given as negative axes::

    mean = ReduceMean(x, axes, keepdims=1);  d = Sub(x, mean)
    var = ReduceMean(Pow(d, 2) or Mul(d, d), axes, keepdims=1)
    n = Div(d, Sqrt(Add(var, eps)))  or  Mul(d, Reciprocal(Sqrt(Add(var, eps))))
    [y = Mul(n, gamma)]  [z = Add(y, beta)]      gamma, beta constants (absorbed when present)

becomes LayerNormalization(x, gamma or 1, beta, axis=-k, epsilon=eps) (ONNX spec:
https://onnx.ai/onnx/operators/onnx__LayerNormalization.html). Q/DQ pairs around the pattern
stay as they are (x read from a DequantizeLinear, the result quantized after); a Q/DQ pair
between the normalization and the Mul / Add leaves those as separate nodes. Two forms ONNX
Runtime's tools write are matched too:

- ``t = Transpose(d, perm)`` read by the square and the normalization (quant_pre_process's
  transpose optimizer pushes a Transpose up to the Sub): with the mean over x's axes A and
  the variance over t's trailing axes T, ``perm[T] == A`` makes it
  ``LayerNormalization(Transpose(x, perm), axis=-k)``, the Transpose keeping t's name (only the
  pattern read t).
- eps given as ``DequantizeLinear`` of quantized constants (quantize_static quantizes an
  Add's constant operand): eps = f32((q - zp)·s), the value the model adds.

Not matched, by design: a Q/DQ pair on the variance (quantize_static quantizes the Add's other
input too). Folding would drop a rounding the model specifies; the ops stay native (reduction,
eltwise) and compute the model as written.

Products are matched as *sets of factors*: a tree of Mul nodes whose inner values have a
single reader is flattened into its leaves, so every order and bracketing of the Muls
matches. Precondition for a rewrite: every inner value of the pattern is read only inside it
and is not a graph output; x itself may have other readers. Constants are compared with a
relative tolerance of 1e-4 (exporters print them with differing precision).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable

import numpy as np
from onnx import numpy_helper

from qfuse.compiler.onnx_import.context import DEFAULT_DOMAINS, NodeView

logger = logging.getLogger(__name__)

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _Matcher:
    def __init__(self, nodes: list[NodeView], consts: dict[str, np.ndarray],
                 uses: Counter[str]) -> None:
        self.producer = {out: n for n in nodes for out in n.outputs if out}
        self.consts = dict(consts)
        for n in nodes:
            if n.op_type != "Constant" or n.domain not in DEFAULT_DOMAINS or not n.outputs:
                continue
            if "value" in n.attrs:
                try:
                    self.consts[n.outputs[0]] = numpy_helper.to_array(n.attrs["value"])
                except (ValueError, TypeError):  # the Constant's own conversion reports it
                    continue
            elif "value_float" in n.attrs:
                self.consts[n.outputs[0]] = np.asarray(n.attrs["value_float"], np.float32)
        self.uses = uses
        self.readers: dict[str, list[NodeView]] = {}
        for n in nodes:
            for name in dict.fromkeys(n.inputs):
                self.readers.setdefault(name, []).append(n)

    def node(self, value: str, op_type: str) -> NodeView | None:
        """The producer of ``value`` if it is an ``op_type`` read only once."""
        n = self.producer.get(value)
        if n is None or n.op_type != op_type or n.domain not in DEFAULT_DOMAINS:
            return None
        return n if self.uses[value] == 1 else None

    def is_const(self, value: str, expected: float) -> bool:
        data = self.consts.get(value)
        if data is None or data.size != 1 or data.dtype.kind != "f":
            return False
        return abs(float(data.reshape(())) - expected) <= 1e-4 * abs(expected)

    def factors(self, value: str, absorbed: list[NodeView], root: bool = False) -> list[str]:
        """Leaves of the Mul tree computing ``value``; its Mul nodes go to ``absorbed``."""
        n = self.producer.get(value)
        if n is None or n.op_type != "Mul" or n.domain not in DEFAULT_DOMAINS or (
            not root and self.uses[value] != 1
        ):
            return [value]
        absorbed.append(n)
        return [leaf for v in n.inputs for leaf in self.factors(v, absorbed)]

    def one_plus(self, value: str, absorbed: list[NodeView]) -> tuple[str, NodeView] | None:
        """``value = 1 + inner``: returns (inner, Add node)."""
        add = self.node(value, "Add")
        if add is None or len(add.inputs) != 2:
            return None
        a, b = add.inputs
        if self.is_const(a, 1.0):
            return b, add
        if self.is_const(b, 1.0):
            return a, add
        return None

    def scaled(self, value: str, factor: float, absorbed: list[NodeView]) -> str | None:
        """``value = y · factor`` (or ``y / (1/factor)``): returns y."""
        div = self.node(value, "Div")
        if div is not None and self.is_const(div.inputs[1], 1.0 / factor):
            absorbed.append(div)
            return div.inputs[0]
        mark = len(absorbed)
        leaves = self.factors(value, absorbed, root=self.node(value, "Mul") is not None)
        if len(leaves) == 2:
            for y, c in (leaves, leaves[::-1]):
                if self.is_const(c, factor) and y not in self.consts:
                    return y
        del absorbed[mark:]
        return None

    def erf_arg(self, inner: str, absorbed: list[NodeView]) -> str | None:
        erf = self.node(inner, "Erf")
        if erf is None:
            return None
        absorbed.append(erf)
        return self.scaled(erf.inputs[0], 1.0 / SQRT2, absorbed)

    def tanh_arg(self, inner: str, absorbed: list[NodeView]) -> str | None:
        tanh = self.node(inner, "Tanh")
        if tanh is None:
            return None
        absorbed.append(tanh)
        total = self.scaled(tanh.inputs[0], SQRT_2_OVER_PI, absorbed)
        add = None if total is None else self.node(total, "Add")
        if add is None or len(add.inputs) != 2:
            return None
        absorbed.append(add)
        for x, cubic in (add.inputs, add.inputs[::-1]):
            if self._is_cubic_term(x, cubic, absorbed):
                return x
        return None

    def _is_cubic_term(self, x: str, value: str, absorbed: list[NodeView]) -> bool:
        """``value = 0.044715 · x³`` with x³ a Pow(x, 3) or a product x·x·x."""
        if self.node(value, "Mul") is None:
            return False
        mark = len(absorbed)
        leaves = self.factors(value, absorbed, root=True)
        consts = [v for v in leaves if self.is_const(v, 0.044715)]
        rest = [v for v in leaves if v not in consts]
        if len(consts) == 1:
            if rest == [x, x, x]:
                return True
            pow_node = self.node(rest[0], "Pow") if len(rest) == 1 else None
            if pow_node is not None and pow_node.inputs[0] == x and self.is_const(
                pow_node.inputs[1], 3.0
            ):
                absorbed.append(pow_node)
                return True
        del absorbed[mark:]
        return False

    def gelu(self, final: NodeView) -> tuple[str, str, list[NodeView]] | None:
        """(x, approximate, absorbed nodes) when ``final`` ends a GELU."""
        absorbed: list[NodeView] = []
        leaves = self.factors(final.outputs[0], absorbed, root=True)
        if len(leaves) != 3:
            return None
        for i, candidate in enumerate(leaves):
            others = leaves[:i] + leaves[i + 1:]
            halves = [v for v in others if self.is_const(v, 0.5)]
            if len(halves) != 1:
                continue
            x = others[1] if others[0] == halves[0] else others[0]
            found = self.one_plus(candidate, absorbed)
            if found is None or x in self.consts:
                continue
            inner, add = found
            tries: tuple[tuple[str, Callable[[str, list[NodeView]], str | None]], ...] = (
                ("none", self.erf_arg), ("tanh", self.tanh_arg))
            for approximate, arg in tries:
                extra: list[NodeView] = [add]
                if arg(inner, extra) == x:
                    return x, approximate, absorbed + extra
        return None


def fuse_gelu(nodes: list[NodeView], consts: dict[str, np.ndarray], uses: Counter[str],
              ) -> list[NodeView]:
    """``nodes`` with every decomposed GELU replaced by one Gelu node at the final Mul."""
    matcher = _Matcher(nodes, consts, uses)
    replaced: dict[int, NodeView | None] = {}
    for n in nodes:
        if n.op_type != "Mul" or n.domain not in DEFAULT_DOMAINS or id(n) in replaced:
            continue
        found = matcher.gelu(n)
        if found is None:
            continue
        x, approximate, absorbed = found
        if any(id(a) in replaced for a in absorbed):
            continue
        order = {id(a): i for i, a in enumerate(nodes)}
        absorbed.sort(key=lambda a: order[id(a)])
        for a in absorbed:
            replaced[id(a)] = None
        origin = [name for a in absorbed for name in a.origin]
        replaced[id(n)] = NodeView(n.name, "Gelu", "", [x], list(n.outputs),
                                   {"approximate": approximate}, origin)
        logger.debug("GELU (%s) recognized over %s", approximate, origin)
    return [replaced.get(id(n), n) for n in nodes if replaced.get(id(n), n) is not None]


def _raw_axes(matcher: _Matcher, node: NodeView) -> list[int] | None:
    """The axes of a keepdims ReduceMean as written (attribute or constant input), or None."""
    if node.attr("keepdims", 1) != 1 or node.attr("noop_with_empty_axes", 0):
        return None
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        data = matcher.consts.get(node.inputs[1])
        axes = None if data is None else [int(a) for a in np.asarray(data).ravel()]
    return [int(a) for a in axes] if axes else None


def _reduce_axes(matcher: _Matcher, node: NodeView) -> tuple[int, ...] | None:
    """Negative, trailing, contiguous axes of a keepdims ReduceMean, else None."""
    axes = _raw_axes(matcher, node)
    if axes is None:
        return None
    axes = sorted(axes)
    if axes != list(range(-len(axes), 0)):
        return None
    return tuple(axes)


def _scalar(matcher: _Matcher, value: str) -> float | None:
    data = matcher.consts.get(value)
    if data is None or data.size != 1 or data.dtype.kind != "f":
        return None
    return float(data.reshape(()))


def _dequantized_scalar(m: _Matcher, value: str) -> tuple[float, NodeView | None] | None:
    """A float scalar constant, or one DequantizeLinear of constants computes (quantize_static
    stores an Add's constant operand quantized): ``f32((q - zp) · s)``, and that node when
    only the pattern reads it."""
    found = _scalar(m, value)
    if found is not None:
        return found, None
    dq = m.producer.get(value)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in DEFAULT_DOMAINS or (
            not all(i in m.consts for i in dq.inputs if i)):
        return None
    q, scale = m.consts[dq.inputs[0]], m.consts[dq.inputs[1]]
    zp = m.consts[dq.inputs[2]] if len(dq.inputs) > 2 and dq.inputs[2] else np.zeros((), q.dtype)
    if q.size != 1 or scale.size != 1 or zp.size != 1 or scale.dtype != np.float32:
        return None
    level = np.float32(int(q.reshape(())) - int(zp.reshape(())))
    # absorbed when the pattern is its only reader; a shared one stays for the others
    return float(level * scale.reshape(())), dq if m.uses[value] == 1 else None


def _centred(m: _Matcher, d: str, reads: int) -> tuple[NodeView, NodeView | None] | None:
    """The Sub computing x - mean that ``d`` is, directly or through one Transpose (ONNX
    Runtime's transpose optimizer moves a Transpose there); and that Transpose."""
    if m.uses[d] != reads:
        return None
    node = m.producer.get(d)
    transpose = None
    if node is not None and node.op_type == "Transpose" and node.domain in DEFAULT_DOMAINS and (
            node.attr("perm") is not None):
        transpose, node = node, m.node(node.inputs[0], "Sub")
    if node is None or node.op_type != "Sub" or node.domain not in DEFAULT_DOMAINS:
        return None
    return node, transpose


def _layer_norm(m: _Matcher, norm: NodeView) -> tuple[str, float, tuple[int, ...],
                                                      list[NodeView], NodeView | None] | None:
    """(x, epsilon, axes, absorbed, transpose) when ``norm`` (a Div or Mul) ends a decomposed
    LayerNorm; ``transpose`` is the Transpose between the Sub and the rest (module docstring)."""
    absorbed = [norm]
    if norm.op_type == "Div":
        d, root = norm.inputs
        sqrt = m.node(root, "Sqrt")
    else:
        found = None
        for d, r in (norm.inputs, norm.inputs[::-1]):
            recip = m.node(r, "Reciprocal")
            if recip is not None and m.node(recip.inputs[0], "Sqrt") is not None:
                found = d, recip
        if found is None:
            return None
        d, recip = found
        absorbed.append(recip)
        sqrt = m.node(recip.inputs[0], "Sqrt")
    if sqrt is None:
        return None
    add = m.node(sqrt.inputs[0], "Add")
    if add is None:
        return None
    for var, eps_name in (add.inputs, add.inputs[::-1]):
        eps = _dequantized_scalar(m, eps_name)
        var_node = m.node(var, "ReduceMean") if eps is not None else None
        if var_node is not None:
            break
    else:
        return None
    assert eps is not None
    axes = _reduce_axes(m, var_node)
    square = m.node(var_node.inputs[0], "Pow") or m.node(var_node.inputs[0], "Mul")
    if axes is None or square is None:
        return None
    if square.op_type == "Pow":
        if square.inputs[0] != d or _scalar(m, square.inputs[1]) != 2.0:
            return None
        reads = 2
    else:
        if square.inputs != [d, d]:
            return None
        reads = 3
    found_sub = _centred(m, d, reads)
    if found_sub is None:
        return None
    sub, transpose = found_sub
    x, mean = sub.inputs
    mean_node = m.node(mean, "ReduceMean")
    if mean_node is None or mean_node.inputs[0] != x or x in m.consts:
        return None
    if transpose is None:
        if _reduce_axes(m, mean_node) != axes:
            return None
    else:  # t = Transpose(x - mean, perm): t's axis i is x's axis perm[i]
        perm = [int(p) for p in transpose.attr("perm")]
        rank = len(perm)
        mean_axes = _raw_axes(m, mean_node)
        if sorted(perm) != list(range(rank)) or mean_axes is None or not all(
                -rank <= a < rank for a in mean_axes) or len(axes) > rank:
            return None
        if sorted({a % rank for a in mean_axes}) != sorted(perm[a % rank] for a in axes):
            return None
    absorbed += [sqrt, add, var_node, square, sub, mean_node]
    if eps[1] is not None:
        absorbed.append(eps[1])
    return x, eps[0], axes, absorbed, transpose


def _affine(m: _Matcher, value: str, op_type: str) -> tuple[NodeView, str] | None:
    """The single reader ``op_type`` of ``value`` with a constant other operand."""
    readers = m.readers.get(value, [])
    if m.uses[value] != 1 or len(readers) != 1:
        return None
    node = readers[0]
    if node.op_type != op_type or node.domain not in DEFAULT_DOMAINS or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    data = m.consts.get(other)
    if data is None or data.dtype.kind != "f" or data.ndim > 1:
        return None
    return node, other


def fuse_layer_norm(nodes: list[NodeView], consts: dict[str, np.ndarray], uses: Counter[str],
                    ) -> list[NodeView]:
    """``nodes`` with every decomposed LayerNorm replaced by one LayerNormalization node (at
    the position of its last node); a missing scale becomes a constant 1 added to ``consts``."""
    m = _Matcher(nodes, consts, uses)
    replaced: dict[int, NodeView | None] = {}
    for n in nodes:
        if n.op_type not in ("Div", "Mul") or n.domain not in DEFAULT_DOMAINS or (
                id(n) in replaced):
            continue
        found = _layer_norm(m, n)
        if found is None:
            continue
        x, eps, axes, absorbed, transpose = found
        out, scale, bias, last = n.outputs[0], None, "", n
        mul = _affine(m, out, "Mul")
        if mul is not None:
            absorbed.append(mul[0])
            scale, out, last = mul[1], mul[0].outputs[0], mul[0]
            add = _affine(m, out, "Add")
            if add is not None:
                absorbed.append(add[0])
                bias, out, last = add[1], add[0].outputs[0], add[0]
        if any(id(a) in replaced for a in [*absorbed, *([transpose] if transpose else [])]):
            continue
        if transpose is not None:  # the normalization reads Transpose(x), under t's name
            t = transpose.outputs[0]
            replaced[id(transpose)] = NodeView(transpose.name, "Transpose", "", [x], [t],
                                               dict(transpose.attrs), transpose.origin)
            x = t
        if scale is None:
            scale = f"{n.name}/layer_norm_scale"
            consts[scale] = np.ones((), np.float32)
        for a in absorbed:
            replaced[id(a)] = None
        order = {id(a): i for i, a in enumerate(nodes)}
        origin = [name for a in sorted(absorbed, key=lambda a: order[id(a)]) for name in a.origin]
        replaced[id(last)] = NodeView(last.name, "LayerNormalization", "", [x, scale, bias],
                                      [out], {"axis": axes[0], "epsilon": eps}, origin)
        logger.debug("LayerNorm over axes %s recognized over %s", axes, origin)
    return [replaced.get(id(n), n) for n in nodes if replaced.get(id(n), n) is not None]
