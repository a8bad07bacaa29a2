"""KV geometry has one home (cache/geometry.py): the cache, the memory plan and ``dualpath
info`` read it, and the head-dimension rule comes from the C table."""

from __future__ import annotations

import pytest

from dualpath.cache.geometry import (
    DEFAULT_SPARE_BLOCKS,
    cache_tokens,
    check_head_dim,
    fitted_page_tokens,
    head_dim_fits,
    kv_geometry,
    model_kv_geometry,
    pages_per_block,
)
from dualpath.cache.manager import KVCacheManager
from dualpath.config import Config, KVCacheConfig, with_overrides
from dualpath.errors import ConfigError
from dualpath.executor import memory_plan as mp
from dualpath.kernels import KV_DTYPES, KV_HEAD_DIM_MULTIPLE, KVArena, kv_tile_bytes
from dualpath.models import read_layout
from dualpath.models.synth import synth_gguf


def test_the_head_dim_rule_is_the_c_tables():
    assert set(KV_HEAD_DIM_MULTIPLE) == set(KV_DTYPES)
    assert KV_HEAD_DIM_MULTIPLE["q8"] == 2 and KV_HEAD_DIM_MULTIPLE["f16"] == KV_HEAD_DIM_MULTIPLE["f32"] == 1
    for dtype, multiple in KV_HEAD_DIM_MULTIPLE.items():
        for head_dim in (63, 64):
            assert head_dim_fits(dtype, head_dim) == (head_dim % multiple == 0)
            if not head_dim_fits(dtype, head_dim):  # the arena refuses what the rule refuses
                with pytest.raises(ValueError):
                    KVArena(4096, 1, 1, 1, head_dim, dtype)


def test_q8_kv_needs_an_even_head_dim():
    """The one check and message of this rule (the cache raises it, ``dualpath info`` prints it)."""
    check_head_dim("q8", 64)
    check_head_dim("f16", 63)
    with pytest.raises(ConfigError) as info:
        check_head_dim("q8", 63)
    assert str(info.value) == "kv_cache.kv_dtype=q8 needs an even head_dim; this model's is 63: use f16 or f32"


def test_a_page_must_fit_a_block():
    """The one check and message of this rule."""
    cfg = KVCacheConfig(block_bytes=4096, page_tokens=16)
    assert pages_per_block(cfg, 1024, 16) == 4
    assert pages_per_block(cfg, 4096, 16) == 1
    with pytest.raises(ConfigError) as info:
        pages_per_block(cfg, 4097, 1)
    assert str(info.value) == ("kv_cache.block_bytes=4096 cannot hold one page of page_tokens=1 tokens of "
                               "this model (4097 bytes); raise block_bytes")


@pytest.mark.parametrize("kv_dtype, want", [("f16", 8), ("f32", 4), ("q8", 16)])
def test_pages_of_wide_kv_heads_take_fewer_tokens(kv_dtype, want):
    """Phi-3-mini's 32 KV heads of 96 take 12 KiB a token in f16: 16 tokens are more than a
    128 KiB block, so its pages hold 8 (f32: 4; q8, about half of f16: 16 fit)."""
    dp = KVCacheConfig(kv_dtype=kv_dtype)
    g = kv_geometry(dp, num_layers=32, num_kv_heads=32, head_dim=96, num_blocks=1)
    assert fitted_page_tokens(dp, 32, 96) == g.page_tokens == want
    assert g.page_bytes == kv_tile_bytes(kv_dtype, 32, 96, want) <= dp.block_bytes
    assert want == dp.page_tokens or kv_tile_bytes(kv_dtype, 32, 96, 2 * want) > dp.block_bytes  # the most that fit
    assert fitted_page_tokens(KVCacheConfig(block_bytes=4096), 2, 64) == 8
    with pytest.raises(ConfigError, match="cannot hold one page of page_tokens=1 tokens"):
        kv_geometry(KVCacheConfig(block_bytes=4096), num_layers=1, num_kv_heads=32, head_dim=96, num_blocks=1)


def test_zero_cache_tokens_means_twice_the_context_plus_spare_blocks(tmp_path):
    cfg, _, _ = read_layout(synth_gguf(tmp_path / "s.gguf", "stories15M", "F32", seed=1))
    dp = KVCacheConfig()
    assert cache_tokens(0, 1000) == 2000 and cache_tokens(5000, 1000) == 5000
    g = model_kv_geometry(dp, cfg, 1000)
    per_block = g.pages_per_block * g.page_tokens
    assert g.page_bytes == kv_tile_bytes("f16", cfg.num_kv_heads, cfg.head_dim, 16)
    assert g.num_blocks == -(-2000 // per_block) + DEFAULT_SPARE_BLOCKS
    assert model_kv_geometry(dp, cfg, 1000, 5000).num_blocks == -(-5000 // per_block)


@pytest.mark.parametrize("overrides", [{}, {"runtime.kv_cache_tokens": 3000},
                                       {"dualpath_config.kv_dtype": "q8", "dualpath_config.page_tokens": 32}])
def test_the_memory_plan_and_the_cache_agree_by_construction(tmp_path, overrides):
    """The plan's geometry is the one the cache builds for the same config and context:
    the same pages, blocks and arena bytes, so the plan's KV figures are the cache's."""
    cfg, layout, merges = read_layout(synth_gguf(tmp_path / "g3.gguf", "gemma3-tiny", "F32", seed=1))
    config = with_overrides(Config(), overrides)
    plan = mp.plan_memory(cfg, layout, merges, config, 1500, nbits8=True)
    cache = KVCacheManager.for_model(config.dualpath_config, cfg, max_context_tokens=1500,
                                     kv_cache_tokens=config.runtime.kv_cache_tokens)
    assert plan.geometry == cache.geometry
    assert cache.capacity_tokens == plan.geometry.capacity_tokens
    assert cache.arena.num_layers * cache.num_blocks * cache.arena.block_size == plan.geometry.arena_bytes
    assert plan.parts["kv cache"] == plan.geometry.sequence_bytes(1500, global_layer_slack=mp.THP_SLACK_BYTES)


def test_kv_geometry_checks_the_head_dim_before_anything_is_allocated():
    with pytest.raises(ConfigError, match="needs an even head_dim"):
        kv_geometry(KVCacheConfig(kv_dtype="q8"), num_layers=1, num_kv_heads=1, head_dim=63, num_blocks=1)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_every_decoder_preset_gets_a_kv_cache_at_the_default_block(kv_dtype):
    """The real shapes ``dualpath synth`` knows (Phi-3-mini's wide heads among them) have a
    geometry in every KV dtype without touching ``block_bytes``."""
    from dualpath.models.synth import PRESETS
    from dualpath.models.synth_encoder import ENCODER_ARCHES

    dp = KVCacheConfig(kv_dtype=kv_dtype)
    for name, shape in PRESETS.items():
        if shape.arch in ENCODER_ARCHES:
            continue
        head_dim = shape.head_dim or shape.dim // shape.num_heads
        if not head_dim_fits(kv_dtype, head_dim):
            continue
        g = kv_geometry(dp, num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads, head_dim=head_dim,
                        num_blocks=1)
        assert g.pages_per_block >= 1 and g.page_tokens >= 1, name
