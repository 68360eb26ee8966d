"""``run_study``: fine-tune what is missing, then compare every model with the base, and the seeds with each other.

The study folder::

    study.toml                      copy of the spec
    manifest.json                   kind "study": tasks, models, pairs, seed_pairs, jobs (status, error, wall time)
    finetune/<task>/s<seed>/        a bertology finetune run folder (model/ inside)
    compare/                        compare_many: the base against every tuned model ("<task>/s<seed>")
    compare_own/<task>/             compare_many on the task's own eval_data ([compare] own_data; Merchant et al. 2020)
    seeds/<task>/s<a>/              compare_many: seed a's model against every later seed b of the task
    seeds_own/<task>/s<a>/          the same on the task's own eval_data ([compare] own_seed_noise)
    tables/<table>.parquet          the base-vs-tuned tables (tuned, task, seed first)
    tables/seedpair_<table>.parquet the seed-vs-seed tables (task, seed_a, seed_b first)
    tables/own_<table>.parquet      every task's own-data tables, concatenated (tuned, task, seed first)
    tables/own_seedpair_<table>     every task's own-data seed-vs-seed tables (task, seed_a, seed_b first)
    tables/study_*.parquet          the seed-noise statistics (bertology.studies.noise), on the shared corpus;
                                    own_study_* on the tasks' own dev data, study_*_ood on the ood corpus
    jobs/<job>.json                 each finished job's fingerprint and wall time: a rerun skips it ("cached")

Two waves of jobs go through the executor: every fine-tune, then every comparison. A job whose
fingerprint matches a finished one is ``cached`` and not run; a failed job is recorded with its error,
the comparisons that need its model are ``skipped`` (the base-vs-tuned comparison leaves that model out),
and a rerun retries it.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bertology.errors import BertologyError, check_choice
from bertology.results import atomic_write_text, now_iso, write_table
from bertology.runs import LOCK, RunResult, lock_folder
from bertology.studies.executors import EXECUTORS, Executor, JobResult, LocalExecutor, make_executor  # noqa: F401  (LocalExecutor re-exported)
from bertology.studies.checks import check_study
from bertology.studies.jobs import CompareJob, FinetuneJob, compare_job, finetune_jobs, model_identity
from bertology.studies.spec import StudySpec, load_spec
from bertology.studies.verify import describe_files, outputs_problem, weights_identity

logger = logging.getLogger(__name__)
KIND = "study"


@dataclass
class JobRecord:
    """One job's line in the manifest.

    ``wall_time_s`` is the time the job took when it ran: in this run, or for a ``cached`` job in the run
    that ``finished`` it (from ``jobs/<id>.json``; None when that file predates the timing).
    """

    id: str
    kind: str
    status: str  # done, cached, failed, skipped
    error: str | None = None
    wall_time_s: float | None = 0.0
    finished: str | None = None  # when the job finished (ISO time); for a cached job, in an earlier run
    reason: str | None = None  # why it ran again (outputs lost, settings changed, an earlier run stopped)

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "status": self.status, "error": self.error,
                "wall_time_s": self.wall_time_s, "finished": self.finished, "reason": self.reason}


@dataclass
class StudyResult(RunResult):
    """A study: its folder (``out``), its study-level tables, its manifest, every job's record and the report."""

    jobs: list[JobRecord] = field(default_factory=list)
    report: Path | None = None

    @property
    def failed(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.status == "failed"]

    def statuses(self) -> dict[str, str]:
        return {j.id: j.status for j in self.jobs}


def _marker(study: Path, job_id: str) -> Path:
    return study / "jobs" / (job_id.replace(":", "__").replace("/", "~") + ".json")


