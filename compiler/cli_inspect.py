"""`qfuse compile` and `qfuse inspect`: what the compiler made of a model, for people and tools."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from qfuse.compiler.cli_output import emit

# op types and reasons an island's text lines list one by one; more are summarized
ISLAND_TEXT_ITEMS = 8


def _compile(args: argparse.Namespace) -> tuple[Any, float]:
    from qfuse.compiler.api import compile_model
    from qfuse.compiler.cli import exact_int8, input_shapes

    start = time.perf_counter()
    model = compile_model(args.model, mode=getattr(args, "mode", "fused"),
                          threads=getattr(args, "threads", None), input_shapes=input_shapes(args),
                          exact_int8=exact_int8(args))
    return model, time.perf_counter() - start


def main_compile(args: argparse.Namespace) -> int:
    model, seconds = _compile(args)
    info = model.inspect()
    emit(args.json, info, lambda: format_summary(args.model, info, seconds))
    return 0


def format_summary(model: object, info: dict[str, Any], seconds: float) -> str:
    """What ``qfuse compile`` prints."""
    lines: list[str] = []
    print = lines.append
    kinds = Counter(k["primitive"] for k in info["kernels"])
    fused = [k for k in info["kernels"] if k["absorbed"] and len(k["absorbed"]) > 1]
    print(f"{model}: compiled in {seconds:.2f} s ({info['mode']} mode, "
          f"cpu isa {info['cpu_isa']})")
    print(f"  kernels: {len(info['kernels'])} ("
          + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()) + ")")
    print(f"  fused kernels (absorbing more than one ONNX node): {len(fused)}")
    print(f"  reorders between kernels: {info['reorders']}, at inputs/outputs: "
          f"{info['io_reorders']}; numpy kernels: {info['numpy_kernels']}")
    print(f"  buffers: {info['buffers']['count']} ({info['buffers']['bytes'] / 1024:.0f} KiB), "
          f"constants: {info['constants']['bytes'] / 1024:.0f} KiB")
    print(f"  not fused: {len(info['not_fused'])} node(s) — `qfuse inspect` lists them")
    islands = info.get("islands", [])
    if islands:
        engines = Counter(i["engine"] for i in islands)
        print(f"  float islands: {len(islands)} ("
              + ", ".join(f"{n} on {e}" for e, n in engines.most_common()) + ") — ops "
              + ", ".join(sorted({op for i in islands for op in i["ops"]})))
    if not info.get("exact_int8_dot_products", True):
        split = sum("split weights (no VNNI)" in how for how in info.get("exact_int8", {}).values())
        if info.get("exact_int8"):
            print(f"  no VNNI/AMX on this CPU: {split} int8 node(s) split into two kernels so "
                  "their accumulators stay exact (`qfuse inspect` shows which)")
        else:
            print("  WARNING: this CPU has no VNNI/AMX: oneDNN's u8·s8 products saturate in "
                  "int16")
    return "\n".join(lines)


def _masks(masks: dict[str, int]) -> str:
    return ", ".join(f"{arg} (mask {mask})" for arg, mask in masks.items()) or "none"


def format_inspect(info: dict[str, Any]) -> str:
    lines = [f"{len(info['kernels'])} kernels ({info['mode']} mode, cpu isa {info['cpu_isa']})", ""]
    for i, k in enumerate(info["kernels"], 1):
        chain = ", ".join(k.get("post_op_details") or k["post_ops"]) or "none"
        lines.append(f"[{i}] {k['name']}: {k['primitive']} {k['src_dtype']}→{k['dst_dtype']} "
                     f"on {k['impl']}")
        lines.append(f"    post-ops:  {chain}")
        if k.get("scales_masks") or k.get("zero_points_masks"):
            lines.append(f"    scales:    {_masks(k.get('scales_masks', {}))}; zero points: "
                         f"{_masks(k.get('zero_points_masks', {}))}")
        if k.get("rounding"):
            lines.append(f"    rounding:  {k['rounding']}")
        if k.get("src_layouts"):
            lines.append(f"    layouts:   src {' | '.join(k['src_layouts'])} → dst "
                         f"{' | '.join(k.get('dst_layouts', []))}")
        if k.get("weights_layout"):
            lines.append(f"    weights:   {k['weights_layout']}")
        if k["optimizations"]:
            counted = Counter(k["optimizations"])
            lines.append("    composer:  " + ", ".join(
                name if n == 1 else f"{name} ×{n}" for name, n in counted.items()))
        if k["absorbed"]:
            lines.append(f"    absorbed:  {', '.join(k['absorbed'])}")
        if k.get("exact_int8"):
            lines.append(f"    exact:     {k['exact_int8']}")
        if k.get("note"):
            lines.append(f"    note:      {k['note']}")
    lines.append("")
    lines.append(f"reorders between kernels: {info['reorders']}; at inputs/outputs: "
                 f"{info['io_reorders']}; in-place sums: {info['in_place_sums']}; numpy "
                 f"kernels: {info['numpy_kernels']}")
    concats = info.get("concats", [])
    if concats:
        lines.append(f"concats ({len(concats)}, {sum(c['in_place'] for c in concats)} in "
                     "place, no concat kernel):")
        for c in concats:
            lines.append(f"  {c['concat']}" + (" (in place)" if c["in_place"] else ""))
            for i, item in enumerate(c["inputs"]):
                why = f"; not in its producer: {item['requantize_reason']}" \
                    if item["requantize_reason"] else ""
                lines.append(f"    input {i}: {item['scale']}{why}; {item['bytes']}")
    lines.append(f"not fused ({len(info['not_fused'])}):")
    for item in info["not_fused"]:
        lines.append(f"  {item['node']} ({item['op']}): {item['reason']}")
    lines.append(f"float islands ({len(info.get('islands', []))}):")
    for island in info.get("islands", []):
        lines.append(f"  {island['name']} on {island['engine']}: {len(island['nodes'])} ONNX "
                     f"node(s), ops {_ops_text(island['ops'])}")
        lines.append(f"    why: {_reasons_text(island['reason'])}")
    return "\n".join(lines)


def _ops_text(ops: list[str]) -> str:
    """An island's op types in order, or with counts when there are many (a detector's
    post-processing island holds a thousand nodes)."""
    if len(ops) <= ISLAND_TEXT_ITEMS:
        return ", ".join(ops)
    return ", ".join(op if n == 1 else f"{op} ×{n}" for op, n in Counter(ops).most_common())


def _reasons_text(reason: str) -> str:
    """An island's reasons ("; "-joined), the first few of many (``--json`` has them all)."""
    parts = reason.split("; ")
    if len(parts) <= ISLAND_TEXT_ITEMS:
        return reason
    return "; ".join(parts[:ISLAND_TEXT_ITEMS]) + (
        f"; and {len(parts) - ISLAND_TEXT_ITEMS} more (--json lists them)")


def main_inspect(args: argparse.Namespace) -> int:
    model, _ = _compile(args)
    info = model.inspect()
    emit(args.json, info, lambda: format_inspect(info))
    return 0
