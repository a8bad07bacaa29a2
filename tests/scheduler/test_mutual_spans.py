"""Spans of mutual attention (``Request.mutual``: Gemma 3's image rows attend to each other):
a prompt chunk never ends inside one it did not start in, and each row of a span is laid
out as a one-row entry at the span's last position, so it sees the whole span."""

import numpy as np

from dualpath.scheduler.request import Request
from dualpath.scheduler.step import StepArrays


def test_a_chunk_stops_before_a_span_it_would_cut():
    r = Request("r", list(range(100)), 512)
    r.mutual = ((30, 60),)
    assert r.chunk_tokens(0, 40) == 30   # the span starts the next chunk, whole
    assert r.chunk_tokens(0, 60) == 60   # the span ends the chunk
    assert r.chunk_tokens(0, 70) == 70
    assert r.chunk_tokens(30, 16) == 16  # a span longer than a chunk: cut where the chunk must end
    assert r.chunk_tokens(35, 10) == 10  # (a chunk that starts inside it: the prefix cache held its start)
    assert r.chunk_mutual(20, 50) == ((10, 30),) and r.chunk_mutual(40, 70) == ((0, 20),)
    assert r.chunk_mutual(60, 90) == ()


def test_a_spans_rows_are_entries_at_its_last_position():
    arrays = StepArrays(64, 4, 256, 16)
    # a chunk of 8 tokens at step row 3 and position 10; its tokens 2..4 are a span (positions 12..14)
    E = arrays._mutual_entries(0, ((2, 5),), row=3, n=8, pos0=10, span=7, ns=2)
    assert E == 5
    want = [(3, 2, 10, 7, 2),                             # the rows before: one causal entry
            (5, 1, 14, 7, 2), (6, 1, 14, 7, 2), (7, 1, 14, 7, 2),  # each sees position 14
            (8, 3, 15, 7, 2)]                             # the rows after: causal again
    assert np.array_equal(arrays.seqs[:E], np.array(want))
    E = arrays._mutual_entries(0, ((0, 8),), row=0, n=8, pos0=0, span=0, ns=1)  # the chunk is the span
    assert E == 8 and (arrays.seqs[:8, 2] == 7).all() and (arrays.seqs[:8, 1] == 1).all()
