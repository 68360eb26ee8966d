"""compare's streaming pass and compute phase run NumPy's BLAS on one thread; the computes run side by side."""
import threading
import time

import pandas as pd
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from bertology.activations.extract import run_analyses
from bertology.analyses.base import Analysis
from bertology.blas import one_blas_thread
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.models.pair import ModelPair
from bertology.commands.compare import finish_analyses
from bertology.results import Result
from bertology.testing import SENTENCES


def blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


class Recorder(Analysis):
    """Records the BLAS threads and the thread it ran on; ``delay`` seconds of sleep in compute()."""

    requires = frozenset({"hidden_states"})

    def __init__(self, name: str, delay: float = 0.0, fail: bool = False) -> None:
        self.name, self.delay, self.fail = name, delay, fail
        self.seen_update: list[set[int]] = []
        self.seen_compute: set[int] | None = None
        self.thread: int | None = None
        self.finished_at = 0.0

    def update(self, batch) -> None:
        self.seen_update.append(blas_threads())

    def compute(self) -> Result:
        self.seen_compute, self.thread = blas_threads(), threading.get_ident()
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        self.finished_at = time.perf_counter()
        return Result(self.name, pd.DataFrame({"value": [len(self.seen_update)]}))

    def merge(self, other):
        return self


@pytest.fixture
def two_blas_threads():
    if not blas_threads():
        pytest.skip("no BLAS library visible to threadpoolctl")
    with threadpool_limits(2, user_api="blas"):
        yield


def test_the_streaming_pass_runs_blas_on_one_thread_and_restores_it(two_blas_threads, planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    rec = Recorder("rec")
    run_analyses(pair, encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer), [rec], batch_size=4)
    assert len(rec.seen_update) == -(-len(SENTENCES) // 4) and all(s == {1} for s in rec.seen_update)
    assert blas_threads() == {2}


def test_computes_run_side_by_side_and_come_back_in_order(two_blas_threads, monkeypatch):
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    slow, fast = Recorder("slow", delay=0.5), Recorder("fast")
    timings: dict[str, float] = {}
    out = finish_analyses([slow, fast], timings)
    assert list(out) == ["slow", "fast"]  # todo's order, although fast finished first
    assert fast.finished_at < slow.finished_at and slow.thread != fast.thread
    assert slow.seen_compute == fast.seen_compute == {1} and blas_threads() == {2}
    assert timings["compute:slow"] >= 0.5 > timings["compute:fast"]


def test_a_failing_compute_is_raised_and_blas_is_restored(two_blas_threads):
    with pytest.raises(RuntimeError, match="broken failed"):
        finish_analyses([Recorder("ok"), Recorder("broken", fail=True)])
    assert blas_threads() == {2}


def test_nested_blocks_in_threads_leave_one_thread_until_the_outer_block_ends(two_blas_threads):
    """The pattern the compute phase relies on: inner blocks entered and left in any order inside an outer one."""
    seen = []
    barrier = threading.Barrier(2)

    def inner(wait: float) -> None:
        with one_blas_thread():
            barrier.wait()
            time.sleep(wait)
        seen.append(blas_threads())

    with one_blas_thread():
        threads = [threading.Thread(target=inner, args=(w,)) for w in (0.0, 0.2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert blas_threads() == {1}
    assert seen == [{1}, {1}] and blas_threads() == {2}
