"""u8·s8 products summed in int16 pairs, with saturation (x86 ``vpmaddubsw``: oneDNN's int8
kernels on CPUs without VNNI, compiler/lower/no_vnni.py).

``sat16(x0·w0 + x1·w1)`` with ``x ∈ [0, 255]`` is exact for every source when the pair's
positive weights add up to at most ``PAIR_LIMIT`` and its negative ones to at least
``−PAIR_LIMIT`` (255·128 = 32640 ≤ 32767); in particular whenever every ``|w| ≤ SAFE_WEIGHT``
(255·64·2 = 32640).
"""

from __future__ import annotations

#: Largest |w| for which no u8·s8 pair can saturate int16 (255·64·2 = 32640).
SAFE_WEIGHT = 64
#: Largest sum of the positive (or minus the negative) weights of a pair: 255·128 = 32640.
PAIR_LIMIT = 128
