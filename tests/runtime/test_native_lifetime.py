"""Native lifetime: every oneDNN handle a compiled model made is destroyed when the model goes
(by reference counting alone, without waiting for the cycle collector), and memory stays flat
over many distinct compiles.

The RSS campaigns run tests/runtime/native_lifetime_probe.py in a subprocess (oneDNN reads
ONEDNN_PRIMITIVE_CACHE_CAPACITY when it is loaded); they take minutes, so they run only with
QFUSE_SLOW=1. Measured on a 2-core AMD EPYC (AVX2): primitive cache off, 100 distinct compiles
after 100 warm-up ones, 1.2 KiB per compile; default cache, 402 KiB per compile while it fills,
6.7 KiB per compile once it is full.
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
from qfuse.runtime.onednn import default_stream
from qfuse.runtime.onednn._lib import live_handles
from tests.runtime.native_lifetime_probe import model

ROOT = Path(__file__).resolve().parents[2]
slow = pytest.mark.skipif(os.environ.get("QFUSE_SLOW") != "1", reason="slow: set QFUSE_SLOW=1")


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


def _probe(warmup: int, count: int, cache: str) -> float:
    env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": cache}
    result = subprocess.run(
        [sys.executable, "-m", "tests.runtime.native_lifetime_probe", str(warmup), str(count)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return (figures["end"] - figures["after_warmup"]) / count / 1024


@slow
def test_rss_flat_over_distinct_compiles_with_primitive_cache_off() -> None:
    per_compile = _probe(100, 100, "0")
    assert per_compile < 5, f"RSS grows {per_compile:.1f} KiB per distinct compile"


@slow
def test_rss_stops_growing_once_the_primitive_cache_is_full() -> None:
    # each probe model makes ~16 primitives: 60 compiles fill most of the default capacity
    # (1024); after 200, new primitives replace cache entries instead of adding to them
    filling = _probe(5, 60, "1024")
    full = _probe(200, 100, "1024")
    assert full < 0.05 * filling, \
        f"RSS grows {full:.1f} KiB per compile with a full cache ({filling:.1f} while filling)"
