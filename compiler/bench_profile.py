"""`qfuse bench --profile / --plot`: where the time of a fused plan goes, kernel by kernel.

Timing: ``runs`` iterations, each one normal ``CompiledModel.run`` (the wall time users see)
followed by one profiled run that executes the same bound kernels (``Kernel.run``, the closures
the executor calls) with ``perf_counter_ns`` around each. The normal run path is untouched: the
profiled loop lives here and only reads the Plan's public parts (kernels, input slots, stream).
A kernel's time is its median over the runs; it includes the binding's own cost (Python call,
ctypes, oneDNN dispatch).

Overheads: ``overhead per kernel`` = median over profiled runs of (the run's total time − the
sum of its kernel times) / kernels: the executor loop and the input/output copies, spread over
the kernels. (Σ of per-kernel medians is lower than a typical run: each kernel's time has a
long tail of its own, so the per-run sums are the ones to compare with the wall time.) ``dispatch floor`` =
the time of a one-element reorder through the same binding path (``BoundPrimitive.runner``):
what every kernel pays before doing any work.

Work (multiply-accumulates, from the primitive descriptor's logical dims; weights are
(OC, IC/G, *K) or grouped (G, OC/G, IC/G, *K), so prod(wei)/OC = (IC/G)·prod(K)):
  convolution    MACs = prod(dst dims) · prod(wei dims) / OC     = N·OC·OH·OW·(IC/G)·KH·KW
  deconvolution  MACs = prod(src dims) · prod(wei dims) / IC     = N·IC·IH·IW·(OC/G)·KH·KW
  matmul         MACs = prod(dst dims) · K                       = batch·M·N·K
  inner_product  MACs = prod(dst dims) · prod(src dims[1:])
Achieved int8 TOPS = 2·MACs / time. Peak = the TOPS of a large u8·s8 matmul (M = N = K = 1024,
weights in the layout the matmul picks) measured here with the same threads: what this machine
really does, which /proc/cpuinfo cannot say (its clock overstated the peak on AMD, where a
profile printed 126 % of "peak"). The nominal figure — int8 MACs/cycle/core of the ISA oneDNN
dispatches to (AMX 1024, AVX-512 VNNI 128, AVX-512 without VNNI 64, AVX2 VNNI 64, AVX2 32) ×
threads × the reported clock — is printed beside it for reference.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from qfuse.compiler.errors import InputError

log = logging.getLogger(__name__)

INT8_MACS_PER_CYCLE = {
    "avx512_core_amx": 1024, "avx512_core_amx_fp16": 1024, "avx512_core_fp16": 128,
    "avx512_core_bf16": 128, "avx512_core_vnni": 128, "avx512_core": 64, "avx2_vnni_2": 64,
    "avx2_vnni": 64, "avx2": 32, "avx": 16, "sse41": 16,
}
_COMPUTE = ("convolution", "deconvolution", "matmul", "inner_product")


def kernel_macs(kind: str, src: tuple[int, ...], weights: tuple[int, ...] | None,
                dst: tuple[int, ...]) -> int:
    """Multiply-accumulates of one execution (module docstring); 0 for non-compute kernels."""
    if kind == "convolution" and weights:
        return math.prod(dst) * math.prod(weights) // dst[1]
    if kind == "deconvolution" and weights:
        return math.prod(src) * math.prod(weights) // src[1]
    if kind == "matmul":
        return math.prod(dst) * src[-1]
    if kind == "inner_product":
        return math.prod(dst) * math.prod(src[1:])
    return 0


def _macs_of(kernel: Any) -> int:
    if kernel.primitive is None or kernel.kind not in _COMPUTE:
        return 0
    pd = kernel.primitive.pd
    src, weights, dst = pd.src_md, pd.weights_md, pd.dst_md
    if src is None or dst is None:
        return 0
    return kernel_macs(kernel.kind, src.dims, weights.dims if weights is not None else None,
                       dst.dims)


def cpu_clock_ghz() -> tuple[float, str]:
    """(GHz, where it was read); (0, reason) when neither source exists."""
    sysfs = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(sysfs.read_text().strip()) / 1e6, str(sysfs)
    except (OSError, ValueError):
        pass
    try:
        mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        mhz = []
    if mhz:
        return max(mhz) / 1e3, "/proc/cpuinfo 'cpu MHz' (reported clock; turbo may be higher)"
    return 0.0, "unknown (no cpufreq, no /proc/cpuinfo)"


PEAK_MATMUL = 1024  # M = N = K of the matmul that measures the peak


@functools.cache
def measured_int8_tops(threads: int, size: int = PEAK_MATMUL, runs: int = 7) -> tuple[float, str]:
    """(TOPS, oneDNN implementation) of the best of ``runs`` u8 x s8 -> s32 matmuls of
    ``size``^3 MACs at ``threads`` threads (after one warm-up run that JITs the kernel)."""
    from qfuse.runtime.onednn import DataType, Memory, MemoryDesc, default_stream, filled, matmul
    from qfuse.runtime.onednn.enums import Arg, FormatTag, Query
    from qfuse.runtime.onednn.threads import team

    rng = np.random.default_rng(0)
    src = Memory.from_array(rng.integers(0, 256, (size, size), dtype=np.uint8))
    dst = Memory(MemoryDesc.from_tag((size, size), DataType.s32))
    wei_md = MemoryDesc.from_tag((size, size), DataType.s8, FormatTag.any)
    with team(threads):  # made and run at the threads it measures
        pd = matmul(src.md, wei_md, dst.md)
        wei = filled(pd.md(Query.weights_md),
                     rng.integers(-128, 128, (size, size), dtype=np.int8))
        prim = pd.create()
        run = prim.bind(prim.with_scratchpad({int(Arg.SRC): src, int(Arg.WEIGHTS): wei,
                                              int(Arg.DST): dst})).runner(default_stream())
        stream = default_stream()
        best = math.inf
        for i in range(runs + 1):
            start = time.perf_counter()
            run()
            stream.wait()
            if i:  # the first run generates the kernel
                best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12, pd.impl_name


def peak_int8(threads: int) -> dict[str, Any]:
    from qfuse.runtime.onednn import effective_cpu_isa

    isa = effective_cpu_isa().name
    per_cycle = INT8_MACS_PER_CYCLE.get(isa, 0)
    ghz, source = cpu_clock_ghz()
    nominal = 2 * per_cycle * threads * ghz * 1e9 / 1e12
    tops, impl = measured_int8_tops(threads)
    return {"isa": isa, "macs_per_cycle_per_core": per_cycle, "cores": threads,
            "clock_ghz": ghz, "clock_source": source, "nominal_tops": nominal,
            "peak_tops": tops, "peak_source": f"measured: {PEAK_MATMUL}^3 u8·s8 matmul on {impl}"}


def dispatch_floor_ns(reps: int = 2000) -> float:
    """Median time of a one-element reorder through the bound-primitive path."""
    from qfuse.runtime.onednn import DataType, Memory, MemoryDesc, default_stream, reorder
    from qfuse.runtime.onednn.enums import Arg

    md = MemoryDesc.from_tag((1,), DataType.f32)
    src, dst = Memory(md), Memory(md)
    bound = reorder(md, md).create().bind({int(Arg.SRC): src, int(Arg.DST): dst})
    run = bound.runner(default_stream())  # what an ExecutionContext binds every kernel to
    samples = np.empty(reps)
    for i in range(reps):
        start = time.perf_counter_ns()
        run()
        samples[i] = time.perf_counter_ns() - start
    return float(np.median(samples))


def time_kernels(compiled: Any, feeds: dict[str, np.ndarray], runs: int,
                 warmup: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-kernel ns (runs × kernels), total ns of each profiled run (input copy, kernels,
    output copy), and wall ns of each normal run in between."""
    from qfuse.runtime.onednn import set_num_threads

    executor = compiled.executor
    context = executor.acquire()  # the profiled runs' own buffers, memories and stream
    inputs = [(view, feeds[name]) for name, view in context.inputs]
    outputs = [view for _, view in context.outputs]
    kernels = context.runs
    stream = context.stream
    for _ in range(warmup):
        compiled.run(feeds)
    per_kernel = np.zeros((runs, len(kernels)))
    total = np.zeros(runs)
    wall = np.zeros(runs)
    clock = time.perf_counter_ns
    for r in range(runs):
        start = clock()
        compiled.run(feeds)
        wall[r] = clock() - start
        if executor.threads is not None:
            set_num_threads(executor.threads)
        row = per_kernel[r]
        begin = clock()
        for view, value in inputs:
            np.copyto(view, value)
        for i, run in enumerate(kernels):
            start = clock()
            run()
            row[i] = clock() - start
        stream.wait()
        _ = [view.copy() for view in outputs]
        total[r] = clock() - begin
    executor.release(context)
    return per_kernel, total, wall


