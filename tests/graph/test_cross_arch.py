"""The same model on two architectures: logits on aarch64 against x86-64's.

android/check_aarch64.sh writes a reference on the host (x86-64): a synthetic Qwen2
file in Q4_K_M (llama.cpp's quantizer: zero points, mins, 6-bit blocks; byte-level BPE
tokenizer), its greedy continuation of a prompt and the logits at every position. This
test then runs under qemu-aarch64 against that file. It is skipped where
``DUALPATH_CROSS_REFERENCE`` is unset (every ordinary run).

    python tests/graph/test_cross_arch.py MODEL.gguf OUT.json    # make the reference

ONNX Runtime's int8 matmul kernels differ between the architectures (and so does the
onnxruntime version the aarch64 check pins), so logits agree to a tolerance, and a
greedy choice may differ only at a near-tie.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

PROMPT = "Once upon a time, in a small town by the sea,"
NUM_TOKENS = 32
TOLERANCE = 0.03
"""Largest logit difference, relative to the largest |logit| at that position."""
NEAR_TIE = 0.05
"""Top-2 logit gap (relative to the largest |logit|) under which either choice is fine."""


def _llm(model: str, kernel: str = "auto"):
    import dualpath

    return dualpath.LLM(model, dualpath.load_config(None, {"runtime.max_context_tokens": 256,
                                                           "model_cache.enabled": False,
                                                           "runtime.kernel_isa": kernel}))


def _kernels() -> list[str]:
    """Every kernel ISA this CPU runs: the layer products and the classifier of each."""
    try:
        from dualpath.kernels import available_kernels
    except ImportError:
        return ["auto"]
    return available_kernels()


def _logits(llm, ids: list[int]) -> np.ndarray:
    r = llm.runner
    r.begin([])
    return np.concatenate([r.forward(ids[i:i + 64], all_logits=True) for i in range(0, len(ids), 64)])


def make_reference(model: str, out: str) -> None:
    import platform

    from dualpath import SamplingParams

    llm = _llm(model)
    prompt = llm.tokenize(PROMPT)
    c = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True))
    seq = prompt + list(c.token_ids)
    with open(out, "w") as f:
        json.dump({"model": os.path.abspath(model), "machine": platform.machine(), "prompt_ids": prompt,
                   "generated_ids": list(c.token_ids), "logits": _logits(llm, seq).tolist()}, f)


REFERENCE = os.environ.get("DUALPATH_CROSS_REFERENCE")


@pytest.mark.skipif(not REFERENCE, reason="no cross-architecture reference (android/check_aarch64.sh makes one)")
@pytest.mark.parametrize("kernel", _kernels())
def test_logits_and_greedy_choices_match_the_other_architecture(kernel):
    import platform

    ref = json.loads(open(REFERENCE).read())
    assert ref["machine"] != platform.machine(), "the reference must come from the other architecture"
    llm = _llm(ref["model"], kernel)
    prompt = llm.tokenize(PROMPT)
    assert prompt == ref["prompt_ids"]  # the tokenizer (byte-level BPE) agrees
    seq = prompt + ref["generated_ids"]
    ours, theirs = _logits(llm, seq), np.array(ref["logits"], np.float32)
    assert ours.shape == theirs.shape
    scale = np.abs(theirs).max(axis=1)
    rel = np.abs(ours - theirs).max(axis=1) / scale
    assert rel.max() <= TOLERANCE, f"largest relative logit difference {rel.max():.4f}"
    # Greedy: where the reference's choice is not a near-tie, ours is the same.
    top2 = np.sort(theirs, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) / scale > NEAR_TIE
    start = len(prompt) - 1
    steps = np.arange(start, len(seq) - 1)
    agree = ours[steps].argmax(axis=1) == np.array(seq[start + 1:])
    assert agree[clear[steps]].all(), np.nonzero(~agree & clear[steps])[0].tolist()


if __name__ == "__main__":
    make_reference(sys.argv[1], sys.argv[2])
