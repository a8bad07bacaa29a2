"""llama.cpp as the peer of ``dualpath bench e2e|quality|startup|memory|embed``, at its best.

llama.cpp runs through llama-cpp-python in an environment of the user's choice:
``--peer-python`` names its interpreter (default ``$DUALPATH_LLAMACPP_PYTHON``, or
``$DUALPATH_LLAMACPP_LAPTOP_PYTHON`` for the laptop ISA, else this one), so that a
build made for this CPU (``examples/peers/setup_llamacpp_env.sh full|laptop``) stands
beside DualPath without replacing the llama-cpp-python of our environment. What
llama.cpp does runs there, in ``_llamacpp_worker.py`` (by path, through
``harness.run_peer_script``; ``_startup_worker.py`` for ``bench startup``).

At its best means:

* its build: for this CPU's ISA (AVX-512 and VNNI where present), never AMX. ``probe``
  reads its system info line; the benches print it beside the figures, and warn with
  what keeps the build from its best (``_llamacpp_worker.build_problems``, the one rule,
  which the setup script runs too);
* flash attention off and on (``FLASH_ATTN``): llama-cpp-python's default is off,
  llama-server's ``-fa auto`` turns it on on the CPU. Each setting is a variant of its
  own, interleaved with the other engines' runs, and the faster is quoted for each
  figure (``common.best_of``), naming the setting it came from.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ..errors import DualPathError
from . import _llamacpp_worker as rule
from .harness import BenchProcessError, run_peer_script

ENGINE = "llama.cpp"
PYTHON_ENV = "DUALPATH_LLAMACPP_PYTHON"
"""Environment variable naming the default interpreter of the llama.cpp peer."""
LAPTOP_PYTHON_ENV = "DUALPATH_LLAMACPP_LAPTOP_PYTHON"
"""The same for the laptop ISA (a build without AVX-512)."""
SETUP_SCRIPT = "examples/peers/setup_llamacpp_env.sh"
"""In the repository: makes an environment with llama-cpp-python built for one target."""
WORKER_SCRIPT = os.path.abspath(rule.__file__)
ISAS = rule.ISAS
FLASH_ATTN = {"FA off": False, "FA on": True}
"""llama.cpp's flash attention settings, by the name a setting's variant and figures carry."""
PROBE_TIMEOUT_S = 300.0
MEASURE_TIMEOUT_S = 1800.0


class Unavailable(Exception):
    """The llama.cpp peer cannot run; ``str()`` is the one-line reason."""


class PeerError(DualPathError, ValueError):
    """The llama.cpp peer asked for cannot serve the comparison (named explicitly and not
    running, or not the build the ISA asked for needs): the bench stops, saying why."""


def default_python(isa: str = "full") -> str:
    """``$DUALPATH_LLAMACPP_LAPTOP_PYTHON`` for the laptop ISA, else ``$DUALPATH_LLAMACPP_PYTHON``,
    else this interpreter."""
    if isa == "laptop" and os.environ.get(LAPTOP_PYTHON_ENV):
        return os.environ[LAPTOP_PYTHON_ENV]
    return os.environ.get(PYTHON_ENV) or sys.executable


def variants() -> list[str]:
    """The peer's variants in an interleaved run: one per flash attention setting."""
    return [f"{ENGINE} {setting}" for setting in FLASH_ATTN]


def setting_of(variant: str) -> str | None:
    """The flash attention setting of one of ``variants()``; None for any other name."""
    prefix = ENGINE + " "
    setting = variant[len(prefix):] if variant.startswith(prefix) else None
    return setting if setting in FLASH_ATTN else None


def best_line(best: dict[str, str], labels: dict[str, str]) -> str:
    """``best`` of ``common.best_of`` in words: "prefill FA on, decode FA off"."""
    return ", ".join(f"{labels.get(key, key)} {setting}" for key, setting in best.items())


