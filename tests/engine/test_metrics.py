"""The engine's step log: a fixed ring of the last STEP_LOG steps, oldest first."""

import numpy as np

from dualpath.engine import metrics
from dualpath.engine.metrics import EngineMetrics


def test_the_step_log_keeps_the_last_steps_in_order_and_never_grows(monkeypatch):
    monkeypatch.setattr(metrics, "STEP_LOG", 8)
    m = EngineMetrics()
    seconds, tokens = m.step_log()
    assert len(seconds) == len(tokens) == 0
    for i in range(5):
        m.on_step(now=float(i), seconds=i / 1000, tokens=i, generated=1)
    seconds, tokens = m.step_log()
    assert tokens.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(seconds, [0, 0.001, 0.002, 0.003, 0.004], rtol=1e-6)
    buffers = (m._step_seconds, m._step_tokens)
    for i in range(5, 21):
        m.on_step(now=float(i), seconds=i / 1000, tokens=i, generated=1)
    seconds, tokens = m.step_log()
    assert tokens.tolist() == list(range(13, 21))  # the last 8, oldest first
    np.testing.assert_allclose(seconds, np.arange(13, 21) / 1000, rtol=1e-6)
    assert m._step_seconds is buffers[0] and m._step_tokens is buffers[1]  # the same arrays: no growth
    assert m.steps == 21
