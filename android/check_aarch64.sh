#!/usr/bin/env bash
# The whole DualPath pipeline on aarch64, under QEMU user-mode emulation:
#
#  1. an arm64 Debian bookworm userland (debootstrap --foreign, packages unpacked,
#     nothing configured: Python needs no more) with Python 3.11 and its headers;
#  2. aarch64 wheels from PyPI for numpy, onnxruntime, onnx, gguf, ... (pip --platform):
#     onnxruntime is pinned to 1.24.1 for this check only, and to 1.20.1 (our minimum, Termux's oldest) for a
#     second golden run (1.32 dies at import under
#     QEMU 7.2), and ORT's aarch64 build is a different
#     build of MLAS from the x86 one we ship with;
#  3. DualPath's extensions cross-compiled from this checkout with setup.py
#     (aarch64-linux-gnu-gcc against the userland's Python headers), installed with
#     the package's Python files into a folder the userland's Python imports from.
#     (Not compiled inside the userland: gcc execs cc1/as/ld, and without binfmt_misc,
#     which a container here cannot register, qemu-user cannot run a child process);
#  4. the golden end-to-end tests on the real test model (stories260K: its run.c greedy
#     ids) with every ARM kernel forced (neon_i8mm, neon_dotprod, neon_fp16, neon, generic)
#     and f32 and f16 KV under `-cpu max`, and the Q4_K_M model's logits against the host's
#     with each of them forced; then under `-cpu cortex-a76` (dotprod, no i8mm) and
#     `-cpu cortex-a53` (no FP16, no dotprod): dispatch must fall back, never die with
#     SIGILL, and forcing a kernel the CPU lacks is a clear error.
#     Graphs are built by onnx on aarch64 and ONNX Runtime runs them there.
#
# Prints `aarch64 golden: N/N` last (passed / run). Exits 0 with a "skipped:" line when
# QEMU, debootstrap or the cross compiler are missing and cannot be installed.
# The userland and wheels are cached in $DUALPATH_AARCH64_CACHE (default
# ~/.cache/dualpath-ci/aarch64) between runs on one machine.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE=${DUALPATH_AARCH64_CACHE:-$HOME/.cache/dualpath-ci/aarch64}
ORT_VERSION=1.24.1
# Termux's python-onnxruntime has moved between 1.20.2 and 1.29 (termux-packages'
# build.sh); 1.20.1, our declared minimum, is the nearest aarch64 wheel on PyPI to the
# oldest of them: the golden cases run on it too.
ORT_TERMUX=1.20.1
packages() { echo "onnxruntime==$1 numpy<2.3 gguf pyyaml jinja2 onnx ml_dtypes<0.7 tokenizers pytest"; }
PACKAGES=$(packages $ORT_VERSION)
KEY=$(echo "bookworm python3.11 $PACKAGES" | sha1sum | cut -c1-12)
ROOT=$CACHE/rootfs-$KEY
SITE=$CACHE/site-$KEY
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dualpath-aarch64.XXXXXX")
[ -n "${DUALPATH_AARCH64_KEEP:-}" ] || trap 'rm -rf "$WORK"' EXIT  # KEEP=1: leave the build for debugging
export DUALPATH_TEST_MODELS="${DUALPATH_TEST_MODELS:-$(cd "$REPO/.." && pwd)/shared/models}"
PY=${PYTHON:-python3}
t_start=$(date +%s)

skip() { echo "aarch64 check skipped: $*"; exit 0; }

# -- tools --------------------------------------------------------------------------
need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "== installing ${need[*]}"
        apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
            || skip "could not install ${need[*]} with apt-get"
    else
        skip "${need[*]} missing and cannot be installed here (needs apt-get as root)"
    fi
fi
DEBOOTSTRAP=$(command -v debootstrap || echo /usr/sbin/debootstrap)
[ -f "$DUALPATH_TEST_MODELS/stories260K.gguf" ] || skip "test model not found in $DUALPATH_TEST_MODELS"
$PY -c "import Cython, numpy, setuptools" 2>/dev/null || $PY -m pip install -q Cython numpy setuptools

