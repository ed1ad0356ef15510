"""`qfuse bench`: latency of qfuse fused against unfused, fp32, ONNX Runtime and OpenVINO.

Method (what makes the ratios trustworthy on a shared, drifting machine):
1. Same inputs for every engine: random N(0, 1) of the model's shapes, seed 0
   (``random_inputs``), or the user's (``--inputs FILE``: an .npz keyed by input name, or an .npy
   for a single-input model) — real detectors are unstable on random inputs, so their cosine
   column means little there; the table and the JSON (``inputs``) say which were used.
   ``batch``: the model is rewritten with that leading input dimension (outputs symbolic).
2. Same thread count for every engine (bench_engines.py says how each one is told).
3. Per engine: compile / session-creation time, then ``warmup`` untimed runs.
4. Interleaved rounds: round r runs every engine in turn, ``per_round`` timed runs each, the
   order rotated by r, so drift (frequency, other processes) hits all engines alike. On each
   switch the engine first runs untimed for ``settle_ms`` (20 ms, at least ``settle`` runs):
   every runtime here parks its worker threads in a spin-wait after a run (GNU OpenMP spins
   ~300k pauses by default, ONNX Runtime and TBB spin too), and a spinning thread of the
   previous engine on one of the cores stalls the next engine's barriers for a scheduler
   tick; running (rather than sleeping) also keeps the cores' clocks and caches warm.
5. Per engine: median, p90, mean of the per-run latencies; throughput = batch·1000/median ms;
   ratio = engine median / fused median (> 1: slower than qfuse fused); ``paired`` = the median
   over rounds of the per-round ratio (robust when load comes and goes during the bench).
6. Agreement with fused: cosine similarity of the flattened outputs (the lowest over outputs)
   and, for (batch, classes) outputs, the fraction of rows whose argmax agrees — a fast but
   wrong engine is visible next to its ratio.
7. Noise: the share of the machine's CPU time that *other* processes used while the engines
   were timed (/proc/stat minus this process's own CPU time) is recorded, and the table warns
   when it is above 5 %: oneDNN's OpenMP barriers degrade sharply when a core is taken.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from qfuse.compiler.bench_engines import (
    ENGINES,
    Engine,
    EngineUnavailable,
    engine_note,
    make_engine,
)
from qfuse.compiler.errors import InputError, MalformedModelError
from qfuse.compiler.files import regular_file, writable
from qfuse.runtime.numerics.error import cosine
from qfuse.runtime.onednn.threads import MAX_THREADS

log = logging.getLogger(__name__)

BASELINE = "fused"
BUSY_SHARE = 0.05  # other processes' share of CPU time above which the table warns


@dataclass
class BenchConfig:
    model: Path
    compare: list[str] = field(default_factory=lambda: ["unfused", "fp32", "onnxruntime",
                                                        "openvino"])
    threads: int | None = None  # None: the CPUs this process may run on
    iters: int = 50  # timed runs per engine
    batch: int | None = None  # None: the model's own leading dimension
    input_shapes: dict[str, tuple[int, ...]] | None = None  # --input-shape: fixed before all
    per_round: int = 5
    warmup: int = 3
    settle: int = 1
    settle_ms: float = 20.0
    progress: bool = False
    inputs: dict[str, np.ndarray] | None = None  # None: random of the model's shapes, seed 0
    inputs_source: str = ""  # what ``inputs`` are, for the table (e.g. the file they came from)


@dataclass
class EngineStats:
    name: str
    compile_s: float
    times_ms: list[float]
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    ratio: float  # median / fused median
    paired_ratio: float  # median over rounds of (round median / fused round median)
    throughput: float  # inferences per second at the batch
    cosine: float | None
    top1: float | None
    note: str
    info: dict[str, Any]


@dataclass
class BenchResult:
    model: str
    threads: int
    batch: int
    iters: int
    per_round: int
    orders: list[list[str]]
    engines: dict[str, EngineStats]
    skipped: dict[str, str]
    isa: str
    model_used: str = ""  # the file the engines ran (a batch-rewritten copy, or ``model``)
    inputs: str = ""  # which inputs every engine ran on (``inputs_label``)
    others_cpu: float | None = None  # share of all CPU time other processes used while timing
    profile: dict[str, Any] | None = None
    compiled: dict[str, Any] = field(default_factory=dict, repr=False)  # qfuse CompiledModels

    def to_json(self) -> dict[str, Any]:
        engines = {name: {k: v for k, v in vars(s).items() if k != "name"}
                   for name, s in self.engines.items()}
        data = {k: v for k, v in vars(self).items() if k not in ("engines", "compiled")}
        data["engines"] = engines
        if self.profile is None:
            data.pop("profile")
        return data


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_clock() -> tuple[float, float, float] | None:
    """(busy, total) CPU seconds of the whole machine from /proc/stat, and this process's own
    CPU seconds (all threads, so ONNX Runtime's and OpenVINO's workers too); None if not Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields[:8]]
    hz = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / hz, sum(ticks) / hz, own.ru_utime + own.ru_stime


