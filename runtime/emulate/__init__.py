"""Emulating other frameworks' int8 arithmetic on an imported QDQ graph.

``emulate(graph, feeds, framework)`` evaluates like the reference interpreter, except that the
quantized patterns (runtime/emulate/patterns.py) a framework computes in integers are computed
in *its* arithmetic (runtime/emulate/table.py, built on runtime.numerics). ``plan`` says, per
quantized tensor, which kernel ran or why the float path did. ``qfuse compare --emulate X`` and
``qfuse run --emulate X`` are built on it; docs/numerics.md has the table in words.
"""

from __future__ import annotations

from qfuse.runtime.emulate.interpreter import Decision, emulate, plan
from qfuse.runtime.emulate.patterns import Decline, Match, Pattern, match
from qfuse.runtime.emulate.table import FLOAT_REASONS, TABLE, Framework

FRAMEWORKS: tuple[str, ...] = tuple(f.value for f in Framework)

__all__ = [
    "FLOAT_REASONS",
    "FRAMEWORKS",
    "TABLE",
    "Decision",
    "Decline",
    "Framework",
    "Match",
    "Pattern",
    "emulate",
    "match",
    "plan",
]
