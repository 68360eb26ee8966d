"""The jobs of a study: each fine-tune and each comparison, picklable, with a fingerprint and resource needs.

A job is a frozen dataclass with ``id``, ``kind``, ``fingerprint`` (what makes its output what it is:
settings, data file hashes, the identity of its input models), ``num_cpus``/``num_gpus`` (what a Ray
task declares) and ``run(progress) -> dict``. Jobs write into the study folder themselves (the study
folder must be on a filesystem every worker sees; see :mod:`bertology.studies.executors`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from bertology.runs import fingerprint
from bertology.studies.spec import CompareSpec, StudySpec, TaskSpec
from bertology.studies.verify import sha256_file


@lru_cache(maxsize=256)
def file_sha256(path: str) -> str:
    """A data file's contents as a hash (``hf:`` specs and folders hash their name)."""
    p = Path(path)
    return sha256_file(p) if p.is_file() else path


def model_identity(name: str) -> str:
    """A model's identity for fingerprints: its weights' hash for a local folder, else its name."""
    from bertology.models.loading import resolve_model, weights_fingerprint

    source, where = resolve_model(name)
    return (weights_fingerprint(where) if source != "hub" else None) or str(where)


def _resources(device: str) -> tuple[float, float]:
    return 1.0, (1.0 if device.startswith("cuda") or device == "auto" and _has_cuda() else 0.0)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class FinetuneJob:
    """Fine-tune the base on one task with one seed into ``out`` (a normal ``bertology finetune`` run folder)."""

    id: str
    task: TaskSpec
    seed: int
    base: str
    lab: tuple[tuple[str, Any], ...]
    device: str
    out: str
    fingerprint: str
    kind: str = "finetune"
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    @property
    def model_dir(self) -> Path:
        return Path(self.out) / "model"

    def config(self):
        from bertology.studies.spec import lab_config

        return lab_config(dict(self.lab), model=self.base, data=self.task.data or "", columns=self.task.columns,
                          out=self.out, eval_data=self.task.eval_data, seed=self.seed, device=self.device,
                          task=self.task.type)

    def run(self, progress: bool = False) -> dict:
        """Train (or resume, or reuse the identical finished run in ``out``); the held-out metrics."""
        from bertology.training.finetune import read_data
        from bertology.training.run import finetune_to_dir

        config = self.config()
        train, evaluation = read_data(config)  # the reader the task needs (SQuAD JSON for qa)
        # the study owns its finetune/ folders: other settings replace a run, identical ones resume it
        run = finetune_to_dir(config, train, evaluation, overwrite=True, progress=progress)
        return {"metrics": {k: v for k, v in run.metrics.items() if isinstance(v, (int, float))},
                "model": str(run.model_dir), "reused": run.reused}

    def finished(self) -> bool:
        from bertology.training.run import is_model_folder

        return is_model_folder(self.model_dir)  # a full model, or a LoRA run's adapter

    def outputs(self) -> list[Path]:
        """The files this job promises: every file of the model folder, the run's manifest and tables."""
        out = Path(self.out)
        return [p for p in self.model_dir.rglob("*") if p.is_file()] + _run_files(out)


@dataclass(frozen=True)
class CompareJob:
    """``compare_many``: ``base`` against every model of ``tuned`` (name, path, task, seed) into ``out``."""

    id: str
    kind: str  # "compare" (base vs every tuned model), "compare_own" (base vs one task's models on its eval data),
    #            "seed_compare" (seed a vs later seeds of one task) or "seed_compare_own" (the same on its eval data)
    base: str
    tuned: tuple[tuple[str, str, str | None, int | None], ...]
    compare: CompareSpec
    device: str
    out: str
    fingerprint: str
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def config(self):
        from bertology.config import CompareConfig, DataConfig

        c = self.compare
        data = DataConfig(path=c.data, text_column=c.text_column, pair_column=c.pair_column, label_column=c.label_column,
                          max_examples=c.max_examples, max_length=c.max_length)
        return CompareConfig(base=self.base, tuned="", data=data, out=self.out, analyses=c.analyses,
                             batch_size=c.batch_size, seed=c.seed, device=self.device, ood_data=c.ood_data,
                             ood_text_column=c.ood_text_column, **c.settings)

    def run(self, progress: bool = False) -> dict:
        """Compare and write ``out`` (pairs/, tables/, manifest.json, report.html); the tables' names."""
        from bertology.multicompare import TunedModel, compare_many

        tuned = [TunedModel(name, path, task, seed) for name, path, task, seed in self.tuned]
        # the study owns this folder: a changed set of models replaces it, identical settings resume it
        run = compare_many(self.config(), tuned, overwrite=True, progress=progress, report=self.compare.report)
        return {"tables": sorted(run.tables)}

    def finished(self) -> bool:
        return (Path(self.out) / "manifest.json").exists()

    def outputs(self) -> list[Path]:
        """The files this job promises: its manifest and the combined tables the study reads."""
        return _run_files(Path(self.out))


