"""ModelRunner's IOBindings on stories260K: one binding object per part and session set,
rebound in place as the step size changes, giving the logits fresh bindings give."""

from __future__ import annotations

import numpy as np
import pytest

import dualpath
from dualpath.executor import session
from dualpath.executor.session import ModelRunner, create_sessions
from dualpath.graph.parts import graph_parts
from dualpath.scheduler.step import SeqStep, StepPlan

PROMPTS = {"a": [1, 403, 2, 40, 365, 8, 70], "b": [1, 87, 30, 211, 5], "c": [1, 9, 250, 17, 61, 300, 44, 12, 3,
                                                                           90, 101, 7], "d": [1, 5, 6, 7, 8, 9, 10]}
# Each step: (sequence, tokens: "prompt[i:j]" as (i, j) or "decode", wants logits). T and R vary,
# and sizes seen before come back after others (a stale shape would show there).
STEPS = [
    [("a", (0, 7), True)],                                          # T 7, R 1
    [("a", "decode", True), ("b", (0, 5), True)],                   # T 6, R 2
    [("a", "decode", True), ("b", "decode", True), ("c", (0, 3), False)],  # T 5, R 2
    [("a", "decode", True)],                                        # T 1, R 1
    [("a", "decode", True), ("b", "decode", True), ("c", (3, 12), True)],  # T 11, R 3
    [("a", "decode", True), ("b", "decode", True), ("c", "decode", True)],  # T 3, R 3
    [("d", (0, 7), True)],                                          # T 7, R 1 again
    [("a", "decode", True), ("b", "decode", True), ("c", "decode", True), ("d", "decode", True)],  # T 4, R 4
    [("a", "decode", True)],                                        # T 1, R 1 again
]


def make_runner(gguf_path) -> ModelRunner:
    cfg = dualpath.load_config(None, {"runtime.max_context_tokens": 64, "runtime.max_num_seqs": 4,
                                      "runtime.kv_cache_tokens": 1024, "kv_cache.block_bytes": 4096})
    return dualpath.LLM(gguf_path, cfg).runner


def serve(runner: ModelRunner, fresh: bool, all_rows_at: int = -1) -> list[np.ndarray]:
    """Run STEPS; with ``fresh``, every step builds new bindings (the reference)."""
    cache = runner.cache
    seq_ids = {name: cache.new_seq_id() for name in PROMPTS}
    for sid in seq_ids.values():
        cache.start(sid, [])
    last = {}
    out = []
    for i, step in enumerate(STEPS):
        plan = []
        for name, what, logits in step:
            tokens = [last[name]] if what == "decode" else PROMPTS[name][what[0]:what[1]]
            plan.append(SeqStep(None, seq_ids[name], tokens, cache.allocate(seq_ids[name], tokens), logits))
        if fresh:
            runner._bindings.clear()
        plan = StepPlan(plan)
        runner.scheduler.arrays.fill(plan, cache, all_rows=i == all_rows_at)
        rows = runner.run(plan).copy()
        runner.scheduler.update_from_output(plan)
        plan = plan.seqs
        out.append(rows)
        r = 0
        for s, (name, _, logits) in zip(plan, step):
            if i == all_rows_at:
                r += s.num_tokens
                last[name] = int(np.argmax(rows[r - 1]))
            elif logits:
                last[name] = int(np.argmax(rows[r]))
                r += 1
    for sid in seq_ids.values():
        cache.free(sid)
    return out


def test_steps_of_varying_size_rebind_one_binding_and_match_fresh_bindings(gguf_path):
    reused, fresh = make_runner(gguf_path), make_runner(gguf_path)
    got = serve(reused, fresh=False, all_rows_at=4)
    want = serve(fresh, fresh=True, all_rows_at=4)
    assert [g.shape for g in got] == [(1, 512), (2, 512), (2, 512), (1, 512), (11, 512), (3, 512), (1, 512),
                                      (4, 512), (1, 512)]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {i}")
    # One binding for the one session set, the same IOBinding objects throughout.
    (binding,) = reused._bindings.values()
    objects = [id(b) for b in binding.bindings]
    again = serve(reused, fresh=False)
    assert [id(b) for b in next(iter(reused._bindings.values())).bindings] == objects
    for i, (g, w) in enumerate(zip(again, want)):  # the same steps, step 4 without all_rows
        if i != 4:
            np.testing.assert_array_equal(g, w, err_msg=f"step {i}")


def test_a_new_session_set_gets_its_own_binding_never_the_old_one(gguf_path):
    runner = make_runner(gguf_path)
    first = serve(runner, fresh=False)
    old = runner._bindings[id(runner.sessions)]
    parts = graph_parts(runner.spec, 4, runner.max_context_tokens)
    # Another set of the same parts (as check_placement swaps in a fallback), built as the first.
    runner.runner.sessions = create_sessions(parts, session._global_pool_threads or 1, prepack_float=True)
    second = serve(runner, fresh=False)
    new = runner._bindings[id(runner.sessions)]
    assert new is not old and new.sessions is runner.sessions
    assert all(run.__self__ is s for (run, _, _), s in zip(new.plan, runner.sessions))
    for i, (a, b) in enumerate(zip(first, second)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {i}")


@pytest.mark.parametrize("size", [1, 3])
def test_a_binding_resized_back_binds_the_original_shapes(gguf_path, size):
    runner = make_runner(gguf_path)
    b = runner._binding(size, 1, runner.sessions, None)
    runner._binding(9, 2, runner.sessions, None)
    assert runner._binding(size, 1, runner.sessions, None) is b
    assert (b.num_tokens, b.num_rows) == (size, 1)
    assert b.ids.shape == (size,) and b.h0.shape == (size, runner.spec.config.dim)
