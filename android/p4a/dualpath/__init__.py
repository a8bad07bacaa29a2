"""python-for-android recipe: DualPath, built from the checkout this folder belongs to.

Used through ``p4a.local_recipes = ../../android/p4a`` and ``dualpath`` in the requirements of
examples/android_app/buildozer.spec (or ``p4a apk --local-recipes android/p4a
--requirements python3,kivy,dualpath,...``). Nothing here has been run: this checkout's
machines have no Android NDK. What it relies on, read in python-for-android's sources
(release 2026.5.9): ``PyProjectRecipe`` builds a wheel with ``python -m build`` (setuptools,
Cython and numpy for the build host come from PyPI, in an isolated environment) using the
NDK's clang from the recipe environment, retags it for Android and unpacks it into the
app's site-packages; ``depends`` are recipes built first; ``python_depends`` are
pip-installed pure-Python packages.

Three things differ from a desktop build of setup.py:

* the source is the checkout's ``pyproject.toml``, ``setup.py``, ``README.md``, ``sdk/`` and
  ``cython_ext/``, copied (never the whole checkout: the app's ``.buildozer`` build folder is
  inside it, and so are desktop builds of the extensions);
* ``DUALPATH_TARGET_MACHINE`` tells setup.py the phone's architecture (it would otherwise
  pick the build host's AVX kernels): NEON and NEON-FP16 kernels on arm64-v8a, chosen at run
  time by HWCAP;
* setup.py links ``-lpthread`` as glibc needs; Android's libc holds the pthread functions and
  the NDK ships no libpthread, so an empty ``libpthread.a`` satisfies the flag.

onnxruntime must come from a recipe too (PyPI has no Android wheel); see android/README.md
for where python-for-android stands on one.
"""

import os
import shutil
from os.path import abspath, dirname, join

from pythonforandroid.logger import info
from pythonforandroid.recipe import PyProjectRecipe

REPO_ROOT = dirname(dirname(dirname(dirname(abspath(__file__)))))
"""The checkout: android/p4a/dualpath/__init__.py is four levels below it."""

SOURCES = ("pyproject.toml", "setup.py", "README.md", "sdk", "cython_ext")
"""What the wheel is built from."""

BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info", "build")
"""Desktop builds in the checkout (an editable install leaves host .so files in sdk/dualpath)."""

TARGET_MACHINE = {"arm64-v8a": "aarch64", "armeabi-v7a": "armv7l", "x86_64": "x86_64", "x86": "i686"}
"""python-for-android's arch -> what ``platform.machine()`` says on such a phone, for setup.py:
aarch64 builds the NEON kernels, x86_64 the AVX2/AVX-512 ones, the others the generic C ones."""

EMPTY_AR_ARCHIVE = b"!<arch>\n"


class DualPathRecipe(PyProjectRecipe):
    name = "dualpath"
    version = "0.1.0"
    """pyproject.toml's [project] version (tests/android/test_packaging.py holds them equal)."""
    url = None
    """Built from the checkout (``prepare_build_dir``), never downloaded."""
    site_packages_name = "dualpath"
    depends = ["numpy", "onnxruntime"]
    """Compiled dependencies: python-for-android recipes, built for the phone first."""
    python_depends = ["gguf", "pyyaml", "jinja2", "markupsafe"]
    """The pure-Python core (pip installs them without their dependencies, so jinja2's
    markupsafe is named; PyYAML and MarkupSafe fall back to pure Python where their C
    speedups do not build). tokenizers and onnx are left out as on every Android install
    (pyproject.toml): SentencePiece-vocabulary models, and models whose converted-model cache
    entry has its graphs, need neither."""

    def prepare_build_dir(self, arch):
        # ``arch`` is the arch's name here (build.py calls prepare_build_dir(arch.arch)).
        build_dir = self.get_build_dir(arch)
        shutil.rmtree(build_dir, ignore_errors=True)
        os.makedirs(build_dir)
        for name in SOURCES:
            src, dst = join(REPO_ROOT, name), join(build_dir, name)
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=BUILD_LEFTOVERS)
            else:
                shutil.copy2(src, dst)
        info(f"dualpath: copied {', '.join(SOURCES)} from {REPO_ROOT}")

    def check_prebuilt(self, arch, msg=""):
        # Always this checkout's code, never a wheel of that name from an index.
        return False

    def get_recipe_env(self, arch, **kwargs):
        env = super().get_recipe_env(arch, **kwargs)
        env["DUALPATH_TARGET_MACHINE"] = TARGET_MACHINE[arch.arch]
        env["LDFLAGS"] += f" -L{self._pthread_stub_dir(arch)}"
        return env

    def _pthread_stub_dir(self, arch) -> str:
        """A folder holding an empty ``libpthread.a`` (see the module docstring)."""
        folder = join(self.get_build_container_dir(arch.arch), "pthread-stub")
        os.makedirs(folder, exist_ok=True)
        path = join(folder, "libpthread.a")
        if not os.path.isfile(path):
            with open(path, "wb") as f:
                f.write(EMPTY_AR_ARCHIVE)
        return folder


recipe = DualPathRecipe()