def _kernel_rows(compiled: Any, per_kernel: np.ndarray, peak_tops: float) -> list[dict[str, Any]]:
    medians = np.median(per_kernel, axis=0)
    total = float(medians.sum()) or 1.0
    rows = []
    for index, (kernel, ns) in enumerate(zip(compiled.plan.kernels, medians, strict=True)):
        macs = _macs_of(kernel)
        tops = 2 * macs / ns / 1e3 if ns > 0 and macs else 0.0
        rows.append({"index": index, "name": kernel.name, "primitive": kernel.kind,
                     "impl": kernel.impl, "role": kernel.info.role,
                     "node": kernel.info.node, "absorbed": list(kernel.info.absorbed),
                     "ms": float(ns) / 1e6, "share": float(ns) / total, "macs": macs,
                     "tops": tops, "peak_fraction": tops / peak_tops if peak_tops else None})
    return rows


def profile_plan(compiled: Any, feeds: dict[str, np.ndarray], threads: int,
                 runs: int) -> dict[str, Any]:
    """Per-kernel times, shares, impls, MACs and TOPS of one compiled plan (module docstring)."""
    per_kernel, total, wall = time_kernels(compiled, feeds, runs)
    peak = peak_int8(threads)
    rows = _kernel_rows(compiled, per_kernel, peak["peak_tops"])
    count = len(rows)
    kernel_sum = sum(r["ms"] for r in rows)
    wall_ms = float(np.median(wall)) / 1e6
    outside = float(np.median(total - per_kernel.sum(axis=1))) / 1e3  # us per run
    macs = sum(r["macs"] for r in rows)
    by_impl: dict[str, float] = {}
    for row in rows:
        by_impl[row["impl"]] = by_impl.get(row["impl"], 0.0) + row["ms"]
    return {
        "mode": compiled.mode, "runs": runs, "threads": threads, "kernels": rows,
        "kernel_count": count, "wall_ms": wall_ms, "kernel_sum_ms": kernel_sum,
        "profiled_run_ms": float(np.median(total)) / 1e6,
        "kernel_sum_per_run_ms": float(np.median(per_kernel.sum(axis=1))) / 1e6,
        "overhead_per_kernel_us": outside / max(count, 1),
        "dispatch_floor_us": dispatch_floor_ns() / 1e3, "macs": macs,
        "tops": 2 * macs / (wall_ms * 1e-3) / 1e12 if wall_ms > 0 else 0.0,
        "peak": peak, "ms_by_impl": dict(sorted(by_impl.items(), key=lambda kv: -kv[1])),
    }