def _previous(study: Path, job: FinetuneJob | CompareJob) -> tuple[JobRecord | None, str | None]:
    """The job's ``cached`` record when a finished run of it verifies; else None and why it runs (None: never ran).

    Verified means: the same fingerprint, and every file the job promised (:mod:`bertology.studies.verify`)
    present with its recorded size and contents. A job whose outputs do not verify has its folder removed
    so it runs afresh: a lost model is retrained, not trusted as cached and failing every comparison.
    """
    path = _marker(study, job.id)
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, ("resumed: an earlier run stopped before this job finished" if Path(job.out).exists() else None)
    except (OSError, ValueError):
        return None, f"its record {_rel(study, str(path))} is unreadable"
    if not isinstance(done, dict) or done.get("fingerprint") != job.fingerprint:
        return None, "settings, data or input models changed since its earlier run"
    outputs = done.get("outputs")
    if outputs is None:  # written by a bertology that did not record outputs: trust what is there, record it now
        if not job.finished():
            return _refresh(study, job, "its outputs are gone")
        outputs = describe_files(study, job.outputs())
        atomic_write_text(path, json.dumps({**done, "outputs": outputs}, indent=2, default=str))
    problem = outputs_problem(study, outputs)
    if problem is not None:
        return _refresh(study, job, problem)
    wall = done.get("wall_time_s")
    return JobRecord(job.id, job.kind, "cached", wall_time_s=float(wall) if isinstance(wall, (int, float)) else None,
                     finished=done.get("finished")), None


def _refresh(study: Path, job: FinetuneJob | CompareJob, problem: str) -> tuple[None, str]:
    """Remove what is left of a finished job whose outputs do not verify, so it runs from scratch; the reason."""
    logger.warning("job %s is run again: %s", job.id, problem)
    shutil.rmtree(job.out, ignore_errors=True)
    return None, f"run again from scratch: {problem}"


def _record_done(study: Path, job: FinetuneJob | CompareJob, result: JobResult) -> None:
    atomic_write_text(_marker(study, job.id), json.dumps(
        {"id": job.id, "fingerprint": job.fingerprint, "finished": result.finished or now_iso(),
         "wall_time_s": result.wall_time_s, "value": result.value,
         "outputs": describe_files(study, job.outputs())}, indent=2, default=str))


def trained_identity(study: Path, job: FinetuneJob) -> str:
    """A model the study trained, as comparisons' fingerprints see it: its weights' recorded hashes.

    Falls back to the fine-tune's fingerprint when the marker records no weights.
    """
    try:
        outputs = json.loads(_marker(study, job.id).read_text(encoding="utf-8")).get("outputs") or {}
    except (OSError, ValueError, AttributeError):
        outputs = {}
    return weights_identity(outputs, _rel(study, str(job.model_dir))) or job.fingerprint


def _run_wave(study: Path, jobs: list, executor: Executor) -> dict[str, JobRecord]:
    """Run the jobs that are not cached; every job's record (with why a job ran again, where it did)."""
    records: dict[str, JobRecord] = {}
    reasons: dict[str, str | None] = {}
    for job in jobs:
        cached, reasons[job.id] = _previous(study, job)
        if cached is not None:
            records[job.id] = cached
    todo = [j for j in jobs if j.id not in records]
    for j in todo:
        _marker(study, j.id).unlink(missing_ok=True)  # not finished until this run says so
    for job, res in zip(todo, executor.run(todo)):
        records[job.id] = JobRecord(job.id, job.kind, res.status, res.error, res.wall_time_s, res.finished,
                                    reason=reasons[job.id])
        if res.status == "done":
            _record_done(study, job, res)
    return {j.id: records[j.id] for j in jobs}


def prepare_folder(study: Path, spec: StudySpec, overwrite: bool) -> dict:
    """Take ``study`` for this study: refuse a folder of something else; ``overwrite`` starts it afresh.

    Returns the manifest an earlier run left (empty for a new study), before this run marks it ``running``."""
    manifest = study / "manifest.json"
    previous = _earlier_manifest(manifest)
    if study.exists() and any(p.name != LOCK for p in study.iterdir()):
        if previous.get("kind") != KIND and not overwrite:
            raise BertologyError(f"{study} is not empty and holds no study; choose another --out or pass --overwrite.")
        if overwrite:  # everything but the lock this study holds
            for entry in study.iterdir():
                if entry.name != LOCK:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            previous = {}
    study.mkdir(parents=True, exist_ok=True)
    if spec.path is not None:
        shutil.copyfile(spec.path, study / "study.toml")
    else:  # a dict spec: the TOML it stands for
        atomic_write_text(study / "study.toml", spec.text or "")
    # marked as a study from the start, so a rerun after a kill recognises the folder and resumes it
    atomic_write_text(manifest, json.dumps({**previous, "kind": KIND, "status": "running", "started": now_iso()}, indent=2))
    return previous


