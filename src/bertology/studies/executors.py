"""Executors: where a batch of independent study jobs runs — here, one after another (``local``), or on Ray.

One interface, :meth:`Executor.run` ``(jobs) -> list[JobResult]`` in the jobs' order. A job that raises
is a ``failed`` result with its error (type and message); the other jobs still run.

``ray``: each job is a Ray task declaring the job's ``num_cpus``/``num_gpus``. **The study folder must be
on a filesystem every Ray worker sees** (the same path on every node: a local instance, NFS, a cluster's
shared disk): jobs write their run folders there directly, and the driver reads the tables back from
it. Nothing large travels through Ray's object store; a job returns only a small dict (metrics, table
names). Ray is an optional extra: ``pip install 'bertology[ray]'``.
"""
from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bertology.errors import BertologyError
from bertology.results import now_iso
from bertology.studies.jobs import Job

logger = logging.getLogger(__name__)
EXECUTORS = ("local", "ray")
RAY_MISSING = "--executor ray needs Ray, an optional extra: pip install 'bertology[ray]'."


@dataclass
class JobResult:
    """How one job ended: ``done`` or ``failed`` (with the error), its wall time, when it ended and its small return value."""

    id: str
    status: str
    error: str | None = None
    wall_time_s: float = 0.0
    value: dict = field(default_factory=dict)
    finished: str | None = None  # ISO time the job ended (on the machine that ran it)


def execute(job: Job, progress: bool = False) -> JobResult:
    """Run one job, turning any exception into a ``failed`` result (what both executors call)."""
    t0 = time.perf_counter()
    try:
        value = job.run(progress=progress)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - a failing job is reported, the study goes on
        logger.debug("job %s failed:\n%s", job.id, traceback.format_exc())
        message = " ".join(str(err).split())
        return JobResult(job.id, "failed", f"{type(err).__name__}: {message}", round(time.perf_counter() - t0, 2),
                         finished=now_iso())
    return JobResult(job.id, "done", None, round(time.perf_counter() - t0, 2), value, now_iso())


class Executor(Protocol):
    name: str

    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        """Run independent jobs; one result per job, in the jobs' order."""
        ...

    def close(self) -> None:
        ...


class LocalExecutor:
    """Sequential, in this process, with the jobs' own progress bars (the default; what tests and the demo use)."""

    name = "local"

    def __init__(self, progress: bool = False) -> None:
        self.progress = progress

    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        results = []
        for i, job in enumerate(jobs, 1):
            logger.info("job %d/%d: %s", i, len(jobs), job.id)
            results.append(execute(job, progress=self.progress))
            if results[-1].status == "failed":
                logger.warning("job %s failed: %s", job.id, results[-1].error)
        return results

    def close(self) -> None:
        pass


def _ray():
    try:
        import ray
    except ImportError:
        raise BertologyError(RAY_MISSING) from None
    return ray


class RayExecutor:
    """Each job a Ray task (``num_cpus``/``num_gpus`` from the job); the study folder on a shared filesystem.

    ``address``: ``None`` starts a local instance (``num_cpus`` caps it), ``"auto"`` joins the cluster this
    machine belongs to, ``"HOST:PORT"`` a given one. A Ray already initialised in this process is used as it
    is (and left running); one this executor started is shut down by :meth:`close`.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.ray = _ray()
        self.started = False
        if not self.ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": num_cpus}
            try:
                self.ray.init(**kwargs, include_dashboard=False, log_to_driver=False)
            except ConnectionError as err:
                raise BertologyError(f"Cannot reach the Ray cluster at {address!r}: {err}") from None
            self.started = True

    def run(self, jobs: Sequence[Job]) -> list[JobResult]:
        ray = self.ray
        remote = ray.remote(execute)
        refs = {remote.options(num_cpus=j.num_cpus, num_gpus=j.num_gpus, max_retries=0).remote(j): j for j in jobs}
        results: dict[str, JobResult] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            job = refs[ready[0]]
            try:
                results[job.id] = ray.get(ready[0])
            except Exception as err:  # noqa: BLE001 - the worker itself died (out of memory, killed)
                results[job.id] = JobResult(job.id, "failed", f"{type(err).__name__}: {' '.join(str(err).split())[:500]}",
                                            finished=now_iso())
            logger.info("job %s: %s (%d of %d finished)", job.id, results[job.id].status, len(results), len(jobs))
        return [results[j.id] for j in jobs]

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False


def make_executor(name: str, *, ray_address: str | None = None, progress: bool = False) -> Executor:
    """The executor called ``name``; one clear error for an unknown one or a missing Ray."""
    if name == "local":
        if ray_address:
            raise BertologyError("--ray-address is for --executor ray.")
        return LocalExecutor(progress=progress)
    if name == "ray":
        return RayExecutor(address=ray_address)
    raise BertologyError(f"Unknown executor {name!r}; choose from: {', '.join(EXECUTORS)}.")