def match_unfused(fused: list[dict[str, Any]], unfused: list[dict[str, Any]]) -> list[dict]:
    """For each fused kernel, the unfused kernels implementing the same ONNX nodes.

    An unfused kernel belongs to the group of its own absorbed nodes; a post-op kernel (no
    absorbed list) to the compute kernel named by its ``node`` or its ``name`` prefix
    ("<node>:<i>"), else to the group emitted just before it (the lowering emits a node's
    kernels together). A group goes to the fused kernel whose absorbed nodes overlap most."""
    groups: list[tuple[set[str], list[dict[str, Any]]]] = []
    by_node: dict[str, int] = {}
    for row in unfused:
        owner = row["node"] if row["node"] in by_node else row["name"].rsplit(":", 1)[0]
        if row["absorbed"]:
            groups.append((set(row["absorbed"]) | {row["node"] or row["name"]}, [row]))
            by_node[row["node"] or row["name"]] = len(groups) - 1
        elif owner in by_node:
            groups[by_node[owner]][1].append(row)
        elif groups:
            groups[-1][1].append(row)
        else:
            groups.append(({row["name"]}, [row]))
    result = [{"kernel": f["name"], "fused_ms": f["ms"], "unfused_ms": 0.0,
               "unfused_kernels": []} for f in fused]
    keys = [set(f["absorbed"]) | {f["node"] or f["name"]} for f in fused]
    for nodes, rows in groups:
        overlaps = [len(nodes & k) for k in keys]
        best = int(np.argmax(overlaps)) if overlaps else -1
        if best < 0 or overlaps[best] == 0:
            continue
        result[best]["unfused_ms"] += sum(r["ms"] for r in rows)
        result[best]["unfused_kernels"] += [r["name"] for r in rows]
    return result


