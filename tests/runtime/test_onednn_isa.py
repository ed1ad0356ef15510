"""CPU ISA control, in subprocesses (oneDNN fixes its ISA once per process).

`test_int8_module_under_avx2` runs test_onednn_int8.py with ONEDNN_MAX_CPU_ISA=AVX2: no
VNNI/AMX, so the kernels are jit_uni_int8:avx2 (conv/deconv) and GEMM-based or ref:any
(inner product, matmul); that module then checks them to 0 LSB against the AVX2 accumulator
models written in its docstring (int16 saturation of u8 x s8 pairs, halved weights for s8 src)
and that they do differ from the exact sum on full-range data.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INT8_TESTS = Path(__file__).with_name("test_onednn_int8.py")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_int8_module_under_avx2() -> None:
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "QFUSE_ONEDNN_ISA": "avx2"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(INT8_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) >= 20, output
    assert "skipped" not in output, output  # the AVX2-only tests ran, the ISA was the asked one


def test_set_max_cpu_isa_before_and_after_first_primitive() -> None:
    result = run_python("""
        from qfuse.runtime.onednn import *
        set_max_cpu_isa(CpuIsa.avx2)
        print("isa", effective_cpu_isa().name)
        src = MemoryDesc.from_tag((1, 16, 8, 8), DataType.u8, FormatTag.nhwc)
        pd = convolution(src, MemoryDesc.from_tag((16, 16, 3, 3), DataType.s8, FormatTag.any),
                         MemoryDesc.from_tag((1, 16, 6, 6), DataType.u8, FormatTag.nhwc))
        pd.create()
        print("impl", pd.impl_name)
        try:
            set_max_cpu_isa(CpuIsa.avx512_core_amx)
        except DnnlError as error:
            print("refused", error.call, error.status.name)
    """)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["isa"] == "avx2"
    assert lines["impl"].endswith("avx2"), lines["impl"]
    assert lines["refused"] == "dnnl_set_max_cpu_isa invalid_arguments"


def test_verbose_names_the_kernel() -> None:
    result = run_python("""
        import numpy as np
        from qfuse.runtime.onednn import *
        md = MemoryDesc.from_tag((8, 8), DataType.f32)
        primitive = eltwise(Alg.eltwise_relu, md).create()
        print("impl", primitive.impl_name, flush=True)
        primitive.execute({Arg.SRC: Memory(md), Arg.DST: Memory(md)})
    """, ONEDNN_VERBOSE="1")
    assert result.returncode == 0, result.stderr
    impl = result.stdout.splitlines()[0].split(" ", 1)[1]
    assert re.search(rf"onednn_verbose.*exec.*eltwise.*{re.escape(impl)}", result.stdout)
