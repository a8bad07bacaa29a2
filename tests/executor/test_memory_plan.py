"""The memory plan before load (executor/memory_plan.py): its arithmetic, and a budget
that picks the context and KV type, or refuses before anything is converted."""

from __future__ import annotations

import os

import pytest

from dualpath.cache.windows import MARGIN
from dualpath.config import load_config
from dualpath.errors import ConfigError
from dualpath.executor import memory_plan as mp
from dualpath.kernels import kv_tile_bytes
from dualpath.llm import LLM
from dualpath.models import read_layout
from dualpath.models.synth import synth_gguf

B4, B8 = mp.PACK_BLOCK_BYTES[4], mp.PACK_BLOCK_BYTES[8]


@pytest.mark.parametrize("type_name, per_block, values", [
    ("Q4_0", 16 + B4, 32), ("Q8_0", 32 + B8, 32), ("Q6_K", 16 + B8, 16),  # 8 bits, blocks of 16
    ("Q4_K", 16 + B4 + 4, 32),                                           # + a uint8 zero point's f32 min
    ("Q5_K", 32 + B8 + 4, 32), ("Q3_K", 8 + B4, 16), ("IQ4_NL", 32 + B8, 32),
])
def test_a_quantized_matrix_costs_its_blocks_values_and_packing(type_name, per_block, values):
    assert mp._matrix_bytes(type_name, (64, 512), nbits8=True) == 64 * 512 // values * per_block


def test_float_matrices_and_old_runtimes_8_bit_cost_four_bytes_a_value():
    assert mp._matrix_bytes("F16", (64, 512), True) == mp._matrix_bytes("F32", (64, 512), True) == 4 * 64 * 512
    assert mp._matrix_bytes("Q8_0", (64, 512), nbits8=False) == 4 * 64 * 512  # dequantized before 1.22
    assert mp._matrix_bytes("Q4_0", (64, 512), nbits8=False) == 64 * 16 * (16 + B4)


def test_the_embedding_counts_only_when_it_is_also_the_classifier():
    layout = {"token_embd.weight": ("Q8_0", (1000, 64)), "blk.0.attn_q.weight": ("Q4_0", (64, 64))}
    tied = mp.weight_bytes(layout)
    untied = mp.weight_bytes({**layout, "output.weight": ("Q6_K", (1000, 64))})
    # An 8-bit classifier is read in place by our kernels: its values and an f32 scale a block;
    # a layer's Q4_0 matrix too, in its form: the file's 18 bytes a block.
    assert tied == 1000 * 2 * (32 + 4) + 64 * 2 * 18
    assert untied == 64 * 2 * 18 + 1000 * 4 * (16 + 4)  # the output matrix, not the embedding
    # A 4-bit classifier is ONNX Runtime's (packed), also before 1.22; an 8-bit one is ours there too.
    assert mp.weight_bytes({**layout, "output.weight": ("Q4_0", (1000, 64))}) == 64 * 2 * 18 + \
        1000 * 2 * (16 + B4)
    assert mp.weight_bytes(layout, nbits8=False) == tied


def test_kv_of_sliding_layers_is_their_window_and_what_reuse_keeps(tmp_path):
    cfg, _, _ = read_layout(synth_gguf(tmp_path / "g3.gguf", "gemma3-tiny", "F32", seed=1))
    per = kv_tile_bytes("f16", cfg.num_kv_heads, cfg.head_dim, 1)
    windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]
    assert windows == [10, 10, 0]
    ctx = 5000
    kept = 2 * 10 + MARGIN + 16 + ctx // 4096 * 10
    slack = mp.THP_SLACK_BYTES  # per layer in huge pages: the global one, or all with swa_cache full
    assert mp.kv_bytes(cfg, ctx, "f16") == per * (ctx + 2 * kept) + slack
    assert mp.kv_bytes(cfg, ctx, "f16", checkpoint=0) == per * (ctx + 2 * (kept - 10)) + slack
    assert mp.kv_bytes(cfg, ctx, "f16", swa_cache="full") == per * 3 * ctx + 3 * slack
    assert mp.kv_bytes(cfg, 50, "f16") == per * 3 * 50 + slack  # shorter than what a window keeps


def test_a_budget_picks_the_largest_context_that_fits(tmp_path):
    path = synth_gguf(tmp_path / "tiny.gguf", "kquant-tiny", "Q8_0", seed=2)
    cfg = load_config(None, {"runtime.num_threads": 1, "runtime.max_context_tokens": 4096,
                             "model_cache.dir": str(tmp_path / "cache")})
    m, layout, merges = read_layout(path)
    at = {c: mp.plan_memory(m, layout, merges, cfg, c, "f16").total_full for c in (1000, 1001, 4096)}
    assert at[1000] < at[1001] < at[4096]
    plan = mp.fit(path, cfg, at[1000], nbits8=True)
    # f16 fits 1000 tokens; q8, with half the KV bytes, fits more, so it is chosen
    assert plan.kv_dtype == "q8" and plan.context > 1000 and plan.total_full <= at[1000]
    assert mp.plan_memory(m, layout, merges, cfg, plan.context + 1, "q8").total_full > at[1000]
    assert mp.fit(path, cfg, at[4096], nbits8=True).context == 4096  # everything fits: as configured
    llm = LLM(path, cfg, memory_budget=-(-at[1000] // mp.MiB))
    assert llm.runner.max_context_tokens == llm.memory_plan.context >= 1000
    assert llm.config.kv_cache.kv_dtype == llm.memory_plan.kv_dtype


def test_a_budget_below_the_models_need_is_refused_before_anything_is_converted(tmp_path):
    path = synth_gguf(tmp_path / "tiny.gguf", "kquant-tiny", "Q4_0", seed=3)
    cache = tmp_path / "cache"
    cfg = load_config(None, {"runtime.num_threads": 1, "model_cache.dir": str(cache)})
    with pytest.raises(ConfigError, match=r"does not fit a memory budget of 50 MiB: it needs [\d,]+ MiB at 256 "
                                          r"tokens.*weights"):
        LLM(path, cfg, memory_budget=50)
    assert not cache.exists() or not any(os.scandir(cache))  # no entry: no weight was converted
    with pytest.raises(ConfigError, match="memory_budget_mb"):
        load_config(None, {"runtime.memory_budget_mb": -2})