def profile_model(compiled: dict[str, Any], model: Path, threads: int, runs: int,
                  with_unfused: bool = False) -> dict[str, Any]:
    """Profile the fused plan (compiled["fused"]); with_unfused: also the unfused plan (compiled
    from ``model`` when absent) and the per-layer fused-vs-unfused comparison."""
    from qfuse.compiler.api import compile_model, random_inputs

    fused = compiled.get("fused") or compile_model(model, mode="fused", threads=threads)
    feeds = random_inputs(fused, seed=0)
    profile = profile_plan(fused, feeds, threads, runs)
    if with_unfused:
        unfused = compiled.get("unfused") or compile_model(model, mode="unfused", threads=threads)
        other = profile_plan(unfused, feeds, threads, runs)
        profile["unfused"] = {k: other[k] for k in ("wall_ms", "kernel_sum_ms", "kernel_count",
                                                    "overhead_per_kernel_us", "ms_by_impl")}
        profile["fused_vs_unfused"] = match_unfused(profile["kernels"], other["kernels"])
    return profile


def format_profile(profile: dict[str, Any], top: int = 15) -> str:
    peak = profile["peak"]
    rows = sorted(profile["kernels"], key=lambda r: -r["ms"])
    lines = [
        (f"per-kernel profile of the {profile['mode']} plan: {profile['kernel_count']} kernels, "
         f"{profile['runs']} runs, {profile['threads']} threads"),
        (f"peak int8: {peak['peak_tops']:.2f} TOPS ({peak['peak_source']}, {peak['cores']} "
         f"threads); nominal {peak['isa']} {peak['macs_per_cycle_per_core']} MACs/cycle/core x "
         f"{peak['clock_ghz']:.3f} GHz ({peak['clock_source']}) = {peak['nominal_tops']:.2f} "
         f"TOPS; whole run {profile['tops']:.2f} TOPS "
         f"({profile['macs'] / 1e9:.2f} GMACs)"),
        (f"run wall {profile['wall_ms']:.3f} ms (median; profiled "
         f"{profile['profiled_run_ms']:.3f}), kernel time per run "
         f"{profile['kernel_sum_per_run_ms']:.3f} ms (sum of medians "
         f"{profile['kernel_sum_ms']:.3f}); overhead per kernel "
         f"{profile['overhead_per_kernel_us']:.2f} us (executor loop + I/O copies); dispatch "
         f"floor {profile['dispatch_floor_us']:.2f} us per kernel (1-element reorder)"),
        (f"{'#':>3} {'kernel':<34} {'primitive':<13} {'impl':<26} {'ms':>7} {'share':>6} "
         f"{'MMACs':>8} {'TOPS':>6} {'%peak':>6}"),
    ]
    for row in rows[:top]:
        pct = "-" if not row["peak_fraction"] else f"{100 * row['peak_fraction']:.1f}"
        lines.append(f"{row['index']:>3} {row['name'][-34:]:<34} {row['primitive']:<13} "
                     f"{row['impl']:<26} {row['ms']:>7.3f} {100 * row['share']:>5.1f}% "
                     f"{row['macs'] / 1e6:>8.1f} {row['tops']:>6.2f} {pct:>6}")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"    ... {len(rest)} more kernels, {sum(r['ms'] for r in rest):.3f} ms")
    lines.append("time by implementation: " + ", ".join(
        f"{impl} {ms:.3f} ms" for impl, ms in profile["ms_by_impl"].items()))
    if "unfused" in profile:
        un = profile["unfused"]
        lines.append(f"unfused plan: {un['kernel_count']} kernels, wall {un['wall_ms']:.3f} ms, "
                     f"kernels sum {un['kernel_sum_ms']:.3f} ms")
    return "\n".join(lines)


def plot_fused_vs_unfused(profile: dict[str, Any], path: Path) -> None:
    """Bar chart: per fused kernel, its time vs the summed time of its unfused kernels."""
    try:
        import matplotlib
    except ImportError as exc:
        raise InputError("--plot needs matplotlib: pip install 'qfuse[bench]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = profile.get("fused_vs_unfused")
    if not pairs:
        raise ValueError("the profile has no fused-vs-unfused comparison (profile_model with "
                         "with_unfused=True)")
    labels = [p["kernel"][-28:] for p in pairs]
    x = np.arange(len(pairs))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(pairs) + 2), 5.0))
    ax.bar(x - 0.2, [p["fused_ms"] for p in pairs], 0.4, label="fused kernel")
    ax.bar(x + 0.2, [p["unfused_ms"] for p in pairs], 0.4,
           label="unfused kernels (same ONNX nodes)")
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    ax.set_ylabel("median time per run (ms)")
    ax.set_title(f"fused vs unfused per layer, {profile['threads']} threads "
                 f"(fused wall {profile['wall_ms']:.2f} ms, unfused "
                 f"{profile['unfused']['wall_ms']:.2f} ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
