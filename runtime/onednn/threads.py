"""Library-wide settings: threads, CPU ISA, version, verbosity.

Threads: libdnnl.so.3 from onednn-cpu-gomp is built with GNU OpenMP and links libgomp.so.1.
`omp_set_num_threads` / `omp_get_max_threads` are looked up with dlsym on libdnnl's own handle
(see _lib._PROTOTYPES): dlsym on a dlopen handle searches that object and then its dependencies
in load order, so these are exactly the libgomp functions oneDNN's parallel regions consult,
not those of some other OpenMP runtime a different package may have loaded (numpy's OpenBLAS,
OpenVINO's TBB). `omp_set_num_threads` sets the calling thread's team size for later parallel
regions; call it from the thread that executes primitives. `OMP_NUM_THREADS` in the environment
before import has the same effect process-wide.

ISA: `set_max_cpu_isa` caps the instruction set oneDNN dispatches to (like env
ONEDNN_MAX_CPU_ISA) and only works before the first primitive is created: afterwards oneDNN
returns invalid_arguments and this raises DnnlError.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from ctypes import byref, c_int
from dataclasses import dataclass

from qfuse.runtime.onednn._lib import C, check
from qfuse.runtime.onednn.enums import CpuIsa

log = logging.getLogger(__name__)

# Above any CPU qfuse runs on; GNU OpenMP would try to start every thread asked for (a team
# of 10^9 hangs the process), so larger counts are refused.
MAX_THREADS = 1024


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    hash: str
    cpu_runtime: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch} ({self.hash[:10]})"


def version() -> Version:
    """oneDNN library version (dnnl_version)."""
    info = C.dnnl_version().contents
    return Version(info.major, info.minor, info.patch, (info.hash or b"").decode(),
                   info.cpu_runtime)


def set_num_threads(count: int) -> None:
    """Number of OpenMP threads oneDNN primitives use from now on (calling thread)."""
    if not 1 <= count <= MAX_THREADS:
        raise ValueError(f"thread count must be 1..{MAX_THREADS}, got {count}")
    C.omp_set_num_threads(int(count))
    log.debug("oneDNN threads set to %d", count)


@contextmanager
def team(count: int | None) -> Iterator[None]:
    """Within the block, oneDNN parallel regions started from this thread use ``count``
    threads (None: unchanged); the team size before it is restored after. Primitives are
    created inside it for a plan that runs at ``count`` threads: oneDNN sizes a primitive's
    work split (a convolution's thread blocking, a reorder's balance of kernel and driver
    loops) and scratchpad for the threads there are when it is created, and runs correctly
    only with those threads (https://github.com/uxlfoundation/oneDNN/issues/1201)."""
    if count is None:
        yield
        return
    before = get_num_threads()
    set_num_threads(count)
    try:
        yield
    finally:
        set_num_threads(before)


def primitive_cache_capacity() -> int:
    """Entries oneDNN's primitive cache keeps (ONEDNN_PRIMITIVE_CACHE_CAPACITY, default 1024)."""
    capacity = c_int()
    check(C.dnnl_get_primitive_cache_capacity(byref(capacity)),
          "dnnl_get_primitive_cache_capacity")
    return int(capacity.value)


def set_primitive_cache_capacity(capacity: int) -> None:
    """Resize oneDNN's primitive cache (0 turns it off; shrinking evicts entries)."""
    check(C.dnnl_set_primitive_cache_capacity(int(capacity)),
          "dnnl_set_primitive_cache_capacity", f"capacity={capacity}")


def get_num_threads() -> int:
    """Threads the next oneDNN parallel region on this thread will use."""
    return int(C.omp_get_max_threads())


def effective_cpu_isa() -> CpuIsa:
    """The ISA oneDNN dispatches to (0xfef avx512_core_amx on Sapphire Rapids)."""
    value = int(C.dnnl_get_effective_cpu_isa())
    try:
        return CpuIsa(value)
    except ValueError:
        raise RuntimeError(f"oneDNN reports an unknown cpu isa {value:#x}") from None


def set_max_cpu_isa(isa: CpuIsa) -> None:
    """Cap the ISA; must precede the first primitive creation (else DnnlError)."""
    check(C.dnnl_set_max_cpu_isa(CpuIsa(isa)), "dnnl_set_max_cpu_isa",
          f"{CpuIsa(isa).name}: refused (oneDNN fixes the ISA when the first primitive is "
          "created; set it earlier or use env ONEDNN_MAX_CPU_ISA before import)")
    log.info("oneDNN max cpu isa set to %s", CpuIsa(isa).name)


def set_verbose(level: int) -> None:
    """0 off, 1 print each execution with its implementation, 2 also creation."""
    check(C.dnnl_set_verbose(int(level)), "dnnl_set_verbose", f"level={level}")