def _run_files(folder: Path) -> list[Path]:
    """A run folder's manifest and tables (parquet: what is read back; the CSVs are copies for people)."""
    return [p for p in [folder / "manifest.json", *sorted((folder / "tables").glob("*.parquet"))] if p.is_file()]


Job = FinetuneJob | CompareJob


def finetune_jobs(spec: StudySpec, study: Path) -> list[FinetuneJob]:
    """One job per (task with data, seed), fingerprinted by the base, the task, the lab settings, the seed and the data."""
    base_id = model_identity(spec.base)
    cpus, gpus = _resources(spec.device)
    jobs = []
    for task in spec.tasks:
        if task.models:
            continue
        lab = task.lab(spec.lab)  # [lab] with the task's own method, when it gives one
        data = {k: file_sha256(v) for k, v in (("data", task.data), ("eval_data", task.eval_data)) if v}
        for seed in task.seeds:
            fp = fingerprint("finetune", base_id, task.type, task.columns, data, lab, seed, spec.device,
                             recipe_numbers(task.type, dict(lab)))
            jobs.append(FinetuneJob(f"finetune:{task.name}/s{seed}", task, seed, spec.base, lab, spec.device,
                                    str(study / "finetune" / task.name / f"s{seed}"), fp, num_cpus=cpus, num_gpus=gpus))
    return jobs


#: The settings a task's recipe fills when ``[lab]`` leaves them out (``bertology.training.recipes``).
RECIPE_SETTINGS = ("learning_rate", "head_lr", "epochs", "batch_size", "warmup_ratio", "arc_dim", "label_dim")


def recipe_numbers(task_type: str, lab: dict) -> dict:
    """The recipe values a task's fine-tunes will use for what ``[lab]`` does not set, by task (``auto``: either
    of the two it may choose), so a changed recipe makes the fine-tunes another run instead of mixing seeds
    trained before and after it."""
    from bertology.studies.spec import LAB_KEYS
    from bertology.training.recipes import recipe_for

    given = {LAB_KEYS.get(k, k) for k in lab}  # "lr" is learning_rate
    tasks = ("classification", "regression") if task_type == "auto" else (task_type,)
    method = lab.get("method", "full")  # LoRA's recipe has its own learning rate
    return {t: {k: getattr(recipe_for(t, method), k) for k in RECIPE_SETTINGS if k not in given} for t in tasks}


def compare_job(spec: StudySpec, job_id: str, kind: str, base: str, base_id: str,
                tuned: list[tuple[str, str, str | None, int | None, str]], out: Path,
                compare: CompareSpec | None = None) -> CompareJob:
    """A comparison job; ``tuned`` rows are (name, path, task, seed, identity) — the identity goes into the fingerprint.

    ``compare``: other comparison settings than the spec's (a task's own eval data).
    """
    c = compare or spec.compare
    data = [file_sha256(p) for p in (c.data, c.ood_data) if p]
    # the corpora by their hashes, not their paths (a study folder copied or moved with its data stays cached);
    # own_data and own_seed_noise add jobs and change none
    fp = fingerprint(kind, base_id, [(n, t, s, ident) for n, _, t, s, ident in tuned],
                     replace(c, data="", ood_data=None, own_data=True, own_seed_noise=True), data, spec.device,
                     *([dict(c.settings)] if c.settings else []))
    cpus, gpus = _resources(spec.device)
    return CompareJob(job_id, kind, base, tuple((n, p, t, s) for n, p, t, s, _ in tuned), c, spec.device, str(out), fp,
                      num_cpus=cpus, num_gpus=gpus)
