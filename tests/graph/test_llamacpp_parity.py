"""Our ONNX graphs against llama.cpp on the same synthetic GGUF files.

Random weights give near-ties, so we compare the logits of the last prompt
position (same argmax, cosine >= 0.999) rather than long greedy runs.
"""

import os

import numpy as np
import pytest

from dualpath import LLM, load_config
from dualpath.models.synth import synth_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")

CASES = [("stories15M", "F32"), ("stories15M", "F16"), ("stories15M", "Q8_0"), ("stories15M", "Q4_0"),
         ("tinyllama-1.1b", "Q8_0")]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


def _last_logits_llamacpp(path, prompt):
    ref = llama_cpp.Llama(path, n_ctx=128, n_threads=2, n_batch=64, logits_all=True, verbose=False)
    try:
        ref.eval(prompt)
        return np.array(ref.scores[len(prompt) - 1], dtype=np.float32)
    finally:
        ref.close()


@pytest.mark.parametrize("preset,weight_type", CASES, ids=[f"{p}-{t}" for p, t in CASES])
def test_last_prompt_logits_agree_with_llama_cpp(synth_dir, preset, weight_type):
    path = str(synth_dir / f"{preset}-{weight_type}.gguf")
    synth_gguf(path, preset, weight_type, seed=4)
    rng = np.random.default_rng(5)
    prompt = [1] + [int(x) for x in rng.integers(3, 32000, 31)]  # 32 tokens

    theirs = _last_logits_llamacpp(path, prompt)
    llm = LLM(path, load_config(None, {"runtime.max_context_tokens": 128, "runtime.num_threads": 2}))
    ours = llm.runner.forward(prompt)[0].copy()
    del llm
    os.remove(path)

    cos = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
    assert int(ours.argmax()) == int(theirs.argmax()), f"argmax {ours.argmax()} vs llama.cpp {theirs.argmax()}"
    assert cos >= 0.999, f"cosine similarity {cos:.6f} < 0.999"
    if weight_type in ("F32", "F16"):  # same weights in float: only summation order differs
        assert np.abs(ours - theirs).max() < 1e-2 * np.abs(theirs).max()
