"""``dualpath bench arm``: instructions per token on aarch64 under QEMU, DualPath beside llama.cpp.

The instructions a phone's core retires per token are half of its time per token (the other
half is how many it retires per cycle), and the half an emulator gives exactly and
repeatably, where its wall time says nothing. Every engine runs one thread, greedy, on the
same GGUF file and the same prompt ids, under ``qemu-aarch64 -cpu CPU`` with a TCG plugin
of ours (arm_tools/insn_count.c) that counts the guest instructions executed:

* DualPath: an arm64 Debian userland with Python, the aarch64 wheels of its dependencies
  and its extensions cross-compiled from this checkout, as android/check_aarch64.sh builds
  them (the bench runs that script when it is run from a checkout, or takes the folder an
  earlier run of it printed: ``--aarch64-work``). The guest runs ``_arm_worker.py``.
  The kernels are chosen at run time, as on a phone; ``--disable-cpu-features`` and
  ``--attention-kernel`` force others.
* llama.cpp: the sources llama-cpp-python's sdist vendors, cross-compiled static for a
  phone (armv8.2-a with dot products, FP16 and int8 matrix multiply) and for baseline
  ARMv8-A, with a one-thread greedy driver of ours over llama.h (arm_tools/llama_greedy.c).
  The phone build dies with SIGILL on a CPU model without those extensions: its row then
  says so.

Per generated token: (a run generating ``long`` tokens - one generating ``short``) /
(long - short), on the same prompt. Per prompt token: (a ``long``-token prompt - a
``short``-token prompt) / (long - short), each generating one token. Loading the model
and starting the process cancel out. With the breakdown (on by default) the plugin also
counts per translation block, and the per-token difference is attributed to the
functions of the files the guest had mapped (/proc/self/maps, guest addresses, written
at the end of each run; symbols by ``aarch64-linux-gnu-nm``).

The plugin, the llama.cpp builds and DualPath's converted-model cache are kept under
``~/.cache/dualpath-bench`` (``--cache-dir``), keyed by sources and flags. QEMU runs one at
a time. Host address randomisation is turned off for them (``setarch -R``), the guest's
hash seed fixed and numpy's OpenBLAS held to one thread, so that runs repeat their
counts; what still varies is DualPath's load, which reads the host's clock and page
cache, and the difference of two runs cancels the load and with it nearly all of that.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..errors import DualPathError
from .common import write_json
from .harness import BenchProcessError, stderr_tail

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python sdist whose vendored llama.cpp is built (the version the host runs)."""
LLAMA_BUILDS = {"phone": "armv8.2-a+dotprod+fp16+i8mm", "baseline": "armv8-a"}
"""llama.cpp build name -> GGML_CPU_ARM_ARCH."""
CPU_MODELS = ("max", "cortex-a76", "cortex-a53")
"""QEMU CPU models: every extension (SDOT and i8mm), SDOT without i8mm, neither."""
FULL_LENGTHS = {"decode": (8, 24), "prompt": (32, 96)}
QUICK_LENGTHS = {"decode": (2, 6), "prompt": (8, 24)}
"""(short, long) generated tokens and prompt tokens of the two runs whose difference is taken."""
N_CTX = 512
"""Context of both engines: the longest prompt and generation fit."""
PROMPT_TEXT = ("Once upon a time, in a town by the sea, there lived a small robot who loved to read. Every morning "
               "it walked to the library, opened a new book and read until the sun went down: books about the "
               "stars, the tides, the birds that crossed the ocean each autumn and the ships that followed them. "
               "The people of the town brought it old maps, letters and songs, and the robot kept them all in its "
               "memory, so that nothing they had written would ever be lost. One winter night a storm broke the "
               "library roof, and the robot stood under the hole holding the books above its head until morning.")
"""The prompt's text; DualPath's tokenizer makes the ids every engine is given."""
TIMEOUT_S = 3600.0
"""Wall-clock limit of one QEMU run."""
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "dualpath-bench")
TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arm_tools")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_arm_worker.py")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
AARCH64_SCRIPT = os.path.join(CHECKOUT, "android", "check_aarch64.sh")
OUR_KERNEL_FILES = ("_kvarena.", "_kernels.")
"""Basename prefixes of DualPath's extension modules (our kernels and their wrappers)."""


class ArmBenchError(DualPathError, RuntimeError):
    """A tool, a build or a run of ``dualpath bench arm`` is missing or failed."""