@dataclass
class LlamaCppPeer:
    """llama-cpp-python in the environment of ``python``, as ``probe`` found it."""

    python: str
    version: str
    system_info: str
    """llama.cpp's system info line: what its build uses."""
    isa: str
    """The target the build is judged against: ``full`` or ``laptop``."""
    problems: dict
    """``_llamacpp_worker.build_problems``: ``forbidden`` and ``missing`` features."""
    _vocab: dict[str, int] = field(default_factory=dict, repr=False)

    def build_line(self) -> str:
        """What the benches print beside the figures."""
        return f"llama.cpp peer: llama-cpp-python {self.version} ({self.python}); its build: {self.system_info}"

    def warnings(self) -> list[str]:
        """One sentence per problem of the build, for this CPU and ``isa``."""
        return rule.describe_problems(self.problems, self.isa)

    def _call(self, function: str, kwargs: dict, timeout_s: float = MEASURE_TIMEOUT_S):
        return run_peer_script(self.python, WORKER_SCRIPT, function, kwargs, timeout_s=timeout_s)

    def vocab_size(self, model: str) -> int:
        """The vocabulary of ``model`` as llama.cpp reads it (asked once per file)."""
        if model not in self._vocab:
            self._vocab[model] = int(self._call("vocab_size", {"model": model}, PROBE_TIMEOUT_S))
        return self._vocab[model]

    def measure(self, model: str, prompt: list[int], warm_prompt: list[int], warm_steps: int, decode: int,
                threads: int, chunk: int, setting: str) -> dict:
        """One prefill + decode run in a fresh process (``_llamacpp_worker.measure``) with the
        flash attention ``setting``: prefill_tps, decode_tps, peak_rss_mb, loaded_rss_mb."""
        return self._call("measure", {"model": model, "prompt": prompt, "warm_prompt": warm_prompt,
                                      "warm_steps": warm_steps, "decode": decode, "threads": threads,
                                      "chunk": chunk, "flash_attn": FLASH_ATTN[setting]})

    def embed(self, model: str, texts: dict, threads: int, batch: int, inner: int, setting: str) -> dict:
        """texts/s of each workload of ``texts`` (name -> strings) in a fresh process
        (``_llamacpp_worker.embed``), one encoder pass up to ``batch`` tokens."""
        return self._call("embed", {"model": model, "texts": texts, "threads": threads, "batch": batch,
                                    "inner": inner, "flash_attn": FLASH_ATTN[setting]})

    def rerank(self, model: str, pairs: list[list[int]], threads: int, batch: int, inner: int, setting: str) -> dict:
        """Milliseconds to score the pairs ``pairs`` (token ids) with a reranker, in a fresh
        process (``_llamacpp_worker.rerank``): {"rerank_ms": ...}."""
        return self._call("rerank", {"model": model, "pairs": pairs, "threads": threads, "batch": batch,
                                     "inner": inner, "flash_attn": FLASH_ATTN[setting]})

    def encode_image(self, model: str, mmproj: str, image: str, threads: int, inner: int, setting: str) -> dict:
        """Milliseconds to encode the image saved in ``image`` (.npy) with ``mtmd``, in a fresh
        process (``_llamacpp_worker.encode_image``): encode_ms, chunks, tokens, peak_rss_mb."""
        return self._call("encode_image", {"model": model, "mmproj": mmproj, "image": image, "threads": threads,
                                           "inner": inner, "flash_attn": FLASH_ATTN[setting]})

    def image_ttft(self, model: str, mmproj: str, image: str, threads: int, prompt: str, setting: str) -> dict:
        """Milliseconds from a prompt with the image saved in ``image`` (.npy) to its first
        token with ``mtmd``, in a fresh process (``_llamacpp_worker.image_ttft``)."""
        return self._call("image_ttft", {"model": model, "mmproj": mmproj, "image": image, "threads": threads,
                                         "prompt": prompt, "flash_attn": FLASH_ATTN[setting]})

    def logits(self, model: str, ids: list[int], out: str, n_ctx: int, kv_f32: bool, threads: int,
               setting: str) -> dict:
        """Teacher-forced logits of ``ids`` saved to ``out`` (``_llamacpp_worker.logits``)."""
        return self._call("logits", {"model": model, "ids": ids, "out": out, "n_ctx": n_ctx, "kv_f32": kv_f32,
                                     "threads": threads, "flash_attn": FLASH_ATTN[setting]})


def probe(python: str, isa: str = "full") -> LlamaCppPeer:
    """The peer in the environment of ``python``, its build judged for ``isa`` on this CPU;
    ``Unavailable`` (naming the interpreter and what failed) when it cannot run."""
    hint = f"make one with {SETUP_SCRIPT} and pass --peer-python ENV/bin/python, or pass --no-peer"
    if os.sep in python and not os.access(python, os.X_OK):
        raise Unavailable(f"--peer-python {python} is not an executable file; {hint}")
    try:
        res = run_peer_script(python, WORKER_SCRIPT, "probe", {}, timeout_s=PROBE_TIMEOUT_S)
    except BenchProcessError as e:
        lines = [line.removeprefix("  | ").strip() for line in str(e).splitlines()]
        last = next((line for line in reversed(lines) if line), "no output")
        raise Unavailable(f"{python} cannot run llama-cpp-python ({last}); {hint}") from None
    problems = rule.build_problems(res["system_info"], set(res["cpu_flags"]), isa)
    return LlamaCppPeer(python, res["version"], res["system_info"], isa, problems)


def require_laptop_build(peer: LlamaCppPeer) -> None:
    """``PeerError`` unless ``peer``'s build has neither AVX-512 nor AMX: beside DualPath
    without AVX-512, any other llama.cpp would not be a laptop's."""
    forbidden = rule.build_problems(peer.system_info, set(), "laptop")["forbidden"]
    if forbidden:
        raise PeerError(f"--isa laptop needs a llama.cpp built without AVX-512 and AMX, and the one of {peer.python} "
                        f"has {', '.join(forbidden)}: make one with {SETUP_SCRIPT} laptop ENV and pass --peer-python "
                        f"ENV/bin/python (or set {LAPTOP_PYTHON_ENV})")


def peer_from_args(peer_python: str | None) -> LlamaCppPeer | None:
    """The peer of a bench's ``--peer-python`` (None: the default interpreter), its build
    printed to stderr; without one given, a peer that is not there is skipped with a line
    saying why (None), a named one that is not there is a PeerError."""
    try:
        peer = probe(peer_python or default_python())
    except Unavailable as e:
        if peer_python:
            raise PeerError(f"the llama.cpp peer: {e}") from None
        print(f"dualpath bench: llama.cpp skipped: {e}", file=sys.stderr)
        return None
    print_build(peer, sys.stderr)
    return peer


def print_build(peer: LlamaCppPeer, file=None) -> None:
    """The peer's build line, then a WARNING line per problem of the build."""
    file = file or sys.stdout
    print(peer.build_line(), file=file)
    for line in peer.warnings():
        print(f"WARNING: {line}; build a peer with {SETUP_SCRIPT} {peer.isa} ENV and pass "
              f"--peer-python ENV/bin/python", file=file)
    file.flush()
