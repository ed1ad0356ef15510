"""The long fuzzing campaign: ``make fuzz N=10000`` (tests/fuzz/README.md).

    python -m tests.fuzz.campaign --n 10000 [--start 0] [--jobs 2] [--threads T]
        [--timeout 120] [--json results.json] [--ties ties.md] [--minimize DIR]

Seeds run in ``--jobs`` worker processes (spawned, so a crash kills one worker, not the
campaign): a worker that dies while a seed runs records that seed as ``crash``, one that
exceeds ``--timeout`` seconds on a seed is killed and the seed recorded as ``hang``; a new
worker takes over. A progress line every ~5 %, then the count per class, the tie cases, the
failures grouped by message and the worst cases. ``--minimize DIR`` shrinks each distinct
failure (tests/fuzz/minimize.py) and saves it as ``DIR/<class>_<seed>.onnx``.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import queue
import sys
import time
from pathlib import Path
from typing import Any

from tests.fuzz.harness import CLASSES, Result


def _worker(tasks: Any, results: Any, wid: int, threads: int | None) -> None:
    import logging
    import warnings

    import onnxruntime

    logging.disable(logging.WARNING)  # quantize_static's advice on every model
    warnings.simplefilter("ignore")
    onnxruntime.set_default_logger_severity(3)
    from tests.fuzz.generator import random_spec
    from tests.fuzz.harness import run_spec

    while True:
        seed = tasks.get()
        if seed is None:
            return
        results.put(("start", wid, seed))
        try:
            r = run_spec(random_spec(seed), threads=threads)
        except Exception as exc:  # noqa: BLE001 - the generator itself failed
            r = Result(seed, "", "reference", message=f"generator: {type(exc).__name__}: {exc}")
        results.put(("done", wid, r.to_dict()))


def run_campaign(seeds: list[int], jobs: int, threads: int | None, timeout: float,
                 log: Any = sys.stderr) -> list[Result]:
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    for s in seeds:
        tasks.put(s)
    workers: dict[int, Any] = {}
    current: dict[int, tuple[int, float] | None] = {}
    next_id = 0

    def start() -> None:
        nonlocal next_id
        p = ctx.Process(target=_worker, args=(tasks, results, next_id, threads), daemon=True)
        p.start()
        workers[next_id], current[next_id] = p, None
        next_id += 1

    for _ in range(max(1, min(jobs, len(seeds)))):
        start()
    done: list[Result] = []
    counts: collections.Counter[str] = collections.Counter()
    t0, last_report = time.time(), 0
    while len(done) < len(seeds):
        try:
            kind, wid, payload = results.get(timeout=1.0)
            if kind == "start":
                current[wid] = (payload, time.time())
            else:
                current[wid] = None
                done.append(Result(**payload))
                counts[done[-1].cls] += 1
        except queue.Empty:
            pass
        for wid, p in list(workers.items()):
            running = current.get(wid)
            dead = not p.is_alive()
            hung = running is not None and time.time() - running[1] > timeout
            if not (dead or hung):
                continue
            if hung:
                p.kill()
                p.join()
            if running is not None:
                cls = "hang" if hung else "crash"
                msg = (f"no result after {timeout:.0f} s" if hung
                       else f"worker died (exit code {p.exitcode})")
                done.append(Result(running[0], "", cls, message=msg))
                counts[cls] += 1
            del workers[wid], current[wid]
            if len(done) + len(workers) < len(seeds) or not workers:
                start()
        step = max(1, len(seeds) // 20)
        if len(done) // step > last_report // step or len(done) == len(seeds):
            last_report = len(done)
            rate = len(done) / max(time.time() - t0, 1e-9)
            print(f"[{len(done)}/{len(seeds)}] {rate:.1f} seeds/s  "
                  + "  ".join(f"{c}={counts[c]}" for c in CLASSES if counts[c]),
                  file=log, flush=True)
    for _ in workers:
        tasks.put(None)
    for p in workers.values():
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return sorted(done, key=lambda r: r.seed)


def report(results: list[Result]) -> str:
    counts = collections.Counter(r.cls for r in results)
    ties = collections.Counter(r.cls for r in results if r.tie)
    lines = [f"{len(results)} seeds"]
    for c in CLASSES:
        extra = f"  (ties: {ties[c]})" if ties[c] else ""
        lines.append(f"  {c:<17}{counts[c]:>6}{extra}")
    failed = [r for r in results if r.failed]
    lines.append(f"failures (ties excluded): {len(failed)}")
    groups: dict[str, list[Result]] = collections.defaultdict(list)
    from tests.fuzz.minimize import signature

    for r in failed:
        groups[f"{r.cls}: {signature(r)}"].append(r)
    for key, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(rs):>5} x {key}  seeds {[r.seed for r in rs[:8]]}")
    tie_first = collections.Counter(_op_of(r.first) for r in results if r.tie)
    if tie_first:
        lines.append("tie cases by the op whose quantizer first parts: "
                     + ", ".join(f"{k} {v}" for k, v in tie_first.most_common()))
    ort = collections.Counter("exact" if r.lsb_ort < 0.01 else "le1" if r.lsb_ort < 1.01
                              else "more" for r in results if r.cls in ("exact", "le1", "le3",
                                                                          "worse"))
    lines.append(f"reference vs onnxruntime (ORT_DISABLE_ALL): {dict(ort)}")
    worst = sorted((r for r in results if r.cls in ("le1", "le3", "worse")),
                   key=lambda r: (not r.failed, -r.lsb))[:10]
    if worst:
        lines.append("worst fused vs reference:")
        for r in worst:
            tie = " tie" if r.tie else ""
            lines.append(f"  seed {r.seed}: {r.lsb:g} LSB{tie} first at {r.first or '?'}  "
                         f"{r.summary}")
    worst_ort = sorted(results, key=lambda r: -r.lsb_ort)[:5]
    if worst_ort and worst_ort[0].lsb_ort > 1:
        lines.append("worst reference vs onnxruntime:")
        lines += [f"  seed {r.seed}: {r.lsb_ort:g} LSB  {r.summary}" for r in worst_ort
                  if r.lsb_ort > 1]
    return "\n".join(lines)


def tie_table(results: list[Result]) -> str:
    """The documented tie cases (tests/fuzz/ties.md): every seed whose difference is a tie."""
    ties = [r for r in results if r.tie]
    lines = ["| seed | max LSB | first differing quantizer | distance from the tie (steps) | model |",
             "|---|---|---|---|---|"]
    for r in sorted(ties, key=lambda r: (-r.lsb, r.seed)):
        lines.append(f"| {r.seed} | {r.lsb:g} | `{r.first}` | {r.tie_distance:.1e} | "
                     f"{r.summary} |")
    return "\n".join(lines)


def _op_of(tensor: str) -> str:
    parts = tensor.split("_")
    return parts[1] if len(parts) > 1 and parts[0].startswith("t") else tensor


def save_minimized(results: list[Result], out: Path, log: Any = sys.stderr) -> list[Path]:
    """Minimise one failure per distinct signature and save it (tests/fuzz/regressions)."""
    import onnx

    from tests.fuzz.generator import quantized_model, random_spec
    from tests.fuzz.minimize import minimize, signature

    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    saved = []
    for r in results:
        key = f"{r.cls}: {signature(r)}"
        if not r.failed or r.cls in ("crash", "hang") or key in seen:
            continue
        seen.add(key)
        spec, small, tried = minimize(random_spec(r.seed), r)
        path = out / f"{small.cls}_{r.seed}.onnx"
        onnx.save(quantized_model(spec), path)
        print(f"seed {r.seed} ({key[:80]}): {tried} candidates -> {small.summary} -> {path}",
              file=log, flush=True)
        saved.append(path)
    return saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.campaign")
    ap.add_argument("--n", type=int, default=1000, help="number of seeds")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--threads", type=int, default=None, help="oneDNN threads per run")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a hang")
    ap.add_argument("--json", type=Path, default=None, help="write every result here")
    ap.add_argument("--ties", type=Path, default=None,
                    help="write the tie cases as a markdown table here")
    ap.add_argument("--minimize", type=Path, default=None,
                    help="minimise each distinct failure and save it in this folder")
    args = ap.parse_args(argv)
    seeds = list(range(args.start, args.start + args.n))
    t0 = time.time()
    results = run_campaign(seeds, args.jobs, args.threads, args.timeout)
    print(report(results))
    print(f"{time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    if args.ties:
        args.ties.write_text(tie_table(results) + "\n")
    if args.minimize:
        save_minimized(results, args.minimize)
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
