"""``run_study``: fine-tune what is missing, then compare every model with the base, and the seeds with each other.

The study folder::

    study.toml                      copy of the spec
    manifest.json                   kind "study": tasks, models, pairs, seed_pairs, jobs (status, error, wall time)
    finetune/<task>/s<seed>/        a bertology finetune run folder (model/ inside)
    compare/                        compare_many: the base against every tuned model ("<task>/s<seed>")
    seeds/<task>/s<a>/              compare_many: seed a's model against every later seed b of the task
    tables/<table>.parquet          the base-vs-tuned tables (tuned, task, seed first)
    tables/seedpair_<table>.parquet the seed-vs-seed tables (task, seed_a, seed_b first)
    tables/study_*.parquet          the seed-noise statistics (bertology.study.noise, when present)
    jobs/<job>.json                 each finished job's fingerprint: a rerun skips it ("cached")

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
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bertology.errors import BertologyError
from bertology.results import atomic_write_text, now_iso, write_table
from bertology.study.executors import Executor, JobResult, LocalExecutor
from bertology.study.jobs import CompareJob, FinetuneJob, compare_job, finetune_jobs, model_identity
from bertology.study.spec import StudySpec, check_models, load_spec

logger = logging.getLogger(__name__)
KIND = "study"


@dataclass
class JobRecord:
    """One job's line in the manifest."""

    id: str
    kind: str
    status: str  # done, cached, failed, skipped
    error: str | None = None
    wall_time_s: float = 0.0

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "status": self.status, "error": self.error, "wall_time_s": self.wall_time_s}


@dataclass
class StudyResult:
    out: Path
    jobs: list[JobRecord]
    manifest: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    report: Path | None = None

    @property
    def failed(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.status == "failed"]

    def statuses(self) -> dict[str, str]:
        return {j.id: j.status for j in self.jobs}


def _marker(study: Path, job_id: str) -> Path:
    return study / "jobs" / (job_id.replace(":", "__").replace("/", "~") + ".json")


def _cached(study: Path, job: FinetuneJob | CompareJob) -> bool:
    """A finished job with the same fingerprint whose output is still there."""
    path = _marker(study, job.id)
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return done.get("fingerprint") == job.fingerprint and job.finished()


def _record_done(study: Path, job: FinetuneJob | CompareJob, result: JobResult) -> None:
    atomic_write_text(_marker(study, job.id), json.dumps(
        {"id": job.id, "fingerprint": job.fingerprint, "finished": now_iso(), "wall_time_s": result.wall_time_s,
         "value": result.value}, indent=2, default=str))


def _run_wave(study: Path, jobs: list, executor: Executor) -> dict[str, JobRecord]:
    """Run the jobs that are not cached; every job's record."""
    records = {j.id: JobRecord(j.id, j.kind, "cached") for j in jobs if _cached(study, j)}
    todo = [j for j in jobs if j.id not in records]
    for j in todo:
        _marker(study, j.id).unlink(missing_ok=True)  # not finished until this run says so
    for job, res in zip(todo, executor.run(todo)):
        records[job.id] = JobRecord(job.id, job.kind, res.status, res.error, res.wall_time_s)
        if res.status == "done":
            _record_done(study, job, res)
    return {j.id: records[j.id] for j in jobs}


def prepare_folder(study: Path, spec: StudySpec, overwrite: bool) -> None:
    """Take ``study`` for this study: refuse a folder of something else; ``overwrite`` starts it afresh."""
    manifest = study / "manifest.json"
    if study.exists() and any(study.iterdir()):
        kind = None
        if manifest.exists():
            try:
                kind = json.loads(manifest.read_text(encoding="utf-8")).get("kind")
            except (OSError, json.JSONDecodeError):
                kind = None
        if kind != KIND and not overwrite:
            raise BertologyError(f"{study} is not empty and holds no study; choose another --out or pass --overwrite.")
        if overwrite:
            shutil.rmtree(study)
    study.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec.path, study / "study.toml")
    previous = {}
    if manifest.exists():
        try:
            previous = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            previous = {}
    # marked as a study from the start, so a rerun after a kill recognises the folder and resumes it
    atomic_write_text(manifest, json.dumps({**previous, "kind": KIND, "status": "running", "started": now_iso()}, indent=2))


