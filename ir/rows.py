"""Rows of a broadcast operand: how long oneDNN 3.2's jit binary wants them.

oneDNN 3.2's jit binary primitive (and its binary post-ops) walks an operand broadcast along
the outer dims of its source row by row, at a cost a row: ``x·g`` with ``g`` per channel on a
channels-last ``[1, 8, 12, 96]`` took 11.6 µs at one thread in rows of 8 elements and 1.9 µs
in rows of 256 (compiler/lower/lower_gate.py ``_tile_factor`` has the other measurements).
Viewing ``(outer, inner)`` elements as ``(outer/k, k·inner)``, the operand repeated k times
along the row, gives the same elements with longer rows. The lowering makes that view
(lower_gate), and the squeeze-excitation pass makes the gate's producer write the operand
already repeated (passes/widen_gate.py); both take k from ``repeats``.
"""

from __future__ import annotations

ROW = 2048  # elements of a broadcast operand's row worth repeating to


def repeats(outer: int, inner: int) -> int:
    """The smallest k dividing ``outer`` with rows of ``k·inner >= ROW`` elements; 1 when the
    rows are that long already or no such k keeps them within ``4·ROW``."""
    if inner >= ROW:
        return 1
    k = next((k for k in range(2, outer + 1) if outer % k == 0 and k * inner >= ROW), 1)
    return 1 if k * inner > 4 * ROW else k
