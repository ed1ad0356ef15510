"""Native lifetime: every oneDNN handle a compiled model made is destroyed when the model goes
(by reference counting alone, without waiting for the cycle collector), and memory stays flat
over many distinct compiles.

The RSS measurements run tests/runtime/native_lifetime_probe.py in a subprocess (oneDNN reads
ONEDNN_PRIMITIVE_CACHE_CAPACITY when it is loaded) and count anonymous resident memory
(/proc/self/statm resident minus shared: libraries' pages touched for the first time are not
allocations). The warm-up is 200 compiles: the heap grows in decaying steps over the first few
hundred (measured, distinct models, cache off: 5.1 KiB per compile from the 100th to the
200th, 1.6 to the 300th, 0.08 after the 500th); a leak grows by the same amount every compile.
Measured on a 2-core AMD EPYC (AVX2), see the README's "Native lifetime" figures.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.compiler.lower.no_vnni import EXACT_INT8_ISAS
from qfuse.runtime.onednn import default_stream, effective_cpu_isa
from qfuse.runtime.onednn._lib import live_handles
from tests.runtime.native_lifetime_probe import model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32", "reference"])
def test_handles_are_destroyed_with_the_model(mode: str) -> None:
    default_stream()  # the engine and this thread's stream live as long as the process
    gc.collect()
    before = live_handles()
    gc.disable()  # reference counting alone must release everything
    try:
        compiled = compile_model(model(3), mode=mode)
        compiled.run(random_inputs(compiled))
        if mode != "reference":
            assert live_handles().get("Primitive", 0) > before.get("Primitive", 0)
        del compiled
        after = live_handles()
    finally:
        gc.enable()
    assert after == before


def test_handles_are_destroyed_after_a_failed_compile() -> None:
    default_stream()
    gc.collect()
    before = live_handles()
    broken = model(4)
    broken.graph.node[-1].attribute[0].i = 5  # Softmax axis out of range
    with pytest.raises(Exception, match="axis"):
        compile_model(broken)
    gc.collect()
    assert live_handles() == before


def _probe(*args: str, cache: str) -> dict[str, float]:
    env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": cache, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.runtime.native_lifetime_probe", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=1200, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_rss_flat_over_compiles() -> None:
    """Small QDQ convolutions, compiled and run once each, primitive cache off: after 200
    warm-up compiles, 100 distinct ones, 50 of one model, then with the cache resized to 64
    entries, 100 compiles to fill it and 80 with it full. Distinct and same under 5 KiB per
    compile (the issue's bound), the full cache under 10 (it evicts and refills oneDNN's
    entries); a leaked primitive or memory costs tens of KiB. The first compiles with the
    cache full grow memory for a while and then stop (allocator arenas; per 100 compiles,
    measured: 5.1, 4.0, 0.5, 1.5, 1.4, 0.2, -0.5, 0.6 KiB each), so the fill is long enough
    to measure after that: 0.8-2.6 KiB per compile measured (with a fill of 20 the
    transient read 7.7-8.1 and once passed 10 in a full suite run)."""
    figures = _probe("campaign", "200", "100", "50", "100", "80", cache="0")
    for phase, bound in (("distinct", 5), ("same", 5), ("full_cache", 10)):
        assert figures[phase] < bound, f"RSS grows {figures[phase]:.2f} KiB per compile ({phase})"


def _growth(warmup: int, count: int, cache: str) -> float:
    figures = _probe(str(warmup), str(count), cache=cache)
    return (figures["end"] - figures["after_warmup"]) / count / 1024


# oneDNN 3.2 keeps the brgemm convolution kernels it generates in a kernel cache of its own
# that nothing evicts (uxlfoundation/oneDNN pull request #1757; fixed after 3.2): where the
# int8 kernels are brgemm (VNNI / AMX), distinct compiles grow memory 94 KiB each (measured on
# an AMD EPYC with AVX-512 VNNI; README "Native lifetime"). strict: passing there is news.
BRGEMM_KERNEL_CACHE = pytest.mark.xfail(
    effective_cpu_isa() in EXACT_INT8_ISAS, strict=True,
    reason="oneDNN 3.2's brgemm kernel cache grows with every distinct int8 convolution")


@pytest.mark.slow
@BRGEMM_KERNEL_CACHE
def test_rss_flat_over_distinct_compiles_of_larger_models_with_primitive_cache_off() -> None:
    per_compile = _growth(100, 100, "0")
    assert per_compile < 5, f"RSS grows {per_compile:.1f} KiB per distinct compile"


@pytest.mark.slow
@BRGEMM_KERNEL_CACHE
def test_rss_stops_growing_once_the_default_primitive_cache_is_full() -> None:
    # each probe model makes ~16 primitives: 60 compiles fill most of the default capacity
    # (1024); after 200, new primitives replace cache entries instead of adding to them
    filling = _growth(5, 60, "1024")
    full = _growth(200, 100, "1024")
    assert full < 0.05 * filling, \
        f"RSS grows {full:.1f} KiB per compile with a full cache ({filling:.1f} while filling)"
