"""onnxruntime-genai as a peer engine of ``dualpath bench e2e``, on the same GGUF.

onnxruntime-genai lives in an environment of its own (its onnxruntime pin may
differ from ours, and its model builder imports torch): ``--ortgenai-python``
names that environment's interpreter (default ``$DUALPATH_ORTGENAI_PYTHON``, else
this one). ``examples/peers/setup_ortgenai_env.sh`` makes such an environment.
Everything onnxruntime-genai does runs there, in ``_ortgenai_worker.py`` (run by
path through ``harness.run_peer_script``):

1. ``probe``: does the interpreter import onnxruntime_genai (and, before a build,
   the builder's dependencies)? If not, the engine is skipped with one line naming
   what is missing (``Unavailable``).
2. ``build``: onnxruntime-genai's own model builder on the GGUF, once, cached under
   ``~/.cache/dualpath/ortgenai/<key>`` (``--ortgenai-cache``), the key a hash of the
   file's absolute path, size, mtime, the precision and onnxruntime-genai's version.
   Precision ``auto``: ``fp32`` for an F32/F16/BF16 file; ``int8`` when its only
   quantized type is Q8_0; ``int4`` for any other quantized file. The builder cannot
   read quantized GGUF tensors (it takes their raw blocks as values and fails at the
   first reshape), so a quantized file is dequantized to an F32 copy first and the
   builder quantizes that again (MatMulNBits, block 32, symmetric, accuracy level 4).
3. ``measure``: one prefill + decode run per process, the same prompt ids, chunk and
   thread count as the other engines.

Only llama-architecture GGUFs are built (the config it writes is a Llama one), and
the GGUF must record a context length of at least prompt + decoded tokens + 1:
onnxruntime-genai refuses a ``max_length`` above the ``context_length`` its builder
took from the file (``max_position_embeddings``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass

from .harness import BenchProcessError, run_peer_script

ENGINE = "onnxruntime-genai"
PYTHON_ENV = "DUALPATH_ORTGENAI_PYTHON"
"""Environment variable naming the default interpreter of onnxruntime-genai's environment."""
SETUP_SCRIPT = "examples/peers/setup_ortgenai_env.sh"
"""In the repository: makes an environment onnxruntime-genai runs in."""
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ortgenai_worker.py")
WORKER_MODULES = ("onnxruntime_genai", "numpy")
"""What ``measure`` imports."""
BUILDER_MODULES = ("gguf", "tokenizers", "transformers", "torch", "onnx", "onnx_ir",
                   "onnxruntime_genai.models.builder")
"""What ``build`` needs besides ``WORKER_MODULES`` (the builder itself imports torch)."""
PRECISIONS = ("auto", "fp32", "int4", "int8")
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
PROBE_TIMEOUT_S = 300.0
BUILD_TIMEOUT_S = 3600.0
MEASURE_TIMEOUT_S = 1800.0


class Unavailable(Exception):
    """onnxruntime-genai cannot run this measurement; ``str()`` is the one-line reason."""


def _last_line(error: BenchProcessError) -> str:
    """The last line of a failed child's error: its exception (the quoted stderr's end)."""
    lines = [line.removeprefix("  | ").strip() for line in str(error).splitlines()]
    return next((line for line in reversed(lines) if line), "no output")


@dataclass(frozen=True)
class OrtGenaiModel:
    """A model onnxruntime-genai's builder made from one GGUF."""

    gguf_path: str
    model_dir: str
    """The builder's output folder (genai_config.json, model.onnx)."""
    precision: str
    """fp32, int4 or int8: the builder's ``-p``."""
    vocab_size: int
    built: bool
    """True: built by this run; False: found in the cache."""


def default_python() -> str:
    """``$DUALPATH_ORTGENAI_PYTHON``, else this interpreter."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def default_cache_dir() -> str:
    """``($XDG_CACHE_HOME or ~/.cache)/dualpath/ortgenai``: beside the synthetic models,
    apart from the converted-model cache (whose folder holds only its own entries)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "dualpath", "ortgenai")


def check_file(path: str, ctx: int, decode: int) -> list[str]:
    """The types of the 2-D tensors of the GGUF ``path``, after checking that onnxruntime-genai
    can run it for a prompt of ``ctx`` tokens and ``decode`` decoded ones; else
    ``Unavailable`` saying why (the reason reads after the file's name)."""
    from gguf.gguf_reader import GGUFReader

    try:
        reader = GGUFReader(path)
        fields = reader.fields

        def value(key):
            return None if key not in fields else fields[key].contents()

        arch = value("general.architecture")
        context_length = value(f"{arch}.context_length")
        types = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) == 2})
    except Exception as e:  # missing, unreadable, not a GGUF: DualPath's own run names it in full
        raise Unavailable(f"cannot read it as a GGUF ({type(e).__name__}: {e})") from None
    if arch != "llama":
        raise Unavailable(f"it is a {arch} model; the onnxruntime-genai engine builds llama-architecture "
                          "GGUFs only")
    needed = ctx + decode + 1
    if context_length is None or int(context_length) < needed:
        recorded = "records no context length" if context_length is None else \
            f"records a context length of {int(context_length)} (llama.context_length)"
        raise Unavailable(f"it {recorded}, below the prompt + decoded tokens + 1 = {needed} that "
                          f"onnxruntime-genai needs (its builder takes max_position_embeddings from it); "
                          f"make the file with a longer one, e.g. dualpath synth --ctx {max(needed, 2048)}")
    return types


