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

# A run-time operand repeated by a kernel of its own costs 3.5-7 µs in a plan at two threads;
# measured, the rows it saves take about 0.2 ns an element where they hold at most 256
# elements (PP-OCRv4 det's gate on [1, 96, 120, 160]: 575 → 225 µs), less beyond: so only
# for a chain of at least RUNTIME_ELEMENTS elements in RUNTIME_ROWS rows of at most RUNTIME_ROW
# (PP-OCR cls's gates on [1, 200, 2, 96], 192 rows of 200: 6.2 µs before, 4.4 + 2.3 after)
RUNTIME_ELEMENTS = 32768
RUNTIME_ROWS = 512
RUNTIME_ROW = 256
# Rows a producer writing the operand repeated aims at where no repeat kernel would pay: most
# of the gain of longer rows is there (module docstring), and each repeat widens its producer;
# rows longer than GATE_SHORT gain about what the wider producer costs (passes/widen_gate.py)
GATE_ROW = 512
GATE_SHORT = 128


def repeats(outer: int, inner: int, row: int = ROW) -> int:
    """The smallest k dividing ``outer`` with rows of ``k·inner >= row`` elements; 1 when the
    rows are that long already or no such k keeps them within ``4·row``."""
    if inner >= row:
        return 1
    k = next((k for k in range(2, outer + 1) if outer % k == 0 and k * inner >= row), 1)
    return 1 if k * inner > 4 * row else k


def repeat_kernel_pays(outer: int, inner: int) -> bool:
    """Is a chain of ``outer`` rows of ``inner`` elements large enough for a kernel repeating
    its run-time operand (``RUNTIME_*``)?"""
    return inner <= RUNTIME_ROW and outer >= RUNTIME_ROWS and outer * inner >= RUNTIME_ELEMENTS
