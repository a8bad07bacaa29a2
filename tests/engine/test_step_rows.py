"""engine.engine.rows_by_seq: a step's output rows go to its sequences as the plan says
(``SeqStep.num_rows`` each, in step order), and a run that returns another count is an error."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath.engine.engine import rows_by_seq
from dualpath.scheduler.batch import SeqStep


def steps() -> list[SeqStep]:
    return [SeqStep(None, 0, [5, 6, 7], None, logits=False),             # a prompt chunk: no row
            SeqStep(None, 1, [8], None, logits=True),                     # a decode token: one row
            SeqStep(None, 2, [9, 10, 11], None, logits=True, draft=2),    # two proposals: three rows
            SeqStep(None, 3, [12, 13], None, logits=True, hidden=True)]   # every token's row


def test_each_sequence_gets_its_num_rows_rows_in_step_order():
    seqs = steps()
    logits = np.arange(6 * 2, dtype=np.float32).reshape(6, 2)  # (R, vocab)
    hidden = -np.arange(6 * 3, dtype=np.float32).reshape(6, 3)  # (R, dim)
    got = [(s.seq_id, rows[:, 0].tolist(), h[:, 0].tolist()) for s, rows, h in rows_by_seq(seqs, logits, hidden)]
    assert got == [(0, [], []), (1, [0.0], [-0.0]), (2, [2.0, 4.0, 6.0], [-3.0, -6.0, -9.0]),
                   (3, [8.0, 10.0], [-12.0, -15.0])]


def test_a_run_with_another_row_count_than_the_plan_is_refused_naming_both():
    with pytest.raises(RuntimeError, match="returned 5 logits rows; the step's plan has 6"):
        list(rows_by_seq(steps(), np.zeros((5, 2), np.float32), np.zeros((6, 3), np.float32)))