def need_tool(name: str, package: str) -> str:
    """The path of ``name`` on PATH, or an ArmBenchError naming the Debian package."""
    path = shutil.which(name)
    if path is None:
        raise ArmBenchError(f"{name} not found: apt-get install {package}")
    return path


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _compiler_version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def _run_build(cmd: list[str], what: str, log_path: str, cwd: str | None = None, env: dict | None = None) -> None:
    """Run a build step, its output into ``log_path``; ArmBenchError with the log's tail on failure."""
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        status = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env).returncode
    if status != 0:
        raise ArmBenchError(f"{what} failed (exit {status}); {log_path} ends:\n{stderr_tail(_read(log_path))}")


# -- the plugin ----------------------------------------------------------------------

def build_plugin(cache: str) -> str:
    """insn_count.c compiled by the host's C compiler into a plugin .so (cached by source)."""
    cc = shutil.which("cc") or need_tool("gcc", "gcc")
    src = os.path.join(TOOLS, "insn_count.c")
    so = os.path.join(cache, f"insn_count-{_digest(_read(src), _compiler_version(cc))}.so")
    if not os.path.exists(so):
        os.makedirs(cache, exist_ok=True)
        tmp = so + ".part"
        _run_build([cc, "-O2", "-std=gnu11", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", "-o", tmp, src,
                    "-lpthread"], "compiling the QEMU plugin insn_count.c", so + ".log")
        os.replace(tmp, so)
    return so


# -- llama.cpp -------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaBuild:
    name: str
    """``phone`` or ``baseline``."""
    arch: str
    """GGML_CPU_ARM_ARCH."""
    binary: str
    """The static aarch64 driver (llama_greedy.c over libllama.a)."""
    flags: str
    """The build's settings, as printed beside the figures."""


