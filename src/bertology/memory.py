"""Peak memory of a run, for its manifest: the accelerator's and the host's.

A user sizing a GPU for BERT-large or a study of many fine-tunes needs to know what a run held at its
peak, and a claim that memory is bounded in corpus size needs a number per run to check it against.

- Device (CUDA): ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since the run began (the
  counters are reset when it starts: they are process-wide, so a caller timing its own work around a run
  sees the run's peak afterwards). MPS has no peak counter: its current allocation at the end is recorded,
  named so. On the CPU the device is the host: no device record.
- Host: the process's peak resident set (``VmHWM`` in ``/proc/self/status``, or ``ru_maxrss`` where there
  is no ``/proc``). This is the peak since the *process* started, which in a notebook may predate the run;
  the resident set at the run's start is recorded beside it, so a reader can tell (a peak equal to the
  start value says the run added nothing above it). Not reset: resetting another program's high-water
  mark (``/proc/self/clear_refs``) would change what its own measurements read.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

_MIB = 2**20


def _status_kib(key: str) -> float | None:
    """A ``kB`` line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None without ``/proc``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def host_rss_mib() -> float | None:
    """The process's resident set now, MiB (None where the platform does not say)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


def host_peak_rss_mib() -> float | None:
    """The process's peak resident set since it started, MiB (``VmHWM``, else ``ru_maxrss``)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib / 1024
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / _MIB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def _device_of(device: str | torch.device | None) -> torch.device:
    return torch.device("cpu") if device in (None, "") else torch.device(device)


@dataclass
class MemoryWatch:
    """What a run held at its peak: start it when the run begins, :meth:`record` when it ends."""

    device: torch.device
    host_start_mib: float | None = field(default=None, init=False)

    @classmethod
    def start(cls, device: str | torch.device | None) -> "MemoryWatch":
        """Begin watching: reset the CUDA peak counters of ``device`` and note the host's resident set."""
        watch = cls(_device_of(device))
        if watch.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(watch.device)
        watch.host_start_mib = host_rss_mib()
        return watch

    def record(self) -> dict:
        """The manifest's ``memory`` section (MiB, rounded to 0.1)."""

        def mib(x: float | None) -> float | None:
            return None if x is None else round(x, 1)

        out: dict = {
            "host_peak_rss_mib": mib(host_peak_rss_mib()),
            "host_rss_at_start_mib": mib(self.host_start_mib),
            "device": str(self.device),
        }
        kind = self.device.type
        if kind == "cuda" and torch.cuda.is_available():
            out["device_peak_allocated_mib"] = mib(torch.cuda.max_memory_allocated(self.device) / _MIB)
            out["device_peak_reserved_mib"] = mib(torch.cuda.max_memory_reserved(self.device) / _MIB)
        elif kind == "mps" and hasattr(torch, "mps") and torch.backends.mps.is_available():
            out["device_allocated_at_end_mib"] = mib(torch.mps.current_allocated_memory() / _MIB)
        out["note"] = NOTE
        return out


NOTE = ("host_peak_rss_mib is the process's peak since it started (it may predate this run; compare "
        "host_rss_at_start_mib); device_peak_* are CUDA's peak counters since the run began (absent on the CPU, "
        "where the device is the host; MPS has no peak counter: its allocation at the end)")
