"""What the CPU can do, read from the OS (``/proc/cpuinfo``); no code is run to probe.

The compiled kernels do their own run-time check (CPUID + xgetbv on x86,
``getauxval`` on ARM); this module only reports, for ``dualpath info``.
"""

from __future__ import annotations

import os
import platform

INTERESTING = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
               "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_int8", "amx_bf16",
               "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "i8mm", "bf16")


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features(cpuinfo_path: str = "/proc/cpuinfo") -> list[str]:
    """The SIMD-relevant feature flags the OS reports, in a fixed order."""
    flags: set[str] = set()
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
                    break
    except OSError:
        return []
    return [f for f in INTERESTING if f in flags]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def numa_nodes(root: str = "/sys/devices/system/node") -> int:
    """Online NUMA nodes (1 where the kernel exposes none)."""
    try:
        return max(1, sum(1 for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()))
    except OSError:
        return 1
