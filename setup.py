"""Builds DualPath's compiled extensions. Metadata lives in pyproject.toml.

Every C file is compiled for the baseline of its target: no -march=native, so
the wheel runs on any CPU of the architecture. SIMD kernels get their own flags
per file and are chosen at run time.
"""
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "dualpath._kernels",
        sources=["cython_ext/_kernels.pyx", "cython_ext/csrc/kernels_generic.c"],
        include_dirs=["cython_ext", np.get_include()],
        extra_compile_args=["-O3", "-std=c11", "-fno-math-errno"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    Extension(
        "dualpath._kvarena",
        sources=["cython_ext/_kvarena.pyx", "cython_ext/csrc/kv_arena.c"],
        include_dirs=["cython_ext", np.get_include()],
        extra_compile_args=["-O3", "-std=c11", "-fno-math-errno"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
]

setup(ext_modules=cythonize(extensions, include_path=["cython_ext"], language_level=3))
