"""Shrink a failing fuzz spec while the failure persists (tests/fuzz/README.md).

Greedy, to a fixed point: drop one op intent (last first), drop the second output, shrink
each input dimension (to 1, then halved, then minus one), and shrink each op's integer
parameters (channels, kernel, stride, ... toward 1). A candidate is kept when it fails the
same way (``same_failure``): the same class, the same error with its numbers blanked out, and
for LSB classes the same or a worse class. Every candidate is rebuilt from the spec by
tests/fuzz/generator.py, so each one is a valid model.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator

from tests.fuzz.generator import Spec
from tests.fuzz.harness import CLASSES, Result, run_spec

_ORDER = {c: i for i, c in enumerate(CLASSES)}


def signature(r: Result) -> str:
    """The failure with its numbers and names blanked: what must persist while shrinking."""
    text = re.sub(r"'[^']*'", "'_'", r.message)
    return re.sub(r"[0-9]+", "N", text)[:120]


def same_failure(target: Result) -> Callable[[Result], bool]:
    want = signature(target)

    def check(r: Result) -> bool:
        if target.cls in ("le3", "worse"):
            return r.cls in ("le3", "worse") and r.tie == target.tie
        if target.cls == "le1":
            return r.cls == "le1" and r.tie == target.tie
        return r.cls == target.cls and signature(r) == want

    return check


def _candidates(spec: Spec) -> Iterator[Spec]:
    for i in reversed(range(len(spec.ops))):
        s = copy.deepcopy(spec)
        del s.ops[i]
        if s.ops:
            yield s
    if spec.outputs > 1:
        s = copy.deepcopy(spec)
        s.outputs = 1
        yield s
    for i, d in enumerate(spec.input_shape):
        for smaller in sorted({1, d // 2, d - 1}):
            if 1 <= smaller < d:
                s = copy.deepcopy(spec)
                s.input_shape[i] = smaller
                yield s
    for i, op in enumerate(spec.ops):
        for key, value in op.items():
            if key in ("key", "op"):
                continue
            for smaller in _smaller(value):
                s = copy.deepcopy(spec)
                s.ops[i][key] = smaller
                yield s


def _smaller(value: object) -> list[object]:
    if isinstance(value, bool):
        return [False] if value else []
    if isinstance(value, int) and value > 1:
        return sorted({1, value // 2, value - 1})
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                       for v in value):
        out = []
        for j, v in enumerate(value):
            if v > 0:
                out.append([*value[:j], v - 1 if v > 1 else 0, *value[j + 1:]])
        return out
    return []


def minimize(spec: Spec, target: Result, *, budget: int = 300,
             run: Callable[[Spec], Result] = run_spec) -> tuple[Spec, Result, int]:
    """(smallest spec found, its result, candidates tried)."""
    keep = same_failure(target)
    best, best_result, tried = spec, target, 0
    progress = True
    while progress and tried < budget:
        progress = False
        for cand in _candidates(best):
            if tried >= budget:
                break
            tried += 1
            try:
                r = run(cand)
            except Exception:  # noqa: BLE001 - a candidate the generator cannot build
                continue
            if keep(r):
                best, best_result, progress = cand, r, True
                break
    return best, best_result, tried
