#!/bin/sh
# Make a Python environment for onnxruntime-genai, the third engine of
# `dualpath bench e2e` (its onnxruntime pin may differ from ours and its model
# builder imports torch, so it gets a virtualenv of its own):
#
#   examples/peers/setup_ortgenai_env.sh [ENV_DIR]          (default ./ortg-venv)
#   dualpath bench e2e -m model.gguf --ortgenai-python ENV_DIR/bin/python
#   (or export DUALPATH_ORTGENAI_PYTHON=ENV_DIR/bin/python)
#
# PYTHON picks the interpreter the venv is made from (default python3).
# TORCH_SPEC installs torch from a wheel file or requirement of your choice.
#
# torch only serves the builder on the CPU, so a CPU build is wanted. PyPI's Linux
# wheel is the CUDA build: it pulls several GB of nvidia-* packages, and installed
# with --no-deps it fails at import (libcudnn.so.9 missing). In order, this tries:
#   1. TORCH_SPEC, when set;
#   2. PyTorch's CPU index (download.pytorch.org/whl/cpu);
#   3. a +cpu version among those pip can see (a mirror, --find-links);
#   4. PyPI's wheel with its CUDA packages (works on the CPU, several GB).
# Each is kept only if `import torch` then works.
#
# Measured on the 2-core x86-64 test machine (Python 3.11.7; download.pytorch.org does
# not resolve there, so step 2 took the CUDA 2.14.1 wheel from a mirror, which failed
# to import; step 3 found a torch-2.13.0+cpu wheel in pip's find-links): 87 s, 1.4 GB;
# torch 2.13.0+cpu, onnxruntime-genai 0.18.0, onnxruntime 1.32.0, transformers 5.25.0,
# onnx 1.23.2, onnx-ir 1.1.0, gguf 0.19.0, numpy 2.4.6.
set -eu

ENV_DIR=${1:-ortg-venv}
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$ENV_DIR"
PY="$ENV_DIR/bin/python"
PIP="$PY -m pip"
$PIP install --upgrade pip

# torch's small pure-Python dependencies (a --no-deps install leaves them out)
TORCH_DEPS="filelock typing-extensions sympy networkx jinja2 fsspec setuptools>=77.0.3"
torch_imports() { "$PY" -c "import torch" >/dev/null 2>&1; }

if [ -n "${TORCH_SPEC:-}" ]; then
    $PIP install --no-deps "$TORCH_SPEC"
else
    # may also take a CUDA wheel from another configured index: checked by torch_imports
    $PIP install --no-deps torch --index-url https://download.pytorch.org/whl/cpu || true
fi
$PIP install $TORCH_DEPS
if ! torch_imports; then
    CPU_VERSION=$($PIP index versions torch 2>/dev/null | tr ' ,' '\n\n' | grep -E '^[0-9.]+\+cpu$' | head -n 1 || true)
    if [ -n "$CPU_VERSION" ]; then
        echo "setup_ortgenai_env: installing torch==$CPU_VERSION (a CPU build pip can see)"
        $PIP install --no-deps --force-reinstall "torch==$CPU_VERSION"
    fi
fi
if ! torch_imports; then
    echo "setup_ortgenai_env: no CPU build of torch found; installing PyPI's (with its CUDA packages, several GB)"
    $PIP install --force-reinstall torch
fi

$PIP install onnxruntime-genai onnx onnx-ir transformers gguf numpy
"$PY" -c "import torch, onnxruntime_genai as og, onnxruntime_genai.models.builder; \
print('onnxruntime-genai', og.__version__, 'torch', torch.__version__, 'ready:', '$PY')"
