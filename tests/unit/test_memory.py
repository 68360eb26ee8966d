"""The manifest's ``memory`` section: the host's resident set and the accelerator's peak counters."""
import numpy as np
import pytest
import torch

from bertology.memory import MemoryWatch, host_peak_rss_mib, host_rss_mib

needs_proc = pytest.mark.skipif(host_rss_mib() is None, reason="reads /proc/self/status (Linux)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: reads its peak counters")


@needs_proc
def test_touched_memory_shows_in_the_resident_set_and_its_peak():
    before = host_rss_mib()
    block = np.ones(96 * 2**20 // 8)  # 96 MiB, every page written
    during = host_rss_mib()
    assert during - before > 64  # resident (not merely reserved): most of the 96 MiB
    assert host_peak_rss_mib() >= during
    del block


def test_a_cpu_run_records_the_host_only():
    rec = MemoryWatch.start("cpu").record()
    assert rec["device"] == "cpu" and not any(k.startswith("device_") for k in rec)
    if rec["host_peak_rss_mib"] is not None:
        assert rec["host_peak_rss_mib"] >= rec["host_rss_at_start_mib"] > 0
    assert MemoryWatch.start(None).device == torch.device("cpu")


@needs_cuda
def test_the_cuda_peak_counts_from_the_start_of_the_run():
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB before the run: not its peak
    del big
    watch = MemoryWatch.start("cuda")
    small = torch.empty(32 * 2**20, dtype=torch.uint8, device="cuda")
    rec = watch.record()
    del small
    assert 32 <= rec["device_peak_allocated_mib"] < 256
    assert rec["device_peak_reserved_mib"] >= rec["device_peak_allocated_mib"]