# -- 1. the arm64 userland (cached) -------------------------------------------------
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    echo "== debootstrap: arm64 bookworm userland with Python 3.11 into $ROOT"
    rm -rf "$ROOT.tmp"
    mkdir -p "$CACHE"
    "$DEBOOTSTRAP" --foreign --arch=arm64 --variant=minbase --include=python3.11,libpython3.11-dev \
        bookworm "$ROOT.tmp" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap.log"; skip "debootstrap failed (no access to deb.debian.org?)"; }
    # The second stage would configure packages inside a chroot; running Python under
    # qemu-aarch64 -L needs only their files.
    for deb in "$ROOT.tmp"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT.tmp"; done
    rm -f "$ROOT.tmp"/var/cache/apt/archives/*.deb
    mv "$ROOT.tmp" "$ROOT"
fi
run_arm() { # $1 = QEMU cpu model, rest: python arguments
    local cpu=$1; shift
    PYTHONPATH="$WORK/install:$SITE" PYTHONDONTWRITEBYTECODE=1 \
        qemu-aarch64 -L "$ROOT" -cpu "$cpu" "$ROOT/usr/bin/python3.11" "$@"
}

# -- 2. aarch64 wheels (cached) -----------------------------------------------------
wheels() { # $1 = site folder, rest: packages
    local site=$1; shift
    [ -f "$site/.complete" ] && return
    echo "== pip: aarch64 wheels ($*)"
    rm -rf "$site"
    local plats=()
    for p in manylinux2014_aarch64 manylinux_2_17_aarch64 manylinux_2_27_aarch64 manylinux_2_28_aarch64 \
             manylinux_2_31_aarch64 manylinux_2_34_aarch64 any; do plats+=(--platform "$p"); done
    $PY -m pip install -q --target "$site" --only-binary=:all: --python-version 3.11 --implementation cp \
        --abi cp311 "${plats[@]}" "$@"
    touch "$site/.complete"
}
# shellcheck disable=SC2046
wheels "$SITE" $PACKAGES
SITE_TERMUX=$CACHE/site-$(echo "bookworm python3.11 $(packages $ORT_TERMUX)" | sha1sum | cut -c1-12)
# shellcheck disable=SC2046
wheels "$SITE_TERMUX" $(packages $ORT_TERMUX)

# -- 3. DualPath, cross-compiled from this checkout ---------------------------------
echo "== building DualPath's extensions for aarch64 (setup.py, aarch64-linux-gnu-gcc)"
# Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>: a folder that
# holds only that path (not the userland's whole /usr/include, which would shadow the
# cross compiler's own C library headers).
mkdir -p "$WORK/include"
ln -s "$ROOT/usr/include/aarch64-linux-gnu" "$WORK/include/aarch64-linux-gnu"
(
    export DUALPATH_TARGET_MACHINE=aarch64 CC=aarch64-linux-gnu-gcc AR=aarch64-linux-gnu-ar \
           LDSHARED="aarch64-linux-gnu-gcc -shared"
    $PY setup.py -q build_clib --build-temp "$WORK/tmp" \
        build_ext --build-temp "$WORK/tmp" --build-lib "$WORK/lib" \
        --include-dirs "$ROOT/usr/include/python3.11:$WORK/include" \
        >"$WORK/build.log" 2>&1 || { tail -n 30 "$WORK/build.log"; exit 1; }
)
mkdir -p "$WORK/install"
cp -r sdk/dualpath "$WORK/install/"
find "$WORK/install/dualpath" \( -name "*.so" -o -name "__pycache__" \) -prune -exec rm -rf {} +
for so in "$WORK"/lib/dualpath/*.so; do
    base=$(basename "$so"); base=${base%%.cpython-*}
    cp "$so" "$WORK/install/dualpath/$base.cpython-311-aarch64-linux-gnu.so"
done
file "$WORK"/install/dualpath/*.so | sed "s|$WORK/install/||"
run_arm max -c "import platform, dualpath.kernels as k, onnxruntime as ort, numpy as np
print('==', platform.machine(), 'python', platform.python_version(), 'onnxruntime', ort.__version__,
      'numpy', np.__version__, 'kernels', k.available_kernels(), 'default', k.default_kernel())" 2>&1 \
    | grep -v "cpuid_info warning"

# -- 4. the golden runs -------------------------------------------------------------
passed=0
total=0
golden() { # $1 = cpu model, $2 = expected kernels, rest: pytest selection
    local cpu=$1 expect=$2; shift 2
    echo "== golden tests under qemu-aarch64 -cpu $cpu (kernels: $expect)"
    local kernels
    kernels=$(run_arm "$cpu" -c "import dualpath.kernels as k; print(' '.join(k.available_kernels()))" 2>/dev/null)
    [ "$kernels" = "$expect" ] || { echo "FAILED: available kernels '$kernels', expected '$expect'"; total=$((total + 1)); return; }
    local log="$WORK/pytest-$cpu.log" status=0
    (cd "$REPO" && run_arm "$cpu" -m pytest -q -p no:cacheprovider "$@") >"$log" 2>&1 || status=$?
    grep -v "cpuid_info warning" "$log" | tail -n 4
    local p f
    p=$( (grep -Eo "[0-9]+ passed" "$log" || true) | tail -n1 | cut -d' ' -f1); p=${p:-0}
    f=$( (grep -Eo "[0-9]+ (failed|error)" "$log" || true) | awk '{s += $1} END {print s + 0}')
    [ "$status" = 0 ] || [ "$f" -gt 0 ] || f=1  # a crash (SIGILL ...) counts as a failure
    passed=$((passed + p))
    total=$((total + p + f))
}
# A model of another family and a K-quant type: a synthetic Qwen2 in Q4_K_M (llama.cpp's
# quantizer, byte-level BPE), its logits on aarch64 against this host's.
CROSS=""
if $PY -c "import llama_cpp" 2>/dev/null; then
    $PY -m dualpath.cli synth --arch qwen2 --type Q4_K_M -o "$WORK/qwen2-tiny-q4_k_m.gguf" >/dev/null
    $PY tests/graph/test_cross_arch.py "$WORK/qwen2-tiny-q4_k_m.gguf" "$WORK/cross.json"
    export DUALPATH_CROSS_REFERENCE="$WORK/cross.json"
    CROSS=tests/graph/test_cross_arch.py
else
    echo "(no llama-cpp-python on the host to quantize the Q4_K_M model: the cross-architecture check is left out)"
fi
GOLDEN=tests/kernels/test_forced_isa_end_to_end.py
[ -n "${DUALPATH_AARCH64_ONLY_BUILD:-}" ] && { echo "$WORK"; exit 0; }
golden max "generic neon neon_fp16 neon_dotprod neon_i8mm" "$GOLDEN::test_golden_ids_with_each_forced_kernel" $CROSS
golden cortex-a76 "generic neon neon_fp16 neon_dotprod" "$GOLDEN::test_golden_ids_with_each_forced_kernel" \
    "$GOLDEN::test_forcing_a_kernel_this_cpu_lacks_is_a_clear_error"
golden cortex-a53 "generic neon" "$GOLDEN::test_golden_ids_with_each_forced_kernel" \
    "$GOLDEN::test_forcing_a_kernel_this_cpu_lacks_is_a_clear_error"
echo "== the same golden cases on onnxruntime $ORT_TERMUX (Termux's version)"
SITE=$SITE_TERMUX
run_arm max -c "import onnxruntime as ort; print('== onnxruntime', ort.__version__)" 2>&1 | grep -v "cpuid_info warning"
p0=$passed t0=$total
golden max "generic neon neon_fp16 neon_dotprod neon_i8mm" "$GOLDEN::test_golden_ids_with_each_forced_kernel"
echo "aarch64 golden on onnxruntime $ORT_TERMUX: $((passed - p0))/$((total - t0))"
echo "== $(( $(date +%s) - t_start )) s"
[ -z "${DUALPATH_AARCH64_KEEP:-}" ] || echo "== the build is kept in $WORK (dualpath bench arm --aarch64-work)"
echo "aarch64 golden: $passed/$total"
[ "$passed" = "$total" ] && [ "$total" -ge 6 ]
