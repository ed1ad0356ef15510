"""The exact numpy reference interpreter: ``evaluate(graph, feeds)``.

One table, ``IMPLS``, maps each op to its numpy semantics (``ops_quant``, ``ops_nn``,
``ops_elementwise``, ``ops_shape``); ``interpreter.evaluate`` walks the graph with it.
"""

from __future__ import annotations

from qfuse.runtime.reference.interpreter import EvaluationError, MissingImplError, evaluate
from qfuse.runtime.reference.registry import IMPLS, impl

__all__ = ["IMPLS", "EvaluationError", "MissingImplError", "evaluate", "impl"]
