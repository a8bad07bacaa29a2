"""Every model family against llama.cpp on the same files (llama-cpp-python's llama.cpp).

For each family (llama with Llama 3 frequency factors, qwen2, qwen3, gemma2, gemma3,
phi3 with LongRoPE factors) ``dualpath synth`` writes its tiny twin (dim 256, 2-3
layers, windows of 10-12 tokens so sliding layers really slide within the test's 51
positions) in F16 and Q8_0, and llama.cpp's own quantizer makes Q4_K_M from the F32 file.
The prompt is 20 ids (tokenization is tested apart), EOS ignored, llama.cpp at 2
threads, same context.

* **Same computation** (``test_family_greedy_tokens_equal_llama_cpp``): the F16 file as
  is; for Q8_0 / Q4_K_M llama.cpp runs on an F32 copy of the file dequantized by gguf-py
  and we run the quantized file with fp32 activations (``accuracy_level`` 0), so both
  compute with the same weights. The last prompt position's logits agree within
  SAME_TOL of the largest logit (measured 3e-4 to 1.5e-3; llama.cpp's KV cache is f16
  and it sums in another order), and the 32 greedy tokens are equal, up to the first
  near-tie (top-2 closer than twice the step's logit error) where there is one
  (measured: all 32 in 14 of the 18 cases; llama F16, qwen2 F16, qwen3 Q8_0 and phi3
  F16 reach such a tie at steps 19, 9, 29 and 4 (phi3: top-2 2e-4 apart)).
* **As shipped** (``test_family_quantized_file_agrees_as_shipped``): both engines'
  defaults on the quantized file itself; both quantize activations to int8, in different
  blocks, which moves the last prompt position's logits by 0.5% to 3.4% of the largest
  one (measured per family: gemma 0.5-2.0%, llama/qwen/phi3 1.6-3.4%), so: same argmax
  and cosine >= 0.998 there (0.99899 measured on llama Q4_K_M), max |diff| <=
  PEER_TOL[type], and teacher-forced along llama.cpp's greedy tokens, the same argmax at
  >= 27 of the 32 steps (measured 29-32; 27 for phi3-tiny Q4_K_M on onnxruntime 1.20.1,
  where ours is the closer of the two to the exact product, as asserted next). Each engine's int8
  activations move its logits away from the exact product of the file's weights (ours at accuracy level 0); ours must
  stay at least as close to it as llama.cpp's, to 1e-5 (mean cosine over the 32 steps; Q4_K_M,
  measured at 07eb9d6+: ours 0.99947-0.99991, llama.cpp 0.99897-0.99981; Q8_0, where
  both quantize activations in blocks of 32, they tie to 1e-6).
"""

import os

import numpy as np
import pytest
from llamacpp_peer import dualpath_greedy, llamacpp_greedy

from dualpath import LLM, load_config
from dualpath.bench.quality import dequantized_copy
from dualpath.models.gguf import load_gguf
from dualpath.models.synth import PRESETS, quantize_gguf, synth_gguf

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the peer these tests compare against")

FAMILIES = {"llama": "llama3-tiny", "qwen2": "qwen2-tiny", "qwen3": "qwen3-tiny", "gemma2": "gemma2-tiny",
            "gemma3": "gemma3-tiny", "phi3": "phi3-tiny"}
TYPES = ("F16", "Q8_0", "Q4_K_M")
SAME_TOL = {"F16": 3e-3, "Q8_0": 3e-3, "Q4_K_M": 3e-3}
PEER_TOL = {"Q8_0": 0.06, "Q4_K_M": 0.10}
NUM_GREEDY = 32
CONTEXT = 128
PROMPT = [1] + [int(x) for x in np.random.default_rng(5).integers(3, 2048, 19)]


@pytest.fixture(scope="module")
def family_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    made: dict = {}

    def get(arch: str, file_type: str) -> str:
        key = (arch, file_type)
        if key not in made:
            preset = FAMILIES[arch]
            if file_type == "Q4_K_M":
                src = get(arch, "F32")
                made[key] = quantize_gguf(src, os.fspath(root / f"{preset}-{file_type}.gguf"), file_type)
            else:
                made[key] = synth_gguf(root / f"{preset}-{file_type}.gguf", preset, file_type, seed=0)
        return made[key]

    return get


def _llamacpp(path, prompt):
    return llamacpp_greedy(path, prompt, NUM_GREEDY, CONTEXT)


def _ours(path, prompt, forced, accuracy_level):
    """Our logits teacher-forced along ``forced`` and our greedy tokens."""
    return dualpath_greedy(path, prompt, forced, accuracy_level, CONTEXT)[1:]


