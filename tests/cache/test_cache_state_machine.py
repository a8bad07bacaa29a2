"""The dual-path cache against a pure-Python model, driven by hypothesis.

The model keeps, per sequence, its token ids. The K/V of a position is a pure
function of the token prefix up to it (as in a real model), so pages reused
through the prefix table must hold exactly what the model expects. After every
step every live sequence is read back through the kernel view (spans) and
compared bit-exactly, and the bookkeeping invariants are checked.
"""

import hashlib

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dualpath.cache.manager import KVCacheManager, NoRoom
from dualpath.cache.policy import Path
from dualpath.config import KVCacheConfig

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 32
KV_DIM = KV_HEADS * HEAD_DIM
STEPS = {"count": 0}
BASE = [1, 2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2, 1, 0, 2, 1, 1, 2, 0]
# Half the prompts share a prefix of BASE, so the prefix table is really exercised.
PROMPTS = st.one_of(
    st.lists(st.integers(0, 2), min_size=1, max_size=20),
    st.tuples(st.integers(1, 20), st.lists(st.integers(0, 2), max_size=6)).map(lambda t: BASE[: t[0]] + t[1]),
)


def kv_of(prefix: tuple[int, ...]) -> np.ndarray:
    """(LAYERS, 2, KV_DIM) f32: K and V of the last token of `prefix`, per layer."""
    seed = int.from_bytes(hashlib.blake2b(repr(prefix).encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal((LAYERS, 2, KV_DIM)).astype(np.float32)


class CacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        cfg = KVCacheConfig(block_bytes=4096, page_tokens=4, kv_dtype="f32", locality_window=8)
        # 512 bytes per token per layer -> 8 tokens per block, 2 pages per block, 24 blocks.
        self.cache = KVCacheManager(cfg, num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                    num_blocks=24)
        self.model: dict[int, list[int]] = {}
        self.next_id = 0

    def _write(self, seq_id, tokens, alloc):
        full = self.model[seq_id]
        start = len(full) - len(tokens)
        rows = np.stack([kv_of(tuple(full[: start + i + 1])) for i in range(len(tokens))])  # (n, L, 2, D)
        for layer in range(LAYERS):
            self.cache.arena.write(layer, np.ascontiguousarray(rows[:, layer, 0]),
                                   np.ascontiguousarray(rows[:, layer, 1]), alloc.slots)
        self.cache.commit(seq_id)

    @rule(prompt=PROMPTS,
          path=st.sampled_from([None, Path.SEQUENTIAL, Path.HYBRID, Path.RANDOM]))
    def start(self, prompt, path):
        STEPS["count"] += 1
        sid = self.next_id
        self.next_id += 1
        cached = self.cache.start(sid, prompt, path)
        assert 0 <= cached < len(prompt) and cached % 4 == 0
        self.model[sid] = list(prompt[:cached])
        rest = prompt[cached:]
        alloc = self.cache.allocate(sid, rest)
        if isinstance(alloc, NoRoom):
            self.cache.free(sid)
            del self.model[sid]
            return
        self.model[sid] = list(prompt)
        self._write(sid, rest, alloc)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), n=st.integers(1, 6),
          path=st.sampled_from([None, Path.SEQUENTIAL, Path.RANDOM]))
    def append(self, data, n, path):
        STEPS["count"] += 1
        sid = data.draw(st.sampled_from(sorted(self.model)))
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        alloc = self.cache.allocate(sid, tokens, path)
        if isinstance(alloc, NoRoom):
            assert alloc.needed_pages >= 1
            return
        self.model[sid].extend(tokens)
        self._write(sid, tokens, alloc)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), drafts=st.integers(1, 9), path=st.sampled_from([None, Path.SEQUENTIAL, Path.RANDOM]))
    def speculate(self, data, drafts, path):
        """Speculative decoding's step: proposals written and committed, then all but the
        accepted ones rolled back. What stays reads back exactly; freed pages are free."""
        STEPS["count"] += 1
        sid = data.draw(st.sampled_from(sorted(self.model)))
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=drafts, max_size=drafts))
        before = len(self.model[sid])
        free_before, cow_before = self.cache.free_page_count(), self.cache.cow_copies
        alloc = self.cache.allocate(sid, tokens, path)
        if isinstance(alloc, NoRoom):
            return
        self.model[sid].extend(tokens)
        self._write(sid, tokens, alloc)
        accepted = data.draw(st.integers(0, drafts))
        self.cache.truncate(sid, before + accepted)
        del self.model[sid][before + accepted:]
        if accepted == 0 and self.cache.cow_copies == cow_before:
            # Every page the proposals took is back (a copy-on-write copy of a shared last page stays).
            assert self.cache.free_page_count() == free_before

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def fork(self, data):
        STEPS["count"] += 1
        parent = data.draw(st.sampled_from(sorted(self.model)))
        child = self.next_id
        self.next_id += 1
        self.cache.fork(parent, child)
        self.model[child] = list(self.model[parent])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        STEPS["count"] += 1
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.cache.free(sid)
        del self.model[sid]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), to=st.sampled_from([Path.SEQUENTIAL, Path.RANDOM]))
    def migrate(self, data, to):
        STEPS["count"] += 1
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.cache.migrate(sid, to)  # may be NoRoom: then nothing changes

    @rule()
    def evict(self):
        STEPS["count"] += 1
        self.cache.evict_all()

    @invariant()
    def reads_back_exactly(self):
        self.cache.check_invariants()
        assert all(r >= 0 for r in self.cache.pool.page_ref)
        for sid, tokens in self.model.items():
            n = len(tokens)
            assert self.cache.seqs[sid].num_tokens == n
            spans = self.cache.spans(sid)
            assert spans[:, 1].sum() == n
            want = np.stack([kv_of(tuple(tokens[: i + 1])) for i in range(n)])  # (n, L, 2, D)
            for layer in range(LAYERS):
                k, v = self.cache.arena.gather(layer, spans, n)  # (kv_heads, n, head_dim)
                np.testing.assert_array_equal(k.transpose(1, 0, 2).reshape(n, KV_DIM), want[:, layer, 0])
                np.testing.assert_array_equal(v.transpose(1, 0, 2).reshape(n, KV_DIM), want[:, layer, 1])

    def teardown(self):
        for sid in list(self.model):
            self.cache.free(sid)
        self.cache.evict_all()
        self.cache.check_invariants()
        assert len(self.cache.free_blocks) == self.cache.num_blocks, "blocks leaked"
        assert not any(self.cache.pool.page_ref)


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestCacheStateMachine = CacheMachine.TestCase


def test_state_machine_ran_at_least_2000_steps():
    # Runs after TestCacheStateMachine in file order (pytest keeps definition order).
    assert STEPS["count"] >= 2000, STEPS["count"]