def auto_precision(weight_types: list[str]) -> str:
    """The builder's ``-p`` for a file whose 2-D tensors have ``weight_types``."""
    quantized = set(weight_types) - FLOAT_TYPES
    if not quantized:
        return "fp32"
    return "int8" if quantized == {"Q8_0"} else "int4"


def cache_key(path: str, precision: str, og_version: str) -> str:
    """Which built model serves ``path``: its absolute path, size and mtime, the precision and
    onnxruntime-genai's version (a newer builder may make a different model)."""
    st = os.stat(path)
    ident = json.dumps([os.path.abspath(path), st.st_size, st.st_mtime_ns, precision, og_version])
    return hashlib.blake2b(ident.encode(), digest_size=12).hexdigest()


class OrtGenaiPeer:
    """onnxruntime-genai in the environment of ``python``: probe it (``check``), build a
    GGUF's model once (``prepare``), measure it (``measure``)."""

    def __init__(self, python: str, cache_dir: str, precision: str = "auto"):
        if precision not in PRECISIONS:
            raise ValueError(f"onnxruntime-genai precision {precision!r}: one of {', '.join(PRECISIONS)}")
        self.python, self.cache_dir, self.precision = python, cache_dir, precision
        self.og_version: str | None = None
        self._builder_checked = False

    def _probe(self, modules: tuple[str, ...], purpose: str) -> dict:
        hint = (f"make an environment with {SETUP_SCRIPT} and pass --ortgenai-python ENV/bin/python "
                f"(or set {PYTHON_ENV})")
        if os.sep in self.python and not os.access(self.python, os.X_OK):
            raise Unavailable(f"--ortgenai-python {self.python} is not an executable file; {hint}")
        try:
            res = run_peer_script(self.python, WORKER_SCRIPT, "probe", {"modules": list(modules)},
                                  timeout_s=PROBE_TIMEOUT_S)
        except BenchProcessError as e:
            raise Unavailable(f"{self.python} could not run the probe ({_last_line(e)}); {hint}") from None
        if res["missing"]:
            what = "; ".join(f"{m} ({err})" for m, err in res["missing"].items())
            raise Unavailable(f"{self.python} cannot import {what}, needed {purpose}; {hint}")
        return res

    def check(self) -> None:
        """Raise ``Unavailable`` unless the interpreter runs onnxruntime-genai."""
        res = self._probe(WORKER_MODULES, "to run onnxruntime-genai")
        self.og_version = res["versions"]["onnxruntime_genai"]

    def prepare(self, path: str, ctx: int, decode: int) -> OrtGenaiModel:
        """The built model of the GGUF ``path`` (built now, or found in the cache). Raises
        ``Unavailable`` when the file does not fit onnxruntime-genai's builder or this run,
        or the build fails."""
        types = check_file(path, ctx, decode)
        if self.og_version is None:
            self.check()
        assert self.og_version is not None  # check() sets it or raises
        precision = auto_precision(types) if self.precision == "auto" else self.precision
        out_dir = os.path.join(self.cache_dir, cache_key(path, precision, self.og_version))
        model_dir = os.path.join(out_dir, "model")
        built = not os.path.isfile(os.path.join(model_dir, "genai_config.json"))
        if built:
            if not self._builder_checked:
                self._probe(WORKER_MODULES + BUILDER_MODULES, "by onnxruntime-genai's model builder")
                self._builder_checked = True
            os.makedirs(self.cache_dir, exist_ok=True)
            try:
                run_peer_script(self.python, WORKER_SCRIPT, "build",
                                {"gguf_path": os.path.abspath(path), "out_dir": out_dir, "precision": precision},
                                timeout_s=BUILD_TIMEOUT_S)
            except BenchProcessError as e:
                raise Unavailable(f"building its model (-p {precision}) failed: {_last_line(e)}") from None
        with open(os.path.join(model_dir, "genai_config.json")) as f:
            vocab_size = int(json.load(f)["model"]["vocab_size"])
        return OrtGenaiModel(os.path.abspath(path), model_dir, precision, vocab_size, built)

    def measure(self, model: OrtGenaiModel, prompt: list[int], decode: int, threads: int, chunk: int) -> dict:
        """One prefill of ``prompt`` and ``decode`` greedy steps in a fresh process of the peer
        environment: prefill_tps, decode_tps, peak_rss_mb, loaded_rss_mb."""
        return run_peer_script(self.python, WORKER_SCRIPT, "measure",
                               {"model_dir": model.model_dir, "prompt": prompt, "decode": decode,
                                "threads": threads, "chunk": chunk}, timeout_s=MEASURE_TIMEOUT_S)