def _cos(a, b) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("file_type", TYPES)
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_greedy_tokens_equal_llama_cpp(family_file, tmp_path, arch, file_type):
    path = family_file(arch, file_type)
    peer = path if file_type == "F16" else dequantized_copy(path, os.fspath(tmp_path / "f32.gguf"))
    theirs, their_tokens = _llamacpp(peer, PROMPT)
    ours, our_tokens = _ours(path, PROMPT, their_tokens, accuracy_level=0)
    scale = float(np.abs(theirs[0]).max())
    diff = float(np.abs(ours[0] - theirs[0]).max())
    assert diff <= SAME_TOL[file_type] * scale, diff
    # Random weights have near-ties: a step whose top-2 logits are closer than the two
    # engines' rounding (phi3-tiny's F16 file has one 2e-4 apart) can go either way, and
    # the texts then part. Teacher-forced, every step that is not such a tie decides
    # alike; greedy, the tokens are equal up to the first tie (all 32 where there is none).
    top2 = np.sort(theirs, axis=1)[:, -2:]
    tie = (top2[:, 1] - top2[:, 0]) < 2 * np.abs(ours - theirs).max(axis=1)  # within this step's error
    decided = ~tie
    assert (ours.argmax(axis=1)[decided] == np.array(their_tokens)[decided]).all()
    first_tie = int(np.argmax(tie)) if tie.any() else NUM_GREEDY
    assert our_tokens[:first_tie + 1][:first_tie] == their_tokens[:first_tie]
    if first_tie < NUM_GREEDY:
        assert our_tokens[first_tie] in np.argsort(theirs[first_tie])[-2:]


@pytest.mark.parametrize("file_type", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_quantized_file_agrees_as_shipped(family_file, arch, file_type):
    path = family_file(arch, file_type)
    theirs, their_tokens = _llamacpp(path, PROMPT)
    ours, _ = _ours(path, PROMPT, their_tokens, accuracy_level=4)
    exact, _ = _ours(path, PROMPT, their_tokens, accuracy_level=0)  # the same weights, f32 activations
    a, b = ours[0], theirs[0]
    assert int(a.argmax()) == int(b.argmax())
    assert _cos(a, b) >= 0.998, f"cosine {_cos(a, b):.6f}"
    # Two engines' int8 activations differ from each other more than either differs from
    # the exact product: ours must be at least as close to it as llama.cpp's.
    steps = range(len(their_tokens))
    ours_exact = np.mean([_cos(ours[i], exact[i]) for i in steps])
    theirs_exact = np.mean([_cos(theirs[i], exact[i]) for i in steps])
    assert ours_exact >= theirs_exact - 1e-5, f"cosine to the exact product: ours {ours_exact:.6f}, " \
                                              f"theirs {theirs_exact:.6f}"
    assert np.abs(a - b).max() <= PEER_TOL[file_type] * np.abs(b).max(), f"max |diff| {np.abs(a - b).max():.4g}"
    agree = int((ours.argmax(axis=1) == np.array(their_tokens)).sum())
    assert agree >= 27, f"teacher-forced argmax agrees at {agree} of {NUM_GREEDY} steps"


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_config_names_each_difference(family_file, arch):
    """The loader reads each family's differences into the config the graph builds from."""
    cfg = load_gguf(family_file(arch, "F16")).config
    shape = PRESETS[FAMILIES[arch]]
    assert cfg.arch == arch
    assert cfg.rope_type == ("norm" if arch == "llama" else "neox")
    assert cfg.qkv_bias == (arch == "qwen2")
    assert cfg.qk_norm == (arch in ("qwen3", "gemma3"))
    assert cfg.post_norms == (arch in ("gemma2", "gemma3")) and cfg.ffn_act == (
        "gelu_tanh" if arch.startswith("gemma") else "silu")
    assert cfg.embed_scale == (pytest.approx(16.0) if arch.startswith("gemma") else 1.0)
    assert cfg.fused_qkv == cfg.fused_gate_up == (arch == "phi3")
    assert cfg.rope_freqs == (arch == "llama") and cfg.rope_factors == (arch == "phi3")
    assert cfg.tied_output == shape.tied
    if arch == "gemma2":  # every other layer slides, starting with layer 0
        assert cfg.swa_layers == (True, False) and cfg.sliding_window == 12
        assert (cfg.attn_softcap, cfg.final_softcap) == (50.0, 30.0)
        assert cfg.attention_scale == pytest.approx(1 / 16)  # 1/sqrt(head_dim 256)
    elif arch == "gemma3":  # pattern 3: two sliding layers, then a global one
        assert cfg.swa_layers == (True, True, False) and cfg.sliding_window == 10
        assert cfg.layer_rope(0) == (10000.0, 1.0) and cfg.layer_rope(2) == (1000000.0, 1.0)
        assert cfg.attn_softcap == 0.0
    else:
        assert cfg.layer_window(0) == 0


def test_phi3_long_context_uses_the_long_rope_factors(family_file):
    """Past the original context (256 here) Phi-3 switches to its long factors, as
    llama.cpp does by the context it is given: both at 512."""
    path = family_file("phi3", "F16")
    ref = llama_cpp.Llama(path, n_ctx=512, n_threads=2, n_batch=64, logits_all=True, verbose=False)
    try:
        ref.eval(PROMPT)
        theirs = np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32)
    finally:
        ref.close()
    for ctx, same in ((512, True), (CONTEXT, False)):
        llm = LLM(path, load_config(None, {"runtime.max_context_tokens": ctx, "runtime.num_threads": 2}))
        ours = llm.runner.forward(PROMPT)[0]
        del llm
        close = np.abs(ours - theirs).max() <= SAME_TOL["F16"] * np.abs(theirs).max()
        assert close == same, ctx
