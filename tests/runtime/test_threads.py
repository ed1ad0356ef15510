"""Thread safety of compiled models: many threads calling two models interleaved get exactly
the outputs of serial runs, in every oneDNN mode; contexts are pooled, not made per call.

QFUSE_THREAD_RUNS sets the runs per thread and model (default 25; the campaign uses 1000).
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import pytest

from qfuse.compiler.api import CompiledModel, compile_model
from qfuse.examples import zoo

THREADS = 4
RUNS = int(os.environ.get("QFUSE_THREAD_RUNS", "25"))
FEED_SETS = 6
MODELS = ("resnet", "mobilenetv2")


@functools.cache
def compiled(name: str, mode: str) -> CompiledModel:
    return compile_model(zoo.model_path(name, quantized=True), mode=mode)


def feed_sets(model: CompiledModel) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{n: rng.standard_normal(shape).astype(dtype)
             for n, (shape, dtype) in model.input_specs().items()} for _ in range(FEED_SETS)]


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32"])
def test_threads_interleaving_two_models_match_serial_runs(mode: str) -> None:
    models = [compiled(name, mode) for name in MODELS]
    feeds = [feed_sets(m) for m in models]
    serial = [[m.run(f) for f in fs] for m, fs in zip(models, feeds, strict=True)]
    mismatches: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(index: int) -> None:
        try:
            start.wait()
            for run in range(RUNS):
                for k in (index % 2, 1 - index % 2):  # half the threads start with each model
                    which = (run + index) % FEED_SETS
                    got = models[k].run(feeds[k][which])
                    for name, want in serial[k][which].items():
                        if not np.array_equal(got[name], want):
                            mismatches.append(f"thread {index} run {run} {MODELS[k]} {name}")
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert not mismatches, f"{len(mismatches)} of {THREADS * RUNS * 2} runs differ: " \
        f"{mismatches[:5]}"
    for model in models:  # one context per concurrent caller at most, reused afterwards
        assert 1 <= model.executor.contexts <= THREADS


def test_contexts_are_reused_by_serial_calls() -> None:
    model = compiled("resnet", "fused")
    feeds = feed_sets(model)[0]
    before = model.executor.contexts
    for _ in range(5):
        model.run(feeds)
    assert model.executor.contexts == before


def test_run_all_from_threads_matches_run() -> None:
    model = compiled("mobilenetv2", "fused")
    feeds = feed_sets(model)
    want = [model.run_all(f) for f in feeds[:2]]
    got: dict[int, dict[str, np.ndarray]] = {}

    def worker(index: int) -> None:
        got[index] = model.run_all(feeds[index % 2])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == THREADS
    for index, values in got.items():
        expected = want[index % 2]
        assert values.keys() == expected.keys()
        for name, value in values.items():
            np.testing.assert_array_equal(value, expected[name], err_msg=name)


@pytest.mark.parametrize("threads", [1, 3])
def test_primitives_are_made_for_the_threads_they_run_with(monkeypatch, threads: int) -> None:
    """oneDNN fixes a primitive's work split and scratchpad for the team size there is when
    it is made: the lowering runs under the plan's thread count, and the caller's is back
    after (a plan for 1 thread made under 2 ran its convolutions on 2)."""
    import qfuse.compiler.lower as lowering
    from qfuse.runtime.onednn import set_num_threads
    from qfuse.runtime.onednn.threads import get_num_threads

    seen: list[int] = []
    real = lowering.lower

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(lowering, "lower", spy)
    set_num_threads(2)
    compile_model(zoo.model_path("resnet", quantized=True), threads=threads)
    assert seen == [threads]
    assert get_num_threads() == 2