def llama_source(cache: str) -> str:
    """vendor/llama.cpp of llama-cpp-python's sdist, downloaded with pip once."""
    root = os.path.join(cache, f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}")
    vendor = os.path.join(root, f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}", "vendor", "llama.cpp")
    if os.path.exists(os.path.join(vendor, "include", "llama.h")):
        return vendor
    os.makedirs(root, exist_ok=True)
    log = os.path.join(root, "download.log")
    _run_build([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", root,
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], "pip download of llama-cpp-python's sdist", log)
    sdist = os.path.join(root, f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(root, filter="data")
    if not os.path.exists(os.path.join(vendor, "include", "llama.h")):
        raise ArmBenchError(f"{sdist} holds no vendor/llama.cpp/include/llama.h")
    return vendor


def _cmake_args(arch: str) -> list[str]:
    return ["-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc", "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
            "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={arch}", "-DGGML_OPENMP=OFF", "-DBUILD_SHARED_LIBS=OFF",
            "-DCMAKE_EXE_LINKER_FLAGS=-static", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF"]


def build_llama(cache: str, name: str, arch: str, jobs: int) -> LlamaBuild:
    """llama.cpp's ``llama`` library (and ggml) for aarch64 with ``arch``, and the driver
    linked static against it; cached by version, flags, driver source and compiler."""
    need_tool("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")
    gxx = need_tool("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu")
    cmake = need_tool("cmake", "cmake")
    driver = os.path.join(TOOLS, "llama_greedy.c")
    args = _cmake_args(arch)
    key = _digest(LLAMA_CPP_PYTHON_VERSION, args, _read(driver), _compiler_version(gxx))
    out = os.path.join(cache, f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{arch.replace('+', '_')}-{key}")
    binary = os.path.join(out, "llama_greedy")
    flags = (f"llama.cpp of llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}: GGML_CPU_ARM_ARCH={arch} GGML_NATIVE=OFF "
             "GGML_OPENMP=OFF BUILD_SHARED_LIBS=OFF -static, Release, aarch64-linux-gnu-gcc "
             + _compiler_version(gxx).split()[-1])
    if os.path.exists(binary):
        return LlamaBuild(name, arch, binary, flags)
    src = llama_source(cache)
    build, log = os.path.join(out, "build"), os.path.join(out, "build.log")
    os.makedirs(out, exist_ok=True)
    print(f"dualpath bench arm: building llama.cpp ({name}, {arch}) into {out} (log: {log})", file=sys.stderr)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run_build([cmake, "-S", src, "-B", build, *generator, *args], f"cmake configure of llama.cpp ({arch})", log)
    _run_build([cmake, "--build", build, "-j", str(jobs), "--target", "llama"], f"building llama.cpp ({arch})", log)
    libs = {os.path.basename(p): p for p in _find(build, ".a")}
    order = ["libllama.a", "libggml.a", "libggml-cpu.a", "libggml-base.a"]
    missing = [lib for lib in order if lib not in libs]
    if missing:
        raise ArmBenchError(f"the llama.cpp build in {build} made no {', '.join(missing)}")
    obj = os.path.join(out, "llama_greedy.o")
    _run_build(["aarch64-linux-gnu-gcc", "-O2", "-std=c11", "-Wall", "-c", driver, "-o", obj,
                "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include")],
               "compiling llama_greedy.c", log)
    _run_build([gxx, "-static", "-o", binary + ".part", obj, "-Wl,--start-group", *(libs[lib] for lib in order),
                "-Wl,--end-group", "-lpthread", "-lm"], "linking llama_greedy", log)
    os.replace(binary + ".part", binary)
    return LlamaBuild(name, arch, binary, flags)


def _find(root: str, suffix: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(suffix)]


# -- DualPath's aarch64 build ----------------------------------------------------------

@dataclass(frozen=True)
class DualPathBuild:
    install: str
    """The folder holding the dualpath package with its aarch64 extensions."""
    rootfs: str
    """The arm64 Debian userland (qemu-aarch64 -L)."""
    site: str
    """Its aarch64 wheels (numpy, onnxruntime, ...)."""
    provenance: str
    """The commit and the state of cython_ext/ when the extensions were built, if known."""


def _userland(cache: str) -> tuple[str, str]:
    """The newest userland of check_aarch64.sh's cache with its wheel folder (same key)."""
    pairs = []
    for name in os.listdir(cache) if os.path.isdir(cache) else []:
        root, site = os.path.join(cache, name), os.path.join(cache, "site-" + name[len("rootfs-"):])
        if (name.startswith("rootfs-") and os.path.exists(os.path.join(root, "usr", "bin", "python3.11"))
                and os.path.exists(os.path.join(site, ".complete"))):
            pairs.append((os.path.getmtime(root), root, site))
    if not pairs:
        raise ArmBenchError(f"{cache} holds no arm64 userland with its wheels (rootfs-KEY and site-KEY): run "
                            "android/check_aarch64.sh once, or pass --rootfs and --site")
    return max(pairs)[1:]


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", CHECKOUT, *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "?"


def build_dualpath(cache: str) -> str:
    """Run android/check_aarch64.sh (build only, kept) from this checkout; return its WORK folder."""
    if not os.path.exists(AARCH64_SCRIPT):
        raise ArmBenchError(f"{AARCH64_SCRIPT} not found: dualpath bench arm builds DualPath for aarch64 with that "
                            "script of a checkout; run it from one, or pass --aarch64-work")
    provenance = {"commit": _git("rev-parse", "HEAD"), "cython_ext": _git("status", "--short", "cython_ext")}
    env = dict(os.environ, DUALPATH_AARCH64_ONLY_BUILD="1", DUALPATH_AARCH64_KEEP="1", PYTHON=sys.executable)
    os.makedirs(cache, exist_ok=True)
    log = os.path.join(cache, "check_aarch64.log")
    if os.path.exists(log):  # the WORK folder is read from this run's last line
        os.remove(log)
    print(f"dualpath bench arm: building DualPath for aarch64 with {AARCH64_SCRIPT} (log: {log})", file=sys.stderr)
    _run_build(["bash", AARCH64_SCRIPT], "android/check_aarch64.sh", log, env=env)
    lines = [line for line in _read(log).splitlines() if line.strip()]
    if any(line.startswith("aarch64 check skipped:") for line in lines):
        raise ArmBenchError(next(line for line in lines if line.startswith("aarch64 check skipped:")))
    work = lines[-1].strip()
    if not os.path.isdir(os.path.join(work, "install", "dualpath")):
        raise ArmBenchError(f"android/check_aarch64.sh did not end with its WORK folder; {log} ends:\n"
                            f"{stderr_tail(_read(log))}")
    write_json(os.path.join(work, "bench-provenance.json"), provenance)
    print(f"dualpath bench arm: DualPath's aarch64 build is in {work} (--aarch64-work {work} reuses it)",
          file=sys.stderr)
    return work


def dualpath_build(args, cache: str) -> DualPathBuild:
    work = args.aarch64_work or build_dualpath(cache)
    install = os.path.join(work, "install")
    if not os.path.isdir(os.path.join(install, "dualpath")):
        raise ArmBenchError(f"--aarch64-work {work}: no install/dualpath there (the folder android/check_aarch64.sh "
                            "prints last with DUALPATH_AARCH64_KEEP=1)")
    if args.rootfs and args.site:
        rootfs, site = args.rootfs, args.site
    else:
        rootfs, site = _userland(os.environ.get("DUALPATH_AARCH64_CACHE")
                                 or os.path.join(os.path.expanduser("~"), ".cache", "dualpath-ci", "aarch64"))
        rootfs, site = args.rootfs or rootfs, args.site or site
    try:
        p = json.loads(_read(os.path.join(work, "bench-provenance.json")))
        changed = "; ".join(line.strip() for line in p["cython_ext"].splitlines()) or "(clean)"
        provenance = f"commit {p['commit'][:12]}, git status --short cython_ext: {changed}"
    except (OSError, ValueError, KeyError):
        provenance = "built outside the bench (commit unknown)"
    return DualPathBuild(install, rootfs, site, provenance)


# -- running under QEMU ----------------------------------------------------------------

@dataclass
class Count:
    """One qemu-aarch64 run: the instructions it executed, and what the program reported."""
    insns: int
    threads: int
    info: dict
    functions: dict[str, int] = field(default_factory=dict)
    """With the breakdown: ``file:function`` -> instructions."""


class IllegalInstruction(ArmBenchError):
    """The guest died with SIGILL: the build uses an extension the CPU model lacks."""


def run_qemu(cpu: str, argv: list[str], plugin: str, workdir: str, breakdown: bool, rootfs: str | None = None,
             env: dict | None = None) -> tuple[subprocess.CompletedProcess, int, int, dict[int, int]]:
    """Run ``argv`` under ``qemu-aarch64 -cpu cpu`` with the counting plugin; return the process,
    the instructions, the guest threads and (breakdown) the instructions per block address."""
    qemu = need_tool("qemu-aarch64", "qemu-user")
    counts = os.path.join(workdir, "counts.txt")
    if os.path.exists(counts):
        os.remove(counts)
    cmd = [qemu, *(["-L", rootfs] if rootfs else []), "-cpu", cpu,
           "-plugin", f"{plugin},out={counts},mode={'tbs' if breakdown else 'total'}", *argv]
    if shutil.which("setarch"):  # host ASLR moves guest mappings, and with them a few hashes and paths
        cmd = ["setarch", "-R", *cmd]

    def no_core():  # a guest killed by SIGILL would leave a core file of its whole address space
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env, timeout=TIMEOUT_S,
                              preexec_fn=no_core)
    except subprocess.TimeoutExpired:
        raise ArmBenchError(f"qemu-aarch64 -cpu {cpu} {os.path.basename(argv[0])} did not finish in "
                            f"{TIMEOUT_S:g} s") from None
    if proc.returncode == -signal.SIGILL or "uncaught target signal 4 " in proc.stderr:
        raise IllegalInstruction(f"{os.path.basename(argv[0])} died with SIGILL under -cpu {cpu}")
    if proc.returncode != 0:
        raise BenchProcessError(f"qemu-aarch64 -cpu {cpu} {' '.join(os.path.basename(a) for a in argv[:2])} exited "
                                f"with status {proc.returncode}; its stderr ends:\n{stderr_tail(proc.stderr)}")
    insns, threads, tbs = _read_counts(counts)
    return proc, insns, threads, tbs


def _read_counts(path: str) -> tuple[int, int, dict[int, int]]:
    insns = threads = 0
    tbs: dict[int, int] = {}
    try:
        with open(path) as f:
            for line in f:
                k, *v = line.split()
                if k == "tb":
                    tbs[int(v[0], 16)] = int(v[1])
                elif k == "insns":
                    insns = int(v[0])
                elif k == "threads":
                    threads = int(v[0])
    except OSError as e:
        raise ArmBenchError(f"the QEMU plugin wrote no counts ({e}): was it loaded?") from None
    return insns, threads, tbs


# -- attributing counts to functions ---------------------------------------------------

@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    offset: int
    path: str


def _read_maps(path: str) -> list[_Mapping]:
    """The executable mappings of a /proc/PID/maps copy, by start address."""
    maps = []
    with open(path) as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 5 or "x" not in parts[1]:
                continue
            start, end = (int(a, 16) for a in parts[0].split("-"))
            maps.append(_Mapping(start, end, int(parts[2], 16), parts[5].strip() if len(parts) > 5 else ""))
    return sorted(maps, key=lambda m: m.start)


def _elf_loads(path: str) -> list[tuple[int, int, int]]:
    """(file offset, file size, virtual address) of each PT_LOAD of a little-endian ELF64 file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ArmBenchError(f"{path} is not a little-endian 64-bit ELF file")
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    loads = []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_offset, p_filesz, p_vaddr))
    return loads


def _short_name(name: str) -> str:
    """A demangled C++ name without its parameter list (templates arguments kept)."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] or name
    return name


class Symbols:
    """The function symbols of the files guest runs mapped, read once per file with
    ``aarch64-linux-gnu-nm`` (the static table, or the dynamic one of a stripped file)."""

    def __init__(self):
        self.nm = need_tool("aarch64-linux-gnu-nm", "binutils-aarch64-linux-gnu")
        self._files: dict[str, tuple] = {}

    def _load(self, path: str) -> tuple:
        if path not in self._files:
            loads, syms = _elf_loads(path), []
            for dynamic in ([], ["-D"]):
                out = subprocess.run([self.nm, "--defined-only", "-S", "-C", *dynamic, path], capture_output=True,
                                     text=True).stdout
                for line in out.splitlines():
                    parts = line.split(" ", 3)
                    if len(parts) == 4 and parts[2] in "TtWwi" and len(parts[2]) == 1:
                        syms.append((int(parts[0], 16), int(parts[1], 16), _short_name(parts[3].split("@")[0])))
                    elif len(parts) >= 3 and parts[1] in "TtWwi" and len(parts[1]) == 1:
                        syms.append((int(parts[0], 16), 0, _short_name(" ".join(parts[2:]).split("@")[0])))
                if syms:
                    break
            syms.sort()
            self._files[path] = (loads, [s[0] for s in syms], syms)
        return self._files[path]

    def function(self, path: str, file_offset: int) -> str:
        """The function at ``file_offset`` of ``path``, or ``?``."""
        loads, addrs, syms = self._load(path)
        vaddr = next((file_offset - off + va for off, size, va in loads if off <= file_offset < off + size), None)
        if vaddr is None:
            return "?"
        i = bisect.bisect_right(addrs, vaddr) - 1
        if i >= 0 and (syms[i][1] == 0 or vaddr < syms[i][0] + syms[i][1]):
            return syms[i][2]
        return "?"

    def attribute(self, tbs: dict[int, int], maps_path: str, rootfs: str | None) -> dict[str, int]:
        """``file:function`` -> instructions, for the per-block counts of one run."""
        maps = _read_maps(maps_path)
        starts = [m.start for m in maps]
        out: dict[str, int] = {}
        for addr, n in tbs.items():
            i = bisect.bisect_right(starts, addr) - 1
            if i < 0 or addr >= maps[i].end:
                key = "[unmapped at exit]"
            elif not maps[i].path.startswith("/"):
                key = f"[{maps[i].path.strip('[]') or 'anonymous'}]"
            else:
                m = maps[i]
                path = m.path if os.path.exists(m.path) or not rootfs else rootfs + m.path
                key = f"{os.path.basename(m.path)}:{self.function(path, addr - m.start + m.offset)}"
            out[key] = out.get(key, 0) + n
        return out


# -- the engines -----------------------------------------------------------------------

class DualPathRunner:
    """DualPath's guest worker under QEMU, one run per count."""

    def __init__(self, build: DualPathBuild, model: str, plugin: str, workdir: str, models_cache: str,
                 kernel_isa: str, disable_cpu_features: str, symbols: Symbols):
        self.build, self.model, self.plugin, self.workdir = build, os.path.abspath(model), plugin, workdir
        self.kernel_isa, self.symbols = kernel_isa, symbols
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        # numpy's OpenBLAS starts a worker per core at import, which would both count and race
        # with the main thread's counts: one thread in all.
        env.update(PYTHONPATH=f"{build.install}:{build.site}", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
                   DUALPATH_CACHE_DIR=models_cache, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        env.pop("DUALPATH_DISABLE_CPU_FEATURES", None)
        if disable_cpu_features:
            env["DUALPATH_DISABLE_CPU_FEATURES"] = disable_cpu_features
        self.env = env

    def count(self, cpu: str, prompt_ids: list[int] | None, num_generate: int, breakdown: bool) -> Count:
        """One run; a run that converted the model (no cache entry for this CPU model yet) is
        run again, so that the two runs of a difference load alike."""
        c = self._count(cpu, prompt_ids, num_generate, breakdown)
        return c if c.info.get("cache") == "hit" else self._count(cpu, prompt_ids, num_generate, breakdown)

    def tokenize(self, cpu: str, text: str, num_prompt_tokens: int) -> list[int]:
        """The first ``num_prompt_tokens`` ids of ``text`` by DualPath's tokenizer, from a run
        that also fills the converted-model cache the counted runs load from."""
        return self._count(cpu, None, 1, False, text, num_prompt_tokens).info["prompt_ids"]

    def _count(self, cpu, prompt_ids, num_generate, breakdown, text="", num_prompt_tokens=0) -> Count:
        result, maps = os.path.join(self.workdir, "result.json"), os.path.join(self.workdir, "maps.txt")
        kwargs = {"model": self.model, "num_generate": num_generate, "n_ctx": N_CTX,
                  "kernel_isa": self.kernel_isa, "prompt_ids": prompt_ids, "text": text,
                  "num_prompt_tokens": num_prompt_tokens, "maps_out": maps if breakdown else ""}
        python = os.path.join(self.build.rootfs, "usr", "bin", "python3.11")
        _, insns, threads, tbs = run_qemu(cpu, [python, WORKER, json.dumps(kwargs), result], self.plugin,
                                          self.workdir, breakdown, self.build.rootfs, self.env)
        info = json.loads(_read(result))
        functions = self.symbols.attribute(tbs, maps, self.build.rootfs) if breakdown else {}
        return Count(insns, threads, info, functions)


class LlamaRunner:
    """The static llama.cpp driver under QEMU, one run per count."""

    def __init__(self, build: LlamaBuild, model: str, plugin: str, workdir: str, flash_attn: str,
                 symbols: Symbols):
        self.build, self.model, self.plugin, self.workdir = build, os.path.abspath(model), plugin, workdir
        self.flash_attn, self.symbols = flash_attn, symbols

    def count(self, cpu: str, prompt_ids: list[int], num_generate: int, breakdown: bool) -> Count:
        ids, maps = os.path.join(self.workdir, "ids.txt"), os.path.join(self.workdir, "maps.txt")
        with open(ids, "w") as f:
            f.write(" ".join(map(str, prompt_ids)) + "\n")
        argv = [self.build.binary, self.model, ids, str(num_generate), self.flash_attn, str(N_CTX),
                *([maps] if breakdown else [])]
        proc, insns, threads, tbs = run_qemu(cpu, argv, self.plugin, self.workdir, breakdown)
        info = {"prompt_ids": list(prompt_ids)}
        for line in proc.stdout.splitlines():
            if line.startswith("system_info: "):
                info["system_info"] = line[len("system_info: "):].strip()
            elif line.startswith("ids:"):
                info["ids"] = [int(t) for t in line[4:].split()]
        functions = self.symbols.attribute(tbs, maps, None) if breakdown else {}
        return Count(insns, threads, info, functions)


# -- the method ------------------------------------------------------------------------

def per_token(count, cpu: str, prompt_ids: list[int], lengths: dict, breakdown: bool) -> dict:
    """Instructions per generated and per prompt token of one engine under ``cpu``, from
    four runs: (short prompt, short and long generation), (short and long prompt, 1 token)."""
    (ds, dl), (ps, pl) = lengths["decode"], lengths["prompt"]
    runs = {"decode_short": count(cpu, prompt_ids[:ps], ds, breakdown),
            "decode_long": count(cpu, prompt_ids[:ps], dl, breakdown),
            "prompt_short": count(cpu, prompt_ids[:ps], 1, breakdown),
            "prompt_long": count(cpu, prompt_ids[:pl], 1, breakdown)}

    def diff(long: Count, short: Count, n: int) -> tuple[float, dict[str, float]]:
        keys = set(long.functions) | set(short.functions)
        functions = {k: (long.functions.get(k, 0) - short.functions.get(k, 0)) / n for k in keys}
        return (long.insns - short.insns) / n, functions

    decode, decode_functions = diff(runs["decode_long"], runs["decode_short"], dl - ds)
    prompt, prompt_functions = diff(runs["prompt_long"], runs["prompt_short"], pl - ps)
    return {"decode_insns_per_token": decode, "prompt_insns_per_token": prompt,
            "decode_functions": decode_functions, "prompt_functions": prompt_functions,
            "threads": max(r.threads for r in runs.values()), "info": runs["decode_long"].info,
            "runs": {k: r.insns for k, r in runs.items()}}


# -- the report ------------------------------------------------------------------------

def _m(insns: float | None) -> str:
    return "n/a (SIGILL)" if insns is None else f"{insns / 1e6:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def print_table(cpu: str, rows: list[dict], model: str, lengths: dict) -> None:
    (ds, dl), (ps, pl) = lengths["decode"], lengths["prompt"]
    print(f"\n== qemu-aarch64 -cpu {cpu}: M instructions per token, 1 thread, greedy, {os.path.basename(model)}")
    print(f"   per decoded token = (generate {dl} - generate {ds}) / {dl - ds} after a {ps}-token prompt; "
          f"per prompt token = ({pl}-token - {ps}-token prompt) / {pl - ps}")
    peers = {r["build"]: r for r in rows if r["engine"] == "llama.cpp"}
    phone, base = peers.get("phone", {}), peers.get("baseline", {})
    print(f"{'engine / build':<28} {'decoded':>13} {'prompt':>13}   {'decoded / phone':>15} {'/ baseline':>10}   "
          f"{'prompt / phone':>14} {'/ baseline':>10}")
    for r in rows:
        d, p = r.get("decode_insns_per_token"), r.get("prompt_insns_per_token")
        dr = [_ratio(d, peer.get("decode_insns_per_token")) for peer in (phone, base)]
        pr = [_ratio(p, peer.get("prompt_insns_per_token")) for peer in (phone, base)]
        print(f"{r['label']:<28} {_m(d):>13} {_m(p):>13}   {dr[0]:>15} {dr[1]:>10}   {pr[0]:>14} {pr[1]:>10}")
    for r in rows:
        info = r.get("info") or {}
        if r["engine"] == "dualpath":
            print(f"  DualPath kernels: {info.get('default_kernel')} (available: "
                  f"{', '.join(info.get('available_kernels', []))}; CPU features: "
                  f"{', '.join(info.get('cpu_features', [])) or 'none'}; runtime.kernel_isa="
                  f"{info.get('kernel_isa')}; DUALPATH_DISABLE_CPU_FEATURES={info.get('disabled') or '(unset)'})")
            print(f"  DualPath build: {r['provenance']}")
        else:
            print(f"  llama.cpp {r['build']}: {r['flags']}")
            if info.get("system_info"):
                print(f"    system_info: {info['system_info']}")
        if r.get("error"):
            print(f"  {r['label']}: {r['error']} (no figures)")
        if r.get("threads", 1) > 1:
            print(f"  {r['label']}: the guest started {r['threads']} threads; the counts are exact while one runs "
                  "at a time")
    _print_agreement(rows)


def _print_agreement(rows: list[dict]) -> None:
    """How many greedy ids DualPath's longest run shares with each llama.cpp build's (a check
    that both ran the same model on the same prompt, not a quality figure)."""
    ours = next((r for r in rows if r["engine"] == "dualpath" and r.get("info")), None)
    if ours is None:
        return
    for r in rows:
        if r["engine"] == "llama.cpp" and (r.get("info") or {}).get("ids"):
            a, b = ours["info"]["ids"], r["info"]["ids"]
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  greedy ids: DualPath and llama.cpp {r['build']} agree on the first {same} of {len(a)}")


def print_breakdown(cpu: str, rows: list[dict], top: int) -> None:
    for r in rows:
        for phase in ("decode", "prompt"):
            functions, total = r.get(f"{phase}_functions"), r.get(f"{phase}_insns_per_token")
            if not functions or not total:
                continue
            ours = sum(v for k, v in functions.items() if k.startswith(OUR_KERNEL_FILES))
            extra = f"; in DualPath's extensions {100 * ours / total:.1f}%" if r["engine"] == "dualpath" else ""
            print(f"\n  -cpu {cpu}, {r['label']}, per {'decoded' if phase == 'decode' else phase} token: "
                  f"{total / 1e6:.1f} M{extra}")
            for key, v in sorted(functions.items(), key=lambda kv: -kv[1])[:top]:
                file, _, function = key.partition(":")
                function = "? (no symbol)" if function == "?" else function
                where = file if function else ""
                print(f"    {v / 1e6:9.2f} M {100 * v / total:5.1f}%  {function or file:<48.48} {where}")


def measure_cpu(cpu: str, runners: list[tuple[dict, Any]], prompt_ids: list[int], lengths: dict,
                breakdown: bool) -> list[dict]:
    """One row per engine under ``cpu``; a build the CPU model cannot run is a row without figures."""
    rows = []
    for row, runner in runners:
        print(f"dualpath bench arm: -cpu {cpu}: {row['label']}", file=sys.stderr)
        try:
            measured = per_token(runner.count, cpu, prompt_ids, lengths, breakdown)
            if row["engine"] == "dualpath":  # the kernels it chose on this CPU model name its row
                row = dict(row, label=f"{row['label']} {measured['info']['default_kernel']}")
            rows.append({**row, "cpu": cpu, **measured})
        except IllegalInstruction as e:
            built = f" (built for {row['arch']})" if row.get("arch") else ""
            rows.append({**row, "cpu": cpu, "error": f"{e}{built}"})
    return rows


def cmd_bench_arm(args) -> int:
    lengths = QUICK_LENGTHS if args.quick else FULL_LENGTHS
    cpus = ["max"] if args.quick else (args.cpu or list(CPU_MODELS))
    names = [] if args.no_peer else ["baseline"] if args.quick else (args.llama_builds or list(LLAMA_BUILDS))
    unknown = [n for n in names if n not in LLAMA_BUILDS]
    if unknown:
        raise ArmBenchError(f"--llama-builds {','.join(unknown)}: the builds are {', '.join(LLAMA_BUILDS)}")
    need_tool("qemu-aarch64", "qemu-user")
    cache = os.path.abspath(args.cache_dir)
    plugin = build_plugin(cache)
    llamas = [build_llama(cache, n, LLAMA_BUILDS[n], args.jobs) for n in names]
    dp = dualpath_build(args, cache)
    symbols = Symbols()
    with tempfile.TemporaryDirectory(prefix="dualpath-bench-arm-") as work:
        dualpath = DualPathRunner(dp, args.model, plugin, work, os.path.join(cache, "dualpath-models"),
                                  args.kernel_isa, args.disable_cpu_features, symbols)
        print(f"dualpath bench arm: -cpu {cpus[0]}: DualPath tokenizes the prompt (and converts the model once)",
              file=sys.stderr)
        prompt_ids = dualpath.tokenize(cpus[0], PROMPT_TEXT, lengths["prompt"][1])
        label = "DualPath" + (f" (kernels {args.kernel_isa})" if args.kernel_isa != "auto" else "")
        runners: list[tuple[dict, Any]] = [({"engine": "dualpath", "label": label, "provenance": dp.provenance},
                                             dualpath)]
        runners += [({"engine": "llama.cpp", "label": f"llama.cpp {b.name}", "build": b.name, "arch": b.arch,
                      "flags": b.flags}, LlamaRunner(b, args.model, plugin, work, args.flash_attn, symbols))
                    for b in llamas]
        results = {}
        for cpu in cpus:
            rows = results[cpu] = measure_cpu(cpu, runners, prompt_ids, lengths, not args.no_breakdown)
            print_table(cpu, rows, args.model, lengths)
            if not args.no_breakdown:
                print_breakdown(cpu, rows, args.top)
            sys.stdout.flush()
    write_json(args.json, {"model": args.model, "lengths": lengths, "prompt_ids": prompt_ids,
                           "flash_attn": args.flash_attn, "results": results})
    return 0


def add_parser(bs) -> None:
    s = bs.add_parser("arm", help="instructions per token on aarch64 under qemu-aarch64, DualPath beside llama.cpp "
                                  "(run from a checkout: builds with android/check_aarch64.sh)",
                      description="Counts the instructions executed per generated and per prompt token, one "
                                  "thread, greedy, under qemu-aarch64 -cpu max, cortex-a76 and cortex-a53, with a QEMU "
                                  "plugin of ours: DualPath (its aarch64 build by android/check_aarch64.sh, which "
                                  "this runs when invoked from a checkout, or --aarch64-work) beside llama.cpp built "
                                  "static for a phone (armv8.2-a+dotprod+fp16+i8mm) and for baseline armv8-a. Needs "
                                  "qemu-user, gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, cmake and (to build "
                                  "the userland) debootstrap.")
    s.add_argument("-m", "--model", required=True, help="GGUF file")
    s.add_argument("--quick", action="store_true",
                   help="short prompts and generations, -cpu max only, DualPath and llama.cpp baseline (for CI)")
    s.add_argument("--cpu", action="append", choices=CPU_MODELS, help="a QEMU CPU model (repeat; default: all three)")
    s.add_argument("--llama-builds", type=lambda v: v.split(","), metavar="phone,baseline",
                   help="the llama.cpp builds to run (default: both)")
    s.add_argument("--no-peer", action="store_true", help="measure DualPath only (no llama.cpp build or run)")
    s.add_argument("--flash-attn", choices=("on", "off", "auto"), default="on",
                   help="llama.cpp's flash attention (default on; auto turns it on for the CPU)")
    s.add_argument("--kernel-isa", "--attention-kernel", dest="kernel_isa", default="auto",
                   help="DualPath's runtime.kernel_isa (auto: the best the CPU model has)")
    s.add_argument("--disable-cpu-features", default="",
                   help="DUALPATH_DISABLE_CPU_FEATURES for DualPath's runs, e.g. neon_fp16")
    s.add_argument("--aarch64-work", help="the WORK folder an earlier android/check_aarch64.sh printed (with "
                                          "DUALPATH_AARCH64_KEEP=1); default: run that script now")
    s.add_argument("--rootfs", help="the arm64 userland (default: the newest in ~/.cache/dualpath-ci/aarch64)")
    s.add_argument("--site", help="its aarch64 wheels folder (default: the one of the same key)")
    s.add_argument("--cache-dir", default=DEFAULT_CACHE,
                   help="where the plugin, the llama.cpp builds and DualPath's converted model are kept "
                        "(default ~/.cache/dualpath-bench)")
    s.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="compile jobs for llama.cpp")
    s.add_argument("--no-breakdown", action="store_true", help="totals only (no per-function attribution)")
    s.add_argument("--top", type=int, default=8, help="functions listed per engine and phase (default 8)")
    s.add_argument("--json", help="also write every row, run and function count as JSON here")
    s.set_defaults(func=cmd_bench_arm)
