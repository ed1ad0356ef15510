"""The reference-semantics table: one numpy function per op, keyed by the op enum.

An implementation takes the node (for its attributes) and its input arrays in port order
(``None`` for a missing optional input) and returns one array per node output. The
``ops_*`` modules fill ``IMPLS`` with ``@impl(Op.X)`` when they are imported; the
interpreter imports them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import numpy as np

from qfuse.ir.graph import Node
from qfuse.ir.ops import Op

Arrays: TypeAlias = list[np.ndarray | None]
Impl: TypeAlias = Callable[[Node, Arrays], list[np.ndarray]]

IMPLS: dict[Op, Impl] = {}


def impl(*ops: Op) -> Callable[[Impl], Impl]:
    """Register the decorated function as the reference semantics of ``ops``."""

    def register(fn: Impl) -> Impl:
        for op in ops:
            if op in IMPLS:
                raise RuntimeError(f"op {op.value} has two reference implementations")
            IMPLS[op] = fn
        return fn

    return register


def need(args: Arrays, port: int) -> np.ndarray:
    """Input ``port``, which the op requires (the verifier guarantees it is connected)."""
    array = args[port] if port < len(args) else None
    if array is None:
        raise ValueError(f"required input {port} is missing")
    return array


def opt(args: Arrays, port: int) -> np.ndarray | None:
    """Optional input ``port``, or None when it is absent."""
    return args[port] if port < len(args) else None