def _earlier_manifest(path: Path) -> dict:
    """The manifest an earlier run left, or {} when there is none or it is not a readable JSON object."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def run_study(spec: StudySpec | str | Path | Mapping[str, Any], out: str | Path | None = None, *,
              executor: Executor | str | None = None,
              ray_address: str | None = None, overwrite: bool = False, progress: bool = False) -> StudyResult:
    """Run a study (see module docs): every check first, then the fine-tunes, then the comparisons, then the tables.

    ``executor`` is an :class:`Executor` or its name (``local``, ``ray``; ``ray_address``: the cluster to
    join); one made here from a name is started after every check and closed at the end.
    """
    if isinstance(executor, str):
        check_choice(executor, EXECUTORS, "executor", "--executor")
    spec = spec if isinstance(spec, StudySpec) else load_spec(spec)
    out = Path(out).expanduser() if out is not None else spec.out
    if out is None:
        raise BertologyError("No study folder: set out = \"...\" in the spec or pass --out.")
    # every check a job would make that needs no training: one error before the folder is touched (the devices are
    # this machine's only when the jobs run here)
    check_study(spec, here=executor in (None, "local") or isinstance(executor, LocalExecutor))
    if executor is None or isinstance(executor, str):
        made = make_executor(executor or "local", ray_address=ray_address, progress=progress)
        try:
            return _run_study(spec, out, made, overwrite)
        finally:
            made.close()
    return _run_study(spec, out, executor, overwrite)


def _run_study(spec: StudySpec, out: Path, executor: Executor, overwrite: bool) -> StudyResult:
    """One writer per study folder: the folder's lock (as a single run's) is held from the first write to the
    last, so a second study into it, or an unwritable ``--out``, is one clear error before any job runs."""
    lock = lock_folder(out.resolve())
    try:
        return _run_locked(spec, out.resolve(), executor, overwrite)
    finally:
        lock.release()


def _run_locked(spec: StudySpec, study: Path, executor: Executor, overwrite: bool) -> StudyResult:
    t0 = time.perf_counter()
    previous = prepare_folder(study, spec, overwrite)
    base_id = model_identity(spec.base)

    ft_jobs = finetune_jobs(spec, study)
    records = _run_wave(study, ft_jobs, executor)
    # every model of every seed that exists now: given, or trained (this run or an earlier one)
    models: dict[tuple[str, int], tuple[str, str]] = {}  # (task, seed) -> (path, identity)
    for task in spec.tasks:
        for seed, path in task.models.items():
            models[(task.name, seed)] = (path, model_identity(path))
    for job in ft_jobs:
        if records[job.id].status in ("done", "cached"):
            models[(job.task.name, job.seed)] = (str(job.model_dir), trained_identity(study, job))

    cmp_jobs: list[CompareJob] = []
    skipped: dict[str, JobRecord] = {}
    tuned = [(f"{t.name}/s{s}", models[(t.name, s)][0], t.name, s, models[(t.name, s)][1])
             for t in spec.tasks for s in t.seeds if (t.name, s) in models]
    if tuned:
        cmp_jobs.append(compare_job(spec, "compare", "compare", spec.base, base_id, tuned, study / "compare"))
    else:
        skipped["compare"] = JobRecord("compare", "compare", "skipped", "no fine-tuned model finished")
    own_jobs = own_compare_jobs(spec, study, base_id, models, skipped)
    cmp_jobs += own_jobs
    seed_jobs, seed_pairs = seed_compare_jobs(spec, study, models, skipped)
    own_seed_jobs, own_seed_pairs = seed_compare_jobs(spec, study, models, skipped, own=True)
    cmp_jobs += seed_jobs + own_seed_jobs
    records.update(_run_wave(study, cmp_jobs, executor))
    records.update(skipped)

    ok = {j.id for j in cmp_jobs if records[j.id].status in ("done", "cached")}
    tables = collect_tables(study, [j for j in cmp_jobs if j.id in ok])
    tables.update(_noise_tables(tables))
    order = [j.id for j in ft_jobs] + ["compare"] + [f"compare_own:{t.name}" for t in spec.tasks] \
        + [k for k in records if k.startswith("seed_compare:")] + [k for k in records if k.startswith("seed_compare_own:")]
    jobs = [records[k] for k in dict.fromkeys(order) if k in records]
    complete = all(j.status in ("done", "cached") for j in jobs)
    stale = replace_tables(study, tables, complete, [j for j in jobs if j.status in ("failed", "skipped")], previous)
    main = next((j for j in cmp_jobs if j.id == "compare"), None)
    kinds = task_kinds(spec, ft_jobs, records)
    manifest = {
        "kind": KIND,
        "status": "complete" if complete else "incomplete",
        "finished": now_iso(),
        "base": spec.base,
        "spec": str(spec.path) if spec.path is not None else "a dict (study.toml holds it)",
        "tasks": [{"name": t.name, "task": kinds.get(t.name), "type": t.type, "seeds": list(t.seeds),
                   "models": {str(s): _rel(study, models[(t.name, s)][0]) for s in t.seeds if (t.name, s) in models}}
                  for t in spec.tasks],
        "pairs": [{"tuned": name, "task": task, "seed": seed,
                   "report": f"compare/pairs/{name.replace('/', '~')}/report.html" if spec.compare.report else None}
                  for name, _, task, seed in (main.tuned if main is not None and main.id in ok else ())],
        "own_pairs": [{"tuned": name, "task": task, "seed": seed,
                       "report": f"compare_own/{task}/pairs/{name.replace('/', '~')}/report.html" if spec.compare.report else None}
                      for j in own_jobs if j.id in ok for name, _, task, seed in j.tuned],
        "seed_pairs": [_drop_job(p) for p in seed_pairs if p["job"] in ok],
        "own_seed_pairs": [_drop_job(p) for p in own_seed_pairs if p["job"] in ok],
        "jobs": [j.to_dict() for j in jobs],
        "executor": getattr(executor, "name", type(executor).__name__),
        "compare": {"data": spec.compare.data, "ood_data": spec.compare.ood_data, "analyses": list(spec.compare.analyses),
                    "max_examples": spec.compare.max_examples, "own_data": spec.compare.own_data,
                    "own_seed_noise": spec.compare.own_data and spec.compare.own_seed_noise},
        "lab": spec.lab,
        "warnings": finetune_warnings(ft_jobs, records),
        "tables": sorted(tables),
        "stale_tables": stale,
        "wall_time_s": round(time.perf_counter() - t0, 2),
    }
    if "study_effects" not in tables:  # nothing to hold against seed noise: said in the manifest, the report, the CLI
        from bertology.report.study import why_no_verdicts

        manifest["no_verdicts"] = why_no_verdicts(manifest)
        logger.warning("no seed-noise verdicts on the shared corpus: %s", manifest["no_verdicts"])
    atomic_write_text(study / "manifest.json", json.dumps(manifest, indent=2, default=str))
    report = _study_report(study)
    return StudyResult(study, tables, manifest, jobs, report)


def own_compare_jobs(spec: StudySpec, study: Path, base_id: str, models: dict[tuple[str, int], tuple[str, str]],
                     skipped: dict[str, JobRecord]) -> list[CompareJob]:
    """With ``[compare] own_data``: per task with eval data, the base against the task's models on that eval data.

    Merchant et al. (2020) measure each task on its own dev data as well as on a shared corpus. A seed
    whose fine-tune failed is left out; a task with no finished model is ``skipped``.
    """
    if not spec.compare.own_data:
        return []
    jobs = []
    for task in spec.tasks:
        if not task.eval_data:
            continue
        job_id = f"compare_own:{task.name}"
        rows = [(f"{task.name}/s{s}", models[(task.name, s)][0], task.name, s, models[(task.name, s)][1])
                for s in task.seeds if (task.name, s) in models]
        if not rows:
            skipped[job_id] = JobRecord(job_id, "compare_own", "skipped", f"no fine-tuned model of {task.name} finished")
            continue
        jobs.append(compare_job(spec, job_id, "compare_own", spec.base, base_id, rows, study / "compare_own" / task.name,
                                compare=spec.compare.on_own_data(task)))
    return jobs


def seed_compare_jobs(spec: StudySpec, study: Path, models: dict[tuple[str, int], tuple[str, str]],
                      skipped: dict[str, JobRecord], own: bool = False) -> tuple[list[CompareJob], list[dict]]:
    """Each task's seeds against each other: seed a's model as the base against every later seed b.

    On the shared corpus (``seed_compare:<task>/s<a>`` into ``seeds/``), or with ``own`` on the task's own
    eval data (``seed_compare_own:<task>/s<a>`` into ``seeds_own/``; with ``[compare] own_data`` and
    ``own_seed_noise``, for tasks with eval data): the seed noise the own-data changes are held against.
    A task with k seeds gets k - 1 jobs, with k - 1 forward passes of a seed in the base role and
    k(k - 1)/2 of the later seeds. Jobs that need a model that did not finish are ``skipped``. Returns
    the jobs and the seed pairs (``task, seed_a, seed_b, dir, job``).
    """
    if own and not (spec.compare.own_data and spec.compare.own_seed_noise):
        return [], []
    kind, folder = ("seed_compare_own", "seeds_own") if own else ("seed_compare", "seeds")
    jobs, pairs = [], []
    for task in spec.tasks:
        if own and not task.eval_data:
            continue
        compare = spec.compare.on_own_data(task) if own else None
        for i, a in enumerate(task.seeds[:-1]):
            job_id = f"{kind}:{task.name}/s{a}"
            later = list(task.seeds[i + 1:])
            missing = [f"{task.name}/s{s}" for s in [a, *later] if (task.name, s) not in models]
            if missing:
                skipped[job_id] = JobRecord(job_id, kind, "skipped",
                                            f"needs the model of {', '.join(missing)}, which did not finish")
                continue
            rows = [(f"{task.name}/s{b}", models[(task.name, b)][0], task.name, b, models[(task.name, b)][1]) for b in later]
            path, ident = models[(task.name, a)]
            jobs.append(compare_job(spec, job_id, kind, path, ident, rows, study / folder / task.name / f"s{a}",
                                    compare=compare))
            pairs += [{"task": task.name, "seed_a": a, "seed_b": b, "dir": f"{folder}/{task.name}/s{a}", "job": job_id}
                      for b in later]
    return jobs, pairs


def _drop_job(pair: dict) -> dict:
    return {k: v for k, v in pair.items() if k != "job"}


def replace_tables(study: Path, tables: dict[str, pd.DataFrame], complete: bool, unfinished: list[JobRecord],
                   previous: dict) -> dict[str, str]:
    """Write this run's tables (each atomically: the old file stays until its replacement is whole) and settle
    the tables an earlier run wrote that this one did not; the stale tables kept, with why.

    In a complete study a table not made again belongs to something the spec no longer asks for (own_data
    or ood_data off, an analysis or a task gone): it is removed, since the report and ``summarise_study``
    read every table there. In an incomplete one it is kept, because a failed or skipped job may be what
    could not remake it, and listed as stale (from the earlier run) in the manifest and the report.
    """
    for name, table in tables.items():
        write_table(study, name, table)
    before = previous.get("stale_tables") if isinstance(previous.get("stale_tables"), dict) else {}
    when = previous.get("finished") or "an earlier run"
    jobs = ", ".join(j.id for j in unfinished) or "none"
    stale, removed = {}, []
    for path in sorted((study / "tables").glob("*.parquet")):
        name = path.stem
        if name in tables:
            continue
        if complete:
            removed.append(name)
            path.unlink()
            path.with_suffix(".csv").unlink(missing_ok=True)
            continue
        stale[name] = before.get(name) or f"from the run finished {when}; not remade because job(s) {jobs} did not finish"
    if removed:
        logger.info("removed %d table(s) of an earlier run that the spec no longer asks for: %s", len(removed),
                    ", ".join(removed))
    for path in sorted((study / "tables").glob("*.csv")):  # a CSV whose parquet is gone is no table of this study
        if path.stem not in tables and path.stem not in stale:
            path.unlink()
    if stale:
        logger.warning("kept %d table(s) of an earlier run that this one could not remake: %s", len(stale), ", ".join(stale))
    return stale


def task_kinds(spec: StudySpec, ft_jobs: list[FinetuneJob], records: dict[str, JobRecord]) -> dict[str, str | None]:
    """Per task, what its fine-tunes did (``classification`` for a spec's ``type = "auto"`` with 0/1 labels).

    Read from each finished fine-tune's manifest (``summary.task``, as ``bertology finetune`` chose it); a
    task given as existing models keeps the spec's type (None for ``auto``: nothing was chosen); seeds that
    chose differently are listed together.
    """
    found: dict[str, set[str]] = {}
    for job in ft_jobs:
        if records[job.id].status not in ("done", "cached"):
            continue
        try:
            summary = json.loads((Path(job.out) / "manifest.json").read_text()).get("summary") or {}
        except (OSError, ValueError):
            continue
        kind = summary.get("task") or summary.get("objective")
        if kind:
            found.setdefault(job.task.name, set()).add(str(kind))
    return {t.name: ", ".join(sorted(found[t.name])) if t.name in found else (None if t.type == "auto" else t.type)
            for t in spec.tasks}


def finetune_warnings(ft_jobs: list[FinetuneJob], records: dict[str, JobRecord]) -> list[str]:
    """Each finished fine-tune's own warnings (a model at chance, truncated inputs), named by task and seed.

    A seed whose model did not learn the task makes its comparisons say nothing about the task: the
    study report repeats these at the top instead of leaving them inside each run folder.
    """
    out = []
    for job in ft_jobs:
        if records[job.id].status not in ("done", "cached"):
            continue
        try:
            found = json.loads((Path(job.out) / "manifest.json").read_text()).get("warnings", [])
        except (OSError, ValueError):
            continue
        out += [f"{job.task.name}/s{job.seed}: {w}" for w in found]
    return out


def _rel(study: Path, path: str) -> str:
    try:
        return str(Path(path).relative_to(study))
    except ValueError:
        return path


def collect_tables(study: Path, jobs: list[CompareJob]) -> dict[str, pd.DataFrame]:
    """The base-vs-tuned tables as compare_many combined them, and the seed-vs-seed ones with task, seed_a, seed_b first.

    Tables of the tasks' own dev data are concatenated over tasks as ``own_<table>`` and
    ``own_seedpair_<table>``; the out-of-domain tables keep compare_many's ``_ood`` suffix.
    """
    tables: dict[str, pd.DataFrame] = {}
    parts: dict[str, list[pd.DataFrame]] = {}  # table name -> its parts over jobs
    prefix = {"compare_own": "own_", "seed_compare": "seedpair_", "seed_compare_own": "own_seedpair_"}
    for job in jobs:
        folder = Path(job.out) / "tables"
        for path in sorted(folder.glob("*.parquet")):
            df = pd.read_parquet(path)
            if job.kind == "compare":
                tables[path.stem] = df
                continue
            if job.kind.startswith("seed_compare"):
                seed_a = int(Path(job.out).name.removeprefix("s"))
                keys = pd.DataFrame({"task": df["task"], "seed_a": pd.array([seed_a] * len(df), dtype="Int64"),
                                     "seed_b": df["seed"].astype("Int64")})
                df = pd.concat([keys, df.drop(columns=["tuned", "task", "seed"])], axis=1)
            parts.setdefault(prefix[job.kind] + path.stem, []).append(df)
    for name, frames in parts.items():
        tables[name] = pd.concat(frames, ignore_index=True)
    return tables


def _noise_tables(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The seed-noise statistics of every corpus: ``study_*`` (shared), ``own_study_*``, ``study_*_ood``."""
    from bertology.studies.noise import corpus_study_tables

    from bertology.studies.crosscoder_seeds import study_seed_tables

    return {**corpus_study_tables(tables), **study_seed_tables(tables)}


def _study_report(study: Path) -> Path:
    """The study's one offline HTML report (it reads the tables and the manifest just written)."""
    from bertology.report.study import render_study_report

    return render_study_report(study)
