#!/usr/bin/env bash
# Installs DualPath into Termux from this checkout, with no Rust toolchain and no cmake:
#
#   bash android/termux/install.sh                # the core: llama-vocabulary models, the CLI
#   bash android/termux/install.sh --with-server  # + the OpenAI-compatible server (pure Python)
#   bash android/termux/install.sh --with-bpe     # + tokenizers for byte-level BPE (gpt2) models:
#                                                 #   pkg install rust, then a long Rust build
#
# numpy and onnxruntime come from Termux's packages (PyPI's manylinux wheels do not fit
# Android's libc); DualPath's C kernels are compiled here by clang for the phone's CPU
# baseline (faster paths are chosen at run time). onnx is not installed: a model's first
# load needs it to build the ONNX graphs, so convert models on a desktop and copy them
# over (android/README.md, "Models on the phone").
set -euo pipefail
cd "$(dirname "$0")/../.."

with_server=0
with_bpe=0
for arg in "$@"; do
  case "$arg" in
    --with-server) with_server=1 ;;
    --with-bpe) with_bpe=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (known: --with-server, --with-bpe)" >&2; exit 2 ;;
  esac
done

if ! command -v pkg >/dev/null || [ -z "${PREFIX:-}" ]; then
  echo "install.sh: this is for Termux (no 'pkg' command or \$PREFIX here); on a desktop: pip install ." >&2
  exit 1
fi

echo "== Termux packages: python, numpy, onnxruntime, clang"
pkg install -y python python-pip python-numpy python-onnxruntime clang
if [ "$with_bpe" = 1 ]; then
  pkg install -y rust
fi

echo "== build tools (pure Python wheels)"
python -m pip install "Cython>=3.0" setuptools wheel

echo "== the pure-Python dependencies"
python -m pip install "gguf>=0.17" "pyyaml>=6.0" "jinja2>=3.1"
if [ "$with_server" = 1 ]; then
  python -m pip install "starlette>=0.40" "uvicorn>=0.30"
fi
if [ "$with_bpe" = 1 ]; then
  python -m pip install "tokenizers>=0.19"
fi

echo "== DualPath (compiles the C kernels)"
# --no-build-isolation: build against Termux's numpy (an isolated build would fetch numpy's
# source from PyPI and compile it). --no-deps: everything it needs is installed above.
python -m pip install --no-build-isolation --no-deps .

python - <<'PY'
import dualpath
from dualpath.models.store import default_root

print(f"dualpath {dualpath.__version__} installed; converted-model cache: {default_root()}")
PY
echo "Next: put a converted model into that cache (android/README.md, \"Models on the phone\")."
