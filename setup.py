"""Builds DualPath's compiled extensions. Metadata lives in pyproject.toml.

Every C file is compiled for the baseline of its target: no -march=native, so
the wheel runs on any CPU of the architecture. Each SIMD kernel file is built
into a small static library with its own flags and chosen at run time
(csrc/cpu_features.c); nothing else is compiled with SIMD flags.
"""
import os
import platform

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

CSRC = "cython_ext/csrc"
X86, ARM = f"{CSRC}/arch/x86", f"{CSRC}/arch/arm"  # one folder of kernels per architecture
COMMON = ["-O3", "-std=c11", "-fno-math-errno", "-fPIC"]
# DUALPATH_TARGET_MACHINE=aarch64 with CC/LDSHARED/AR set to a cross toolchain builds for
# another architecture (android/check_aarch64.sh does).
machine = (os.environ.get("DUALPATH_TARGET_MACHINE") or platform.machine()).lower()
if machine in ("x86_64", "amd64"):
    ISA_LIBS = [
        ("dp_isa_avx2", {"sources": [f"{X86}/attn_avx2.c", f"{X86}/qmatmul_avx2.c", f"{X86}/lmatmul_avx2.c"], "cflags": COMMON + ["-mavx2", "-mfma", "-mf16c"]}),
        ("dp_isa_avx512", {"sources": [f"{X86}/attn_avx512.c", f"{X86}/qmatmul_avx512.c", f"{X86}/lmatmul_avx512.c"],
                           "cflags": COMMON + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]}),
    ]
elif machine in ("aarch64", "arm64"):
    ISA_LIBS = [
        ("dp_isa_neon", {"sources": [f"{ARM}/attn_neon.c", f"{ARM}/qmatmul_neon.c", f"{ARM}/lmatmul_neon.c"], "cflags": COMMON}),
        ("dp_isa_neon_fp16", {"sources": [f"{ARM}/attn_neon_fp16.c"], "cflags": COMMON + ["-march=armv8.2-a+fp16"]}),
        ("dp_isa_neon_dotprod", {"sources": [f"{ARM}/lmatmul_neon_dotprod.c"], "cflags": COMMON + ["-march=armv8.2-a+fp16+dotprod"]}),
        ("dp_isa_neon_i8mm", {"sources": [f"{ARM}/lmatmul_neon_i8mm.c"], "cflags": COMMON + ["-march=armv8.2-a+fp16+dotprod+i8mm"]}),
    ]
else:
    ISA_LIBS = []

BASE_SOURCES = [f"{CSRC}/kv_arena.c", f"{CSRC}/kv_attn.c", f"{CSRC}/attn_generic.c", f"{CSRC}/cpu_features.c", f"{CSRC}/dp_pool.c",
                f"{CSRC}/qmatmul.c", f"{CSRC}/lmatmul.c", f"{CSRC}/enc_attn.c"]


def ext(name, sources, libraries=()):
    return Extension(
        name,
        sources=sources,
        include_dirs=["cython_ext", np.get_include()],
        extra_compile_args=["-O3", "-std=c11", "-fno-math-errno"],
        libraries=list(libraries) + ["pthread", "m"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


extensions = [
    ext("dualpath._kernels", ["cython_ext/_kernels.pyx", f"{CSRC}/kernels_generic.c", f"{CSRC}/ggml_repack.c"]),
    # The ISA libraries come after the objects that reference them (static link order).
    ext("dualpath._kvarena", ["cython_ext/_kvarena.pyx"] + BASE_SOURCES, [name for name, _ in ISA_LIBS]),
]

setup(libraries=ISA_LIBS, ext_modules=cythonize(extensions, include_path=["cython_ext"], language_level=3))
