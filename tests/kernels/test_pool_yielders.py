"""Threads registered with ``ThreadPool.set_yielders`` are under SCHED_IDLE while a pool
job that wakes the workers runs, and back under their own policy when it ends; bad
registrations are refused, and a thread that has exited is skipped."""

import os
import threading

import numpy as np
import pytest

from dualpath.kernels import ThreadPool

needs_unidle = pytest.mark.skipif(
    not ThreadPool.can_unidle(),
    reason="this process may not take a thread out of SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE below 20)")


class Sleeper:
    """A thread that waits on an event: a yielder whose policy a test can read."""

    def __init__(self):
        self.stop = threading.Event()
        started = threading.Event()

        def run():
            started.set()
            self.stop.wait()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait()
        self.tid = self.thread.native_id

    def close(self):
        self.stop.set()
        self.thread.join()


@needs_unidle
def test_a_yielder_is_idle_during_a_job_and_back_after():
    pool = ThreadPool(2)
    sleeper = Sleeper()
    try:
        assert os.sched_getscheduler(sleeper.tid) == os.SCHED_OTHER
        pool.set_yielders([sleeper.tid])
        seen = set()
        done = threading.Event()

        def watch():
            while not done.is_set():
                seen.add(os.sched_getscheduler(sleeper.tid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        buf = np.ones(32 << 20, np.uint8)  # read on both threads, GIL released: the watcher runs
        for _ in range(20):
            pool.read(buf)
        done.set()
        watcher.join()
        assert os.SCHED_IDLE in seen
        assert os.sched_getscheduler(sleeper.tid) == os.SCHED_OTHER
        pool.set_yielders([])  # cleared: a job leaves it alone
        seen.clear()
        done.clear()
        watcher = threading.Thread(target=watch)
        watcher.start()
        for _ in range(5):
            pool.read(buf)
        done.set()
        watcher.join()
        assert seen == {os.SCHED_OTHER}
    finally:
        sleeper.close()


@needs_unidle
def test_a_batch_yielder_goes_back_to_batch_and_an_exited_one_is_skipped():
    pool = ThreadPool(2)
    batch, gone = Sleeper(), Sleeper()
    gone_tid = gone.tid
    gone.close()
    try:
        os.sched_setscheduler(batch.tid, os.SCHED_BATCH, os.sched_param(0))
        pool.set_yielders([batch.tid, gone_tid])
        pool.read(np.ones(1 << 20, np.uint8))
        assert os.sched_getscheduler(batch.tid) == os.SCHED_BATCH
    finally:
        batch.close()


def test_bad_yielders_are_refused_naming_the_problem():
    pool = ThreadPool(2)
    with pytest.raises(ValueError, match="positive"):
        pool.set_yielders([0])
    with pytest.raises(ValueError, match="at most"):
        pool.set_yielders(list(range(1, 1000)))


def test_can_unidle_leaves_the_calling_thread_as_it_was():
    before = os.sched_getscheduler(0)
    assert ThreadPool.can_unidle() in (True, False)
    assert os.sched_getscheduler(0) == before
