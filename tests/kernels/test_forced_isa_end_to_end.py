"""The golden end-to-end runs with every kernel ISA this machine has, forced."""

import json
import os
import subprocess
import sys

import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.kernels import KERNEL_ISAS, available_kernels
from tests_shared import assert_golden_ids, models_dir_path

MODELS = models_dir_path()
GGUF = MODELS / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(),
                                reason=f"test model not found in {MODELS} (set DUALPATH_TEST_MODELS)")


"""A greedy choice whose f32 top-2 logit gap is below this is a near-tie that f16 KV's
rounding (about 1e-3 relative, on logits of about 10 here) may flip."""


def llm_for(kernel: str, kv_dtype: str):
    return dualpath.LLM(GGUF, dualpath.load_config(None, {
        "runtime.kernel_isa": kernel, "kv_cache.kv_dtype": kv_dtype,
        "runtime.max_context_tokens": 512}))


@pytest.mark.parametrize("kernel", available_kernels())
@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_golden_ids_with_each_forced_kernel(kernel, kv_dtype):
    """run.c's greedy ids (f32) exactly with an f32 KV cache. With f16 KV too, except
    that a run may leave them at a near-tie of the f32 model: there our token must be
    the f32 runner-up (seen on aarch64, whose ONNX Runtime rounds differently)."""
    llm = llm_for(kernel, kv_dtype)
    assert llm.runner.kv.kernel == kernel
    runs = json.loads((MODELS / "reference" / "greedy_token_ids.json").read_text())["runs"]
    for run in runs:
        ids = run["prompt_ids"]
        c = llm.generate(ids, SamplingParams(temperature=0, max_tokens=256 - len(ids) + 1))
        assert_golden_ids(list(c.token_ids), run["generated_ids"], ids, kv_dtype,
                          lambda: llm_for(kernel, "f32").runner, run["name"])


def test_disabling_cpu_features_falls_back_and_info_says_so():
    env = dict(os.environ, DUALPATH_DISABLE_CPU_FEATURES="avx512,avx2,neon_fp16,neon")
    code = ("import dualpath.kernels as k, dualpath, json;"
            f"llm = dualpath.LLM({str(GGUF)!r});"
            "c = llm.generate('Once upon a time', dualpath.SamplingParams(temperature=0, max_tokens=8));"
            "print(json.dumps([k.default_kernel(), llm.runner.kv.kernel, c.text]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    default, used, text = json.loads(out.stdout.strip().splitlines()[-1])
    assert default == used == "generic"
    assert text.startswith(", there was a little girl")
    info = subprocess.run([sys.executable, "-m", "dualpath.cli", "info"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "attention=generic" in info and "DUALPATH_DISABLE_CPU_FEATURES=avx512,avx2" in info


def test_forcing_a_kernel_this_cpu_lacks_is_a_clear_error():
    missing = next(k for k in KERNEL_ISAS if k not in available_kernels())
    with pytest.raises(ValueError, match=f"kernel '{missing}' is not available"):
        dualpath.LLM(GGUF, dualpath.load_config(None, {"runtime.kernel_isa": missing}))
