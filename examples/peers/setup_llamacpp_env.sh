#!/bin/sh
# Make a Python environment with llama-cpp-python built from source for one target: the
# llama.cpp peer of `dualpath bench e2e|quality|startup` at its best on this machine.
#
#   examples/peers/setup_llamacpp_env.sh full [ENV_DIR]      (default ./llama-full-venv)
#   examples/peers/setup_llamacpp_env.sh laptop [ENV_DIR]    (default ./llama-laptop-venv)
#   dualpath bench e2e -m model.gguf --peer-python llama-full-venv/bin/python
#   dualpath bench e2e -m model.gguf --isa laptop --peer-python llama-laptop-venv/bin/python
#   (or export DUALPATH_LLAMACPP_PYTHON / DUALPATH_LLAMACPP_LAPTOP_PYTHON)
#
# full:   every x86 extension ggml builds for that /proc/cpuinfo lists (AVX-512 with its
#         VBMI, VNNI and BF16 where present), never AMX: no phone or laptop has AMX, and
#         native builds with AMX crashed on Q8_0/Q4_0 files on Intel machines here.
# laptop: AVX2, FMA, F16C, BMI2, and AVX-VNNI where the CPU has it; no AVX-512, no AMX
#         (Intel's hybrid laptops). AVX-VNNI is left out on a CPU without it: a build with
#         it would die there with SIGILL.
# On a CPU that is not x86-64, `full` builds for the machine itself (GGML_NATIVE).
#
# pip caches a built wheel by version, not by CMAKE_ARGS, so a wheel built earlier with
# other flags would come back: --no-cache-dir and --no-binary make it build from source
# with these flags every time. The build takes minutes (docs/performance.md, "Peers").
# PYTHON picks the interpreter the venv is made from (default python3). LLAMA_CPP_SPEC
# picks the version (default: the llama-cpp-python PYTHON has, else the newest).
# The script ends with the build's check (sdk/dualpath/bench/_llamacpp_worker.py check):
# it prints llama.cpp's system info line and fails if the build is not the target's.
set -eu

TARGET=${1:-}
case "$TARGET" in
    full|laptop) ;;
    *) echo "usage: $0 full|laptop [ENV_DIR]" >&2; exit 2 ;;
esac
ENV_DIR=${2:-llama-$TARGET-venv}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
CHECK="$HERE/../../sdk/dualpath/bench/_llamacpp_worker.py"

FLAGS=$(grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true)
has() { case " $FLAGS " in *" $1 "*) return 0 ;; esac; return 1; }
on_if() { if has "$1"; then echo "-D$2=ON"; else echo "-D$2=OFF"; fi; }

ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
case "$(uname -m)" in
    x86_64|amd64)
        # GGML_NATIVE=OFF: -march=native would turn AMX on where the CPU has it.
        ARGS="$ARGS -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
        ARGS="$ARGS $(on_if avx GGML_AVX) $(on_if avx2 GGML_AVX2) $(on_if fma GGML_FMA) $(on_if f16c GGML_F16C)"
        ARGS="$ARGS $(on_if bmi2 GGML_BMI2) $(on_if sse4_2 GGML_SSE42) $(on_if avx_vnni GGML_AVX_VNNI)"
        if [ "$TARGET" = full ]; then
            ARGS="$ARGS $(on_if avx512f GGML_AVX512) $(on_if avx512vbmi GGML_AVX512_VBMI)"
            ARGS="$ARGS $(on_if avx512_vnni GGML_AVX512_VNNI) $(on_if avx512_bf16 GGML_AVX512_BF16)"
        else
            ARGS="$ARGS -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
        fi
        ;;
    *)
        if [ "$TARGET" = laptop ]; then
            echo "setup_llamacpp_env: the laptop target is an x86-64 one (AVX2, no AVX-512); this is $(uname -m)" >&2
            exit 2
        fi
        ARGS="$ARGS -DGGML_NATIVE=ON"
        ;;
esac

if [ -z "${LLAMA_CPP_SPEC:-}" ]; then
    VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))" 2>/dev/null || true)
    LLAMA_CPP_SPEC="llama-cpp-python${VERSION:+==$VERSION}"
fi

"$PYTHON" -m venv "$ENV_DIR"
PY="$ENV_DIR/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true  # a build an earlier run left here
echo "setup_llamacpp_env: building $LLAMA_CPP_SPEC ($TARGET) with CMAKE_ARGS=$ARGS"
START=$(date +%s)
CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$PY" -m pip install -q --no-cache-dir --no-binary llama-cpp-python "$LLAMA_CPP_SPEC"
echo "setup_llamacpp_env: built and installed in $(( $(date +%s) - START )) s"
"$PY" "$CHECK" check "$TARGET"
echo "setup_llamacpp_env: ready: --peer-python $PY"
