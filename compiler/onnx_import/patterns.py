"""Recognizing the decomposed GELU that exporters (PyTorch before opset 20) write, so that
it becomes one GELU node instead of Erf/Pow ops the IR does not have.

    erf form:  0.5 · x · (1 + erf(x / √2))          x/√2 written Div(x, 1.4142…) or Mul(x, 0.7071…)
    tanh form: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))     x³ = Pow(x, 3) or x·x·x

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