def _others_share(before: tuple[float, float, float] | None,
                  after: tuple[float, float, float] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    busy, total, own = (a - b for a, b in zip(after, before, strict=True))
    return max(0.0, busy - own) / total


def rotated(names: list[str], round_index: int) -> list[str]:
    """The engine order of round ``round_index``: ``names`` rotated left by it."""
    shift = round_index % len(names) if names else 0
    return names[shift:] + names[:shift]


def model_batch(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in initializers:
            dims = value.type.tensor_type.shape.dim
            return dims[0].dim_value if dims and dims[0].dim_value > 0 else 1
    return 1


def with_batch(path: Path, batch: int, directory: Path) -> Path:
    """A copy of the model whose graph inputs have leading dimension ``batch`` (outputs and
    intermediate shapes left for the engines to infer)."""
    model = onnx.load(str(path))
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in initializers and value.type.tensor_type.shape.dim:
            value.type.tensor_type.shape.dim[0].dim_value = batch
    for value in model.graph.output:
        if value.type.tensor_type.shape.dim:
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    out = directory / f"{path.stem}_batch{batch}.onnx"
    onnx.save(model, str(out))
    return out


def with_input_shapes(path: Path, shapes: dict[str, tuple[int, ...]], directory: Path) -> Path:
    """A copy of the model whose named graph inputs have the given static shapes (every
    engine then sees them; intermediate shapes are left for the engines to infer)."""
    model = onnx.load(str(path))
    inputs = {v.name: v for v in model.graph.input}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise InputError(f"--input-shape names {unknown}, which are not graph inputs "
                         f"(inputs: {list(inputs)})")
    for name, shape in shapes.items():
        tensor = inputs[name].type.tensor_type
        del tensor.shape.dim[:]
        for d in shape:
            tensor.shape.dim.add().dim_value = d
    del model.graph.value_info[:]
    out = directory / f"{path.stem}_shaped.onnx"
    onnx.save(model, str(out))
    return out


class _Bar:
    """tqdm when installed, else a plain bar on stderr (only when stderr is a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self._tqdm: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self._tqdm = tqdm(total=total, file=sys.stderr, leave=False, unit="step",
                                  disable=None)  # None: off when stderr is not a terminal
            except ImportError:
                pass
            self.enabled = sys.stderr.isatty()

    def update(self, label: str) -> None:
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.set_description(label, refresh=False)
            self._tqdm.update(1)
        elif self.enabled:
            filled = int(30 * self.done / max(self.total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
                             f" {label:<12}")
            sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.enabled:
            sys.stderr.write("\r" + " " * 60 + "\r")


def measure(engines: list[Engine], iters: int, per_round: int, warmup: int = 3, settle: int = 1,
            progress: bool = False,
            settle_ms: float = 0.0) -> tuple[dict[str, list[float]], list[list[str]]]:
    """Warm every engine up, then time ``iters`` runs of each in interleaved rounds.
    Returns per-engine latencies in ms and the engine order of every round."""
    names = [e.name for e in engines]
    by_name = {e.name: e for e in engines}
    per_round = max(1, min(per_round, iters))
    rounds = math.ceil(iters / per_round)
    bar = _Bar(len(engines) + rounds * len(engines), progress)
    try:
        for engine in engines:
            for _ in range(warmup):
                engine.run()
            bar.update(f"warm {engine.name}")
        times: dict[str, list[float]] = {n: [] for n in names}
        orders: list[list[str]] = []
        for r in range(rounds):
            order = rotated(names, r)
            orders.append(order)
            count = min(per_round, iters - r * per_round)
            for name in order:
                run = by_name[name].run
                deadline = time.perf_counter() + settle_ms / 1e3
                done = 0
                while done < settle or time.perf_counter() < deadline:
                    run()
                    done += 1
                bucket = times[name]
                for _ in range(count):
                    start = time.perf_counter_ns()
                    run()
                    bucket.append((time.perf_counter_ns() - start) / 1e6)
                bar.update(name)
    finally:
        bar.close()
    return times, orders


def agreement(reference: list[np.ndarray],
              outputs: list[np.ndarray]) -> tuple[float | None, float | None]:
    """(lowest cosine similarity over outputs, top-1 agreement over (batch, classes) outputs)."""
    if len(reference) != len(outputs):
        return None, None
    cosines: list[float] = []
    top1: list[float] = []
    for ref, out in zip(reference, outputs, strict=True):
        if np.size(ref) != np.size(out):
            return None, None
        cosines.append(cosine(ref, out))
        if ref.ndim == 2 and ref.shape[-1] > 1:
            same = np.argmax(ref, axis=-1) == np.argmax(np.asarray(out), axis=-1)
            top1.append(float(np.mean(same)))
    return (min(cosines) if cosines else None), (float(np.mean(top1)) if top1 else None)


def paired_ratio(times: list[float], base: list[float], per_round: int) -> float:
    """Median over rounds of the engine's round median / fused's round median: each round's
    ratio compares runs made seconds apart, so slow drift cancels out."""
    ratios = [float(np.median(times[i:i + per_round]) / np.median(base[i:i + per_round]))
              for i in range(0, min(len(times), len(base)), per_round)]
    return float(np.median(ratios)) if ratios else math.nan


def _stats(engine: Engine, times: list[float], base: list[float], per_round: int, batch: int,
           agree: tuple[float | None, float | None]) -> EngineStats:
    median = float(np.median(times))
    base_ms = float(np.median(base))
    return EngineStats(engine.name, engine.compile_s, [round(t, 4) for t in times], median,
                       float(np.percentile(times, 90)), float(np.mean(times)), float(min(times)),
                       median / base_ms if base_ms > 0 else math.nan,
                       paired_ratio(times, base, per_round),
                       batch * 1000.0 / median if median > 0 else math.nan,
                       agree[0], agree[1], engine_note(engine), engine.info)


def run_bench(config: BenchConfig, workdir: Path | None = None) -> BenchResult:
    """Build every engine, time them interleaved, check their outputs against fused.
    ``workdir`` holds the batch-rewritten model (default: a temporary directory, removed)."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="qfuse-bench-") as tmp:
            return run_bench(config, Path(tmp))
    from qfuse.compiler.api import random_inputs
    from qfuse.runtime.onednn import effective_cpu_isa

    for flag, value in (("iters", config.iters), ("batch", config.batch),
                        ("threads", config.threads)):
        if value is not None and value < 1:
            raise InputError(f"--{flag} must be at least 1, got {value}")
    if config.threads is not None and config.threads > MAX_THREADS:
        raise InputError(f"--threads must be at most {MAX_THREADS}, got {config.threads}")
    threads = config.threads or default_threads()
    unknown = [n for n in config.compare if n not in ENGINES]
    if unknown:
        raise InputError(f"unknown engine(s) {unknown} in --compare; choose from "
                         f"{', '.join(e for e in ENGINES if e != BASELINE)}")
    names = [BASELINE] + [n for n in dict.fromkeys(config.compare) if n != BASELINE]
    path = Path(config.model)
    if config.input_shapes:
        path = with_input_shapes(path, config.input_shapes, workdir)
    batch = config.batch or model_batch(path)
    if config.batch is not None and config.batch != model_batch(path):
        path = with_batch(path, config.batch, workdir)
    engines: list[Engine] = []
    skipped: dict[str, str] = {}
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        try:
            engine = make_engine(name, path, threads, feeds)
        except MalformedModelError as exc:
            if path == Path(config.model):
                raise
            raise InputError(f"{exc} (with --batch {config.batch}: the model fixes its batch "
                             "size inside the graph, e.g. in a Reshape's shape)") from exc
        except EngineUnavailable as exc:
            skipped[name] = str(exc)
            log.warning("skipping %s: %s", name, exc)
            continue
        if name == BASELINE:  # the feeds dict is shared: fill it once, from the model
            feeds.update(config.inputs if config.inputs is not None
                         else random_inputs(engine.compiled, seed=0))
        engines.append(engine)
    reference = engines[0].outputs()
    agree = {e.name: agreement(reference, e.outputs()) for e in engines}
    before = _cpu_clock()
    times, orders = measure(engines, config.iters, config.per_round, config.warmup,
                            config.settle, config.progress, config.settle_ms)
    others = _others_share(before, _cpu_clock())
    per_round = max(1, min(config.per_round, config.iters))
    stats = {e.name: _stats(e, times[e.name], times[BASELINE], per_round, batch, agree[e.name])
             for e in engines}
    compiled = {e.name: e.compiled for e in engines if e.compiled is not None}
    return BenchResult(str(config.model), threads, batch, config.iters, per_round, orders,
                       stats, skipped, effective_cpu_isa().name, str(path), inputs_label(config),
                       others, compiled=compiled)


def inputs_label(config: BenchConfig, seed: int = 0) -> str:
    """Which inputs the engines ran on: the file (or 'given') or random N(0,1) with its seed."""
    if config.inputs is None:
        return f"random N(0,1), seed {seed}"
    return config.inputs_source or "given by the caller"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def format_table(result: BenchResult) -> str:
    """The comparison table (ratios against qfuse fused; > 1 means slower than fused)."""
    rounds = len(result.orders)
    lines = [(f"qfuse bench {Path(result.model).name}: threads {result.threads}, batch "
              f"{result.batch}, {result.iters} timed runs per engine in {rounds} interleaved "
              f"rounds, cpu isa {result.isa}"),
             f"inputs: {result.inputs}",
             (f"{'engine':<12} {'compile s':>9} {'median ms':>10} {'p90 ms':>9} {'x fused':>8} "
              f"{'paired':>7} {'inf/s':>9} {'cosine':>8} {'top-1':>6}  notes")]
    for s in result.engines.values():
        lines.append(f"{s.name:<12} {s.compile_s:>9.3f} {s.median_ms:>10.3f} {s.p90_ms:>9.3f} "
                     f"{_fmt(s.ratio, '.2f'):>8} {_fmt(s.paired_ratio, '.2f'):>7} "
                     f"{_fmt(s.throughput, '.1f'):>9} "
                     f"{_fmt(s.cosine, '.5f'):>8} {_fmt(s.top1, '.2f'):>6}  {s.note}")
    for name, reason in result.skipped.items():
        lines.append(f"skipped {name}: {reason}")
    if result.others_cpu is not None and result.others_cpu >= BUSY_SHARE:
        lines.append(f"note: other processes used {100 * result.others_cpu:.0f}% of the CPU "
                     "time while the engines were timed: latencies are noisier (interleaving "
                     "keeps the ratios comparable; the paired column is the most robust)")
    return "\n".join(lines)


def main_bench(args: Any) -> int:
    """The `qfuse bench` command (called by compiler/cli.py)."""
    from qfuse.compiler.cli import input_shapes
    from qfuse.compiler.cli_output import emit

    config = BenchConfig(Path(args.model), list(args.compare or []), args.threads, args.iters,
                         args.batch, input_shapes(args), progress=True)
    regular_file(config.model, "model")
    if args.plot:
        writable(args.plot, "plot")
    if args.json and args.json != "-":
        writable(args.json, "JSON")
    if getattr(args, "inputs", None):
        from qfuse.compiler.input_files import graph_input_names, read_inputs, shapes_of

        config.inputs = read_inputs(Path(args.inputs), graph_input_names(config.model))
        config.inputs_source = str(args.inputs)
        if config.input_shapes is None and config.batch is None:
            config.input_shapes = shapes_of(config.model, config.inputs)
    if config.iters < 1:
        raise InputError(f"--iters must be at least 1, got {config.iters}")
    with tempfile.TemporaryDirectory(prefix="qfuse-bench-") as tmp:
        result = run_bench(config, Path(tmp))
        text = [format_table(result)]
        if args.profile or args.plot:
            from qfuse.compiler.bench_profile import (
                format_profile,
                plot_fused_vs_unfused,
                profile_model,
            )

            result.profile = profile_model(result.compiled, Path(result.model_used),
                                           result.threads, runs=max(config.iters, 10),
                                           with_unfused=bool(args.plot))
            if args.profile:
                text += ["", format_profile(result.profile)]
            if args.plot:
                plot_fused_vs_unfused(result.profile, Path(args.plot))
                text.append(f"wrote {args.plot}")
    emit(args.json, result.to_json(), "\n".join(text))
    return 0