def run_study(spec: StudySpec | str | Path, out: str | Path | None = None, *, executor: Executor | None = None,
              overwrite: bool = False, progress: bool = False) -> StudyResult:
    """Run a study (see module docs): every check first, then the fine-tunes, then the comparisons, then the tables."""
    t0 = time.perf_counter()
    spec = spec if isinstance(spec, StudySpec) else load_spec(spec)
    out = Path(out).expanduser() if out is not None else spec.out
    if out is None:
        raise BertologyError("No study folder: set out = \"...\" in the spec or pass --out.")
    check_models(spec)  # given fine-tunes of another shape or tokenizer: refused before any work
    executor = executor or LocalExecutor(progress=progress)
    study = out.resolve()
    prepare_folder(study, spec, overwrite)
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
            models[(job.task.name, job.seed)] = (str(job.model_dir), job.fingerprint)

    cmp_jobs: list[CompareJob] = []
    skipped: dict[str, JobRecord] = {}
    tuned = [(f"{t.name}/s{s}", models[(t.name, s)][0], t.name, s, models[(t.name, s)][1])
             for t in spec.tasks for s in t.seeds if (t.name, s) in models]
    if tuned:
        cmp_jobs.append(compare_job(spec, "compare", "compare", spec.base, base_id, tuned, study / "compare"))
    else:
        skipped["compare"] = JobRecord("compare", "compare", "skipped", "no fine-tuned model finished")
    seed_pairs = []
    for task in spec.tasks:
        for i, a in enumerate(task.seeds[:-1]):
            job_id = f"seed_compare:{task.name}/s{a}"
            later = [b for b in task.seeds[i + 1:]]
            missing = [f"{task.name}/s{s}" for s in [a, *later] if (task.name, s) not in models]
            if missing:
                skipped[job_id] = JobRecord(job_id, "seed_compare", "skipped",
                                            f"needs the model of {', '.join(missing)}, which did not finish")
                continue
            rows = [(f"{task.name}/s{b}", *models[(task.name, b)][:1], task.name, b, models[(task.name, b)][1]) for b in later]
            path, ident = models[(task.name, a)]
            cmp_jobs.append(compare_job(spec, job_id, "seed_compare", path, ident, rows,
                                        study / "seeds" / task.name / f"s{a}"))
            seed_pairs += [{"task": task.name, "seed_a": a, "seed_b": b, "dir": f"seeds/{task.name}/s{a}"} for b in later]
    records.update(_run_wave(study, cmp_jobs, executor))
    records.update(skipped)

    ok = {j.id for j in cmp_jobs if records[j.id].status in ("done", "cached")}
    tables = collect_tables(study, [j for j in cmp_jobs if j.id in ok])
    tables.update(_noise_tables(tables))
    for name, table in tables.items():
        write_table(study, name, table)
    order = [j.id for j in ft_jobs] + ["compare"] + [k for k in records if k.startswith("seed_compare:")]
    jobs = [records[k] for k in dict.fromkeys(order) if k in records]
    main = next((j for j in cmp_jobs if j.id == "compare"), None)
    manifest = {
        "kind": KIND,
        "status": "complete" if all(j.status in ("done", "cached") for j in jobs) else "incomplete",
        "finished": now_iso(),
        "base": spec.base,
        "spec": str(spec.path),
        "tasks": [{"name": t.name, "task": t.type, "seeds": list(t.seeds),
                   "models": {str(s): _rel(study, models[(t.name, s)][0]) for s in t.seeds if (t.name, s) in models}}
                  for t in spec.tasks],
        "pairs": [{"tuned": name, "task": task, "seed": seed,
                   "report": f"compare/pairs/{name.replace('/', '~')}/report.html" if spec.compare.report else None}
                  for name, _, task, seed in (main.tuned if main is not None and main.id in ok else ())],
        "seed_pairs": [p for p in seed_pairs if f"seed_compare:{p['task']}/s{p['seed_a']}" in ok],
        "jobs": [j.to_dict() for j in jobs],
        "executor": getattr(executor, "name", type(executor).__name__),
        "compare": {"data": spec.compare.data, "ood_data": spec.compare.ood_data, "analyses": list(spec.compare.analyses),
                    "max_examples": spec.compare.max_examples},
        "lab": spec.lab,
        "tables": sorted(tables),
        "wall_time_s": round(time.perf_counter() - t0, 2),
    }
    atomic_write_text(study / "manifest.json", json.dumps(manifest, indent=2, default=str))
    report = _study_report(study)
    return StudyResult(study, jobs, manifest, tables, report)


def _rel(study: Path, path: str) -> str:
    try:
        return str(Path(path).relative_to(study))
    except ValueError:
        return path


def collect_tables(study: Path, jobs: list[CompareJob]) -> dict[str, pd.DataFrame]:
    """The base-vs-tuned tables as compare_many combined them, and the seed-vs-seed ones with task, seed_a, seed_b first."""
    tables: dict[str, pd.DataFrame] = {}
    seed_parts: dict[str, list[pd.DataFrame]] = {}
    for job in jobs:
        folder = Path(job.out) / "tables"
        for path in sorted(folder.glob("*.parquet")):
            df = pd.read_parquet(path)
            if job.kind == "compare":
                tables[path.stem] = df
                continue
            seed_a = int(Path(job.out).name.removeprefix("s"))
            keys = pd.DataFrame({"task": df["task"], "seed_a": pd.array([seed_a] * len(df), dtype="Int64"),
                                 "seed_b": df["seed"].astype("Int64")})
            seed_parts.setdefault(path.stem, []).append(pd.concat([keys, df.drop(columns=["tuned", "task", "seed"])], axis=1))
    for name, parts in seed_parts.items():
        tables[f"seedpair_{name}"] = pd.concat(parts, ignore_index=True)
    return tables


def _noise_tables(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The seed-noise statistics (``study_*`` tables) of the base-vs-tuned and seed-vs-seed tables."""
    from bertology.study.noise import study_tables

    base = {k: v for k, v in tables.items() if not k.startswith("seedpair_")}
    seeds = {k.removeprefix("seedpair_"): v for k, v in tables.items() if k.startswith("seedpair_")}
    return study_tables(base, seeds) if base else {}


def _study_report(study: Path) -> Path:
    """The study's one offline HTML report (it reads the tables and the manifest just written)."""
    from bertology.report.study import render_study_report

    return render_study_report(study)
