"""The prefix cache on disk under the real model: a new process (here a new ``LLM``, with
a new arena) reads the pages an earlier one wrote, skips computing them, and generates
exactly what a process with no store generates."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import dualpath
from dualpath import SamplingParams
from dualpath.cache import disk
from dualpath.cache.policy import Path
from tests_shared import models_dir_path

MODELS = models_dir_path()
GGUF = MODELS / "stories260K.gguf"
pytestmark = pytest.mark.skipif(not GGUF.is_file(),
                                reason=f"test model not found in {MODELS} (set DUALPATH_TEST_MODELS)")

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog took it first. "
        "Lily was sad, but then the dog came back and gave her the ball. They played together all day long.")
GREEDY = SamplingParams(temperature=0, max_tokens=48)


def _config(kv_dtype="f16", path_mode="dual", **more):
    overrides = {"runtime.max_context_tokens": 512, "kv_cache.kv_dtype": kv_dtype,
                 "kv_cache.path_mode": path_mode, **more}
    return dualpath.load_config(None, overrides)


def _counting(llm):
    """Count the tokens that really go through the model."""
    seen = [0]
    run = llm.runner.run

    def counted(entries):
        seen[0] += sum(len(e.token_ids) for e in entries.seqs)
        return run(entries)

    llm.runner.run = counted
    return seen


# (path_mode, extra settings, the path the writing request takes)
PATHS = {"random": ("random", {}, Path.RANDOM),
         "sequential": ("dual", {"kv_cache.seq_path_threshold": 16}, Path.SEQUENTIAL)}


@pytest.mark.parametrize("kv_dtype", ["f16", "q8", "f32"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_restored_pages_give_the_tokens_of_a_process_with_no_store(tmp_path, kv_dtype, path):
    mode, more, taken = PATHS[path]
    cfg = _config(kv_dtype, mode, **more)
    fresh = dualpath.LLM(GGUF, cfg)
    ids = fresh.tokenize(TEXT)
    want = fresh.generate(ids, GREEDY).token_ids
    del fresh

    writer = dualpath.LLM(GGUF, cfg, prefix_cache=tmp_path)
    gen = writer.stream(ids, GREEDY)
    for _ in gen:
        pass
    assert gen.completion.token_ids == want
    assert gen.request.path is taken  # the pages were written from this path's memory
    P = writer.runner.cache.page_tokens
    writer.prefix_store.flush()
    assert writer.prefix_store.stats.pages_written == len(ids) // P  # prompt pages only, not the reply's
    del writer, gen

    reader = dualpath.LLM(GGUF, cfg, prefix_cache=tmp_path)
    ran = _counting(reader)
    c = reader.generate(ids, GREEDY)
    assert c.token_ids == want
    restored = (len(ids) - 1) // P * P
    assert c.usage.cached_prompt_tokens == restored and reader.prefix_store.stats.hit_pages == restored // P
    assert ran[0] == len(ids) - restored + len(want) - 1  # the restored tokens were not computed
    reader.runner.cache.check_invariants()

    # A longer prompt sharing the prefix reuses it too; its new full pages are written.
    longer = ids + reader.tokenize(" The next day, Lily went back to the park.", add_bos=False)
    again = dualpath.LLM(GGUF, cfg, prefix_cache=tmp_path)
    c2 = again.generate(longer, GREEDY)
    assert c2.usage.cached_prompt_tokens == len(ids) // P * P
    assert c2.token_ids == dualpath.LLM(GGUF, cfg).generate(longer, GREEDY).token_ids


def test_a_damaged_page_is_recomputed_and_the_tokens_stay_exact(tmp_path, caplog):
    cfg = _config()
    ids = dualpath.LLM(GGUF, cfg).tokenize(TEXT)
    want = dualpath.LLM(GGUF, cfg).generate(ids, GREEDY).token_ids
    writer = dualpath.LLM(GGUF, cfg, prefix_cache=tmp_path)
    writer.warm(ids)
    P = writer.runner.cache.page_tokens
    # Damage the third page (its hash chained as the manager chains it): the first two
    # are used, the rest is computed.
    cache = writer.runner.cache
    h = b""
    for i in range(3):
        h = cache.prefix.hash(h, ids[i * P:(i + 1) * P])
    path = writer.prefix_store._path(h)
    raw = bytearray(open(path, "rb").read())
    raw[-7] ^= 0xFF
    open(path, "wb").write(raw)
    reader = dualpath.LLM(GGUF, cfg, prefix_cache=tmp_path)
    c = reader.generate(ids, GREEDY)
    assert c.token_ids == want
    assert c.usage.cached_prompt_tokens == 2 * P
    assert reader.prefix_store.stats.dropped == 1 and "checksum mismatch" in caplog.text


def test_a_store_of_another_kv_type_is_never_used(tmp_path):
    ids = dualpath.LLM(GGUF, _config()).tokenize(TEXT)
    dualpath.LLM(GGUF, _config("f16"), prefix_cache=tmp_path).warm(ids)
    other = dualpath.LLM(GGUF, _config("q8"), prefix_cache=tmp_path)
    c = other.generate(ids, GREEDY)
    assert c.usage.cached_prompt_tokens == 0 and other.prefix_store.stats.hit_pages == 0
    assert len(disk.list_stores(str(tmp_path))) == 2  # the q8 pages went to their own folder


def test_warm_writes_the_prompt_pages_before_it_returns(tmp_path):
    llm = dualpath.LLM(GGUF, _config(), prefix_cache=tmp_path)
    ids = llm.tokenize(TEXT)
    P = llm.runner.cache.page_tokens
    got = llm.warm(ids)
    assert got == {"prompt_tokens": len(ids), "cached_tokens": 0, "stored_tokens": len(ids) // P * P}
    (store,) = disk.list_stores(str(tmp_path))
    assert store.pages == len(ids) // P
    assert llm.warm(ids)["cached_tokens"] == (len(ids) - 1) // P * P  # in memory now


def test_the_api_keeps_nothing_on_disk_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALPATH_CACHE_DIR", str(tmp_path / "models"))
    llm = dualpath.LLM(GGUF, _config())
    assert llm.prefix_store is None and llm.runner.cache.disk is None
    on = dualpath.LLM(GGUF, _config(**{"prefix_cache.use": "always"}))
    assert on.prefix_store.root == str(tmp_path / "prefix")  # beside the converted-model cache


_KILLED = textwrap.dedent("""
    import sys
    import dualpath
    from dualpath import SamplingParams
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 512})
    llm = dualpath.LLM(sys.argv[1], cfg, prefix_cache=sys.argv[2])
    print("ready", flush=True)
    for i in range(1000):
        llm.generate(sys.argv[3] + " " + str(i % 20), SamplingParams(temperature=0, max_tokens=2))
""")


def test_a_process_killed_while_writing_leaves_a_store_that_gives_exact_tokens(tmp_path):
    cfg = _config()
    fresh = dualpath.LLM(GGUF, cfg)
    prompts = [TEXT + " " + str(i) for i in range(20)]
    want = [fresh.generate(p, GREEDY).token_ids for p in prompts]
    rng = random.Random(3)
    restored = 0
    for trial in range(3):
        root = tmp_path / f"t{trial}"
        p = subprocess.Popen([sys.executable, "-c", _KILLED, str(GGUF), str(root), TEXT], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 1.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        llm = dualpath.LLM(GGUF, cfg, prefix_cache=root)
        for prompt, w in zip(prompts, want):
            assert llm.generate(prompt, GREEDY).token_ids == w
        assert llm.prefix_store.stats.dropped == 0
        restored += llm.prefix_store.stats.hit_pages
    assert restored > 0, "no trial left a page to restore: the test did not test what it says"
