"""Fine-tuning into a run directory: reuse an identical earlier run, resume an interrupted one, or train.

One place for what ``bertology finetune`` and the demo both need: the run fingerprint, the
reuse/resume/refuse decision, the tables (``finetune``, ``finetune_predictions``, and for a
contrastive run ``anisotropy``) and the manifest. The manifest is written with ``status: running``
before training starts, so a killed run is recognised; with ``save_every`` the same command then
continues from the latest checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from bertology.config import FINETUNE_DATA_SETTINGS, FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.models.device import resolve_device
from bertology.models.precision import resolve_dtype
from bertology.models.loading import resolve_model, weights_fingerprint
from bertology.metrics.chance import above_chance
from bertology.commands.base import Command, OpenRun
from bertology.commands.compat import finetune_rates, without_added
from bertology.results import read_table
from bertology.runs import manifest_header
from bertology.settings import describe, field_settings
from bertology.training.common import INTERVALS_TABLE
from bertology.training.recipes import NO_REFERENCE, few_steps_note, undertraining_warnings

KIND = "finetune"

logger = logging.getLogger(__name__)


@dataclass
class FinetuneRun:
    """A fine-tuning run directory's outcome (freshly trained or reused)."""

    out: Path
    model_dir: Path
    table: pd.DataFrame
    metrics: dict
    n_train: int | None
    wall_time_s: float
    reused: bool
    warnings: list[str] = field(default_factory=list)


def run_fingerprint(config: FinetuneConfig, train: Corpus, evaluation: Corpus | None = None) -> str:
    """Identity of a run: every setting that changes the numbers (not ``out``), the data and the base weights."""
    from bertology.training.finetune import resolve_run_config

    d = resolve_run_config(config, train).to_dict()  # the old and the new name of a setting are one run
    d.pop("out", None)
    d.pop("recipe", None)  # a value is one run whether the user or the task's recipe gave it
    finetune_rates(d)  # one rate for encoder and head: runs from before head_lr match
    for s in field_settings(FinetuneConfig):  # e.g. save_every: where checkpoints are kept does not change the numbers
        if not s.changes_numbers:
            d.pop(s.name, None)
    if d.get("method") == "full":  # LoRA's settings do not touch a full fine-tune
        for key in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_merge"):
            d.pop(key, None)
    without_added(KIND, d)  # runs from before these settings existed keep their fingerprint
    source, where = resolve_model(config.model)
    weights = weights_fingerprint(where) if source != "hub" else None
    from bertology.training.tagging import is_tagging_run

    tags = is_tagging_run(config, train)  # a tagger's targets are the words' tags: hash them too
    parts = [d, train.fingerprint(word_tags=tags), evaluation.fingerprint(word_tags=tags) if evaluation is not None else None,
             weights or where]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def settings_record(config: FinetuneConfig) -> dict:
    """The manifest's ``settings``: every declared fine-tuning setting and data setting with its value, default,
    flag, help and paper (:func:`bertology.settings.describe`), as ``compare`` records its own; the report's
    settings table reads it."""
    run = {s.name: s for s in field_settings(FinetuneConfig)}
    data = {s.name: s for s in FINETUNE_DATA_SETTINGS}
    out = {**describe(run, {n: config.value(n) for n in run}, {n: "finetune" for n in run}),
           **describe(data, {n: getattr(config.data, n) for n in data}, {n: "data" for n in data})}
    recipe = config.recipe or {}
    for name in recipe.get("from_recipe", ()):  # the value used, and that the task's recipe gave it
        out["finetune"][name]["source"] = f"the {recipe['task']} recipe"
    return out


def _device_info(device: str) -> dict:
    import torch

    info = {"requested": device, "cuda_available": torch.cuda.is_available(), "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def finetune_to_dir(
    config: FinetuneConfig,
    train: Corpus,
    evaluation: Corpus | None = None,
    *,
    overwrite: bool = False,
    retrain: bool = False,
    progress: bool = False,
    on_step=None,
    tracker=None,
) -> FinetuneRun:
    """Fine-tune into ``config.out``, or reuse the identical run already there (unless ``retrain``).

    A folder holding a different run is refused unless ``overwrite`` (see :class:`RunDirectory`). An
    identical run that was interrupted resumes from its latest checkpoint (``save_every``) unless
    ``retrain``; ``on_step(step)`` is passed to the training loop.

    ``track_every`` (with ``tracker``, :func:`bertology.integrations.tracker.finetune_tracker`) tracks the model
    against its base into ``tracking/``, a run folder of kind ``track`` (``bertology report RUN/tracking``); the
    manifest's ``result.tracking`` and ``summary.tracking`` say what was tracked. The tracking settings are not in
    the fingerprint (the weights do not depend on them), but a finished run is reused only when it tracked with
    the same settings (or none were asked for); otherwise it is trained again from the start, with the same
    numbers, to track it. A run resumed from a checkpoint keeps the tracking rows up to that checkpoint; when the
    interrupted part did not track, the tables start at the checkpoint.
    """
    from bertology.training.finetune import resolve_run_config

    config = resolve_run_config(config, train)  # old names mapped, "auto" decided, the task's recipe filled in
    resolve_dtype(config.dtype, resolve_device(config.device))  # a missing GPU or dtype: an error before the run folder is touched
    command = FinetuneCommand(config, train, evaluation, progress=progress, on_step=on_step, tracker=tracker)
    # another run (allowed by --overwrite) or a retrain: nothing of the old one may remain
    return command.run(config.out, overwrite=overwrite, fresh=retrain)


@dataclass
class FinetuneCommand(Command[FinetuneRun]):
    """``finetune`` in the one lifecycle (:class:`~bertology.commands.base.Command`): training is its work; an
    identical finished run is reused (when its model is intact and it tracked as asked), an interrupted one resumes
    from its latest checkpoint. ``config`` is resolved (:func:`~bertology.training.finetune.resolve_run_config`)."""

    name: ClassVar[str] = KIND
    scratch: ClassVar[tuple[str, ...]] = ("checkpoints", "model", "tracking")
    done_status: ClassVar[str] = "done"
    config: FinetuneConfig
    train: Corpus
    evaluation: Corpus | None = None
    progress: bool = False
    on_step: Any = None
    tracker: Any = None
    resume: bool = False  # continue from the latest checkpoint (decided by reuse)
    trained: Any = None  # the training's result (set by work)

    def fingerprint(self) -> str:
        return run_fingerprint(self.config, self.train, self.evaluation)

    def reuse(self, run: OpenRun) -> FinetuneRun | None:
        old, model_dir = run.previous, run.path / "model"
        self.resume = run.resumed
        finished = self.resume and old.get("metrics") and run.dir.has_table(KIND) and _model_intact(model_dir, old)
        if finished and not _tracked_as_asked(self.config, old):
            logger.info("%s holds this run without the tracking asked for (--track-every): training it again", run.path)
            finished = self.resume = False  # the same numbers again, from the start, with the tracker watching
        if not finished:
            return None
        return FinetuneRun(run.path, model_dir, read_table(run.path, KIND), old["metrics"],
                           old.get("result", {}).get("n_train"), 0.0, reused=True, warnings=old.get("warnings", []))

    def manifest(self, run: OpenRun) -> dict:
        header = manifest_header(KIND, run.fingerprint, created=run.created if self.resume else None)
        return {**header, "status": "running", "config": self.config.to_dict(), "settings": settings_record(self.config),
                "seed": self.config.seed}

    def work(self, run: OpenRun) -> dict:
        from bertology.training.finetune import finetune

        self.trained = result = finetune(self.config, self.train, self.evaluation, progress=self.progress,
                                         resume=self.resume, on_step=self.on_step, tracker=self.tracker)
        predictions = {} if result.predictions is None else {"finetune_predictions": result.predictions}
        return {KIND: result.table, **predictions, **result.extra_tables}

    def finished(self, run: OpenRun, manifest: dict, tables) -> dict:
        config, result = self.config, self.trained
        details = result.describe()
        warnings, model_warnings = _run_warnings(result, details, self.train, self.evaluation)
        models = {
            "base": details.pop("base_model", None),
            "tuned": {**(details.pop("tuned_model", None) or {}), "path": str(result.model_dir),
                      "weights_sha256": weights_fingerprint(result.model_dir)},
        }
        return {
            "device": _device_info(config.device),
            "dtype": config.dtype,
            "precision": "float32" if config.dtype == "float32" else f"mixed: forward under autocast({config.dtype})"
            + (" with a GradScaler" if config.dtype == "float16" else "") + "; weights, gradients, optimiser and evaluation float32",
            "attn_implementation": "eager",
            "models": models,
            "data": {"train": self.train.describe(),
                     "eval": self.evaluation.describe() if self.evaluation is not None else None},
            "result": details,
            "metrics": result.metrics,
            "tables": list(tables),
            "warnings": warnings,
            "model_warnings": model_warnings,
            "wall_time_s": round(result.wall_time_s, 3),
            "summary": summary_of(result),
        }

    def result(self, run: OpenRun, manifest: dict, tables) -> FinetuneRun:
        result = self.trained
        return FinetuneRun(run.path, Path(result.model_dir), result.table, result.metrics, result.n_train,
                           result.wall_time_s, reused=False, warnings=manifest["warnings"])


def _run_warnings(result, details: dict, train: Corpus, evaluation: Corpus | None) -> tuple[list[str], list[str]]:
    """The run's warnings (truncation, labels, then what is said of the model) and those said of the model itself,
    which travel with it: compare, ablate, probe and studies of it repeat these."""
    warnings = [
        f"{enc['n_truncated']} of {enc['n_input']} {split} examples were truncated to {enc['max_length']} tokens."
        for split, enc in details.get("tokenisation", {}).items()
        if enc.get("n_truncated")
    ] + [w for corpus in (train, evaluation) if corpus is not None for w in corpus.stats.get("label_warnings", [])]
    main = details.get("main_metric") or {}  # the metric and dataset a reference figure must match
    chance = chance_warnings(result.predictions)
    under = undertraining_warnings(result.table, result.metrics, details.get("task"), metric=main.get("metric"),
                                   dataset=main.get("dataset"))
    model_warnings = chance + under
    weak = chance + [w for w in under if not w.startswith(NO_REFERENCE)]
    if weak and (note := few_steps_note(details)) is not None:  # what a weak run would need to learn
        model_warnings.append(note)
    return warnings + model_warnings, model_warnings


def tracking_settings(config: FinetuneConfig) -> dict | None:
    """The tracking a run asks for (``track_every``, ``track_analyses``, ``track_examples``), or None when off."""
    tracking = config.tracking
    if not tracking.every:
        return None
    return {"every": tracking.every, "analyses": list(tracking.analyses), "max_examples": tracking.examples}


def _tracked_as_asked(config: FinetuneConfig, manifest: dict) -> bool:
    """Whether a finished run's manifest shows the tracking ``config`` asks for (always, when it asks for none)."""
    asked = tracking_settings(config)
    if asked is None:
        return True
    done = (manifest.get("result") or {}).get("tracking") or {}
    return {"every": done.get("every"), "analyses": done.get("analyses"), "max_examples": done.get("max_examples")} == asked


def is_model_folder(folder: Path) -> bool:
    """A saved model: a full model folder (``config.json``) or a LoRA run's adapter folder."""
    from bertology.models.peft_adapter import is_adapter_folder

    return (folder / "config.json").exists() or is_adapter_folder(folder)


def _model_intact(model_dir: Path, manifest: dict) -> bool:
    """Whether the finished run's model is still the one it saved (config present, weights hash as recorded).

    A deleted or truncated model must be trained again, not reused and then fail in every later load.
    """
    recorded = ((manifest.get("models") or {}).get("tuned") or {}).get("weights_sha256")
    found = weights_fingerprint(model_dir) if is_model_folder(model_dir) else None
    if found is None or recorded is not None and found != recorded:
        logger.warning("%s does not hold the model this run saved (missing or changed weights): training it again",
                       model_dir)
        return False
    return True


def chance_warnings(predictions: pd.DataFrame | None) -> list[str]:
    """A warning when the fine-tuned classifier is not shown to beat chance on the eval data, or predicts one class.

    Such a model is not worth analysing as "what fine-tuning taught it": say how far from chance it is.
    """
    if predictions is not None and {"f1", "exact_match", "prediction"} <= set(predictions.columns):
        return _qa_chance_warnings(predictions)
    if predictions is None or not {"label", "predicted"} <= set(predictions.columns):
        return []
    predictions = predictions[predictions["predicted"].notna()]  # examples the model did not see are not scored
    if predictions.empty:
        return []
    if "error" in predictions.columns:  # a regressor's predictions
        return _regression_chance_warnings(predictions)
    labels, predicted = predictions["label"].to_numpy(), predictions["predicted"].to_numpy()
    correct, n = int((labels == predicted).sum()), len(predictions)
    above, (lo, hi), chance = above_chance(correct, n, labels)
    constant = len(set(predicted.tolist())) <= 1
    if above and not constant:
        return []
    what = "predicts one class for every eval example" if constant else "is not shown to beat chance on the eval data"
    return [f"The fine-tuned model {what} (accuracy {correct / n:.3f}, 95% CI [{lo:.3f}, {hi:.3f}], n={n}; "
            f"majority-class rate {chance:.3f}): train longer, change the learning rate or warm-up, or check the labels "
            "before reading its analyses as what fine-tuning taught it."]


def _regression_chance_warnings(predictions: pd.DataFrame) -> list[str]:
    """The regressor's warning: one predicted value, or a Pearson r whose Fisher 95% interval reaches 0."""
    from bertology.tasks.catalog import get_task

    task = get_task("regression")
    y, pred = predictions["label"].to_numpy(np.float64), predictions["predicted"].to_numpy(np.float64)
    r = task.point_scores({"pred": pred, "loss": (pred - y) ** 2}, y)["pearson"]
    verdict = task.degeneracy(r, len(y), task.n_predicted(pred), task.chance(y))
    if not verdict.flagged:
        return []
    what = "predicts one value for every eval example" if verdict.constant_predictions else "is not shown to beat chance on the eval data"
    return [f"The fine-tuned model {what} (Pearson {r:.3f}, 95% CI [{verdict.ci[0]:.3f}, {verdict.ci[1]:.3f}], "
            f"n={len(y)}; chance r = 0): train longer, change the learning rate or warm-up, or check the targets "
            "before reading its analyses as what fine-tuning taught it."]


def _qa_chance_warnings(predictions: pd.DataFrame) -> list[str]:
    """The QA model's warning: one answer for every question, or an F1 not shown above always answering "no answer"."""
    from bertology.tasks.catalog import get_task

    if predictions.empty:
        return []
    task = get_task("qa")
    f1 = float(predictions["f1"].mean())
    chance = float(predictions["is_impossible"].mean())
    verdict = task.degeneracy(f1, len(predictions), int(predictions["prediction"].nunique()), chance)
    if not verdict.flagged:
        return []
    what = "gives one answer to every eval question" if verdict.constant_predictions else "is not shown to beat chance on the eval data"
    return [f"The fine-tuned model {what} (F1 {f1:.3f}, 95% CI [{verdict.ci[0]:.3f}, {verdict.ci[1]:.3f}], n={len(predictions)}; "
            f"always answering 'no answer' scores {chance:.3f}): train longer, change the learning rate or --max-length / "
            "--doc-stride before reading its analyses as what fine-tuning taught it."]


def summary_of(result) -> dict:
    """The headline of a run for the manifest and the CLI: final metrics, slices, data and model changes, time."""
    d = result.details
    out = {
        "objective": d.get("training_objective", d.get("objective", "supervised")),  # e.g. supervised (cross-entropy)
        "task": d.get("task"),
        "n_train": result.n_train,
        "n_eval": result.n_eval,
        "metrics": {k: v for k, v in result.metrics.items() if not isinstance(v, dict)},
        "wall_time_s": round(result.wall_time_s, 3),
        "train_time_s": d.get("train_time_s"),
        "steps": d.get("steps_done", d.get("steps")),
    }
    ci = result.extra_tables.get(INTERVALS_TABLE)
    if ci is not None and len(ci):
        from bertology.tasks.catalog import TASKS, get_task

        unit = get_task(d["task"]).example_unit if d.get("task") in TASKS else "examples"
        out["intervals"] = {"n_eval": int(ci["n_eval"].iloc[0]), "unit": unit,
                            **{r.metric: [float(r.ci_low), float(r.ci_high)] for r in ci.itertuples()}}
    if result.metrics.get("slices"):
        out["slices"] = result.metrics["slices"]
    if d.get("excluded_words"):
        ex = d["excluded_words"]
        out["excluded_words"] = {k: ex[k] for k in ("words", "n_before", "n_dropped", "n_after") if k in ex}
    layers = d.get("layers") or {}
    if layers.get("dropped"):
        out["layers"] = {"dropped": layers["dropped"], "remaining": layers.get("after")}
    frozen = d.get("frozen") or {}
    if frozen.get("layers") or frozen.get("embeddings"):
        out["frozen"] = frozen
    if d.get("early_stopping"):
        out["early_stopping"] = d["early_stopping"]
    if d.get("lora"):
        out["lora"] = {k: d["lora"][k] for k in ("rank", "alpha", "targets", "trainable_parameters", "total_parameters",
                                                 "trainable_percent", "merged_model_dir") if k in d["lora"]}
    if d.get("tracking"):
        out["tracking"] = {k: d["tracking"][k] for k in ("folder", "every", "analyses", "tables") if k in d["tracking"]}
    if d.get("checkpoints") and d["checkpoints"].get("resumed_from_step") is not None:
        out["resumed_from_step"] = d["checkpoints"]["resumed_from_step"]
    return out


def finished_summary(run: str | Path) -> dict:
    """The ``summary`` of a finished fine-tuning run; a clear error otherwise."""
    from bertology.errors import BertologyError
    from bertology.runs import RunDirectory

    m = RunDirectory(run).read_manifest()
    if not m or m.get("kind") != KIND or m.get("status", "done") != "done" or not m.get("summary"):
        raise BertologyError(f"{run} holds no finished fine-tuning run to compare with (--against).")
    return m["summary"]


def compare_runs(run: str | Path, against: str | Path) -> dict:
    """Accuracy (or the contrastive metrics) and time of a finished run against another (e.g. the full model).

    Returns ``{"against": path, "metrics": {name: {"run", "against", "delta"}}, "train_time_ratio",
    "wall_time_ratio"}``; slices are compared too when both runs report them.
    """
    from bertology.runs import RunDirectory

    a, b = (RunDirectory(run).read_manifest() or {}).get("summary", {}), finished_summary(against)
    out: dict = {"against": str(against), "metrics": {}}
    for name, value in (a.get("metrics") or {}).items():
        other = (b.get("metrics") or {}).get(name)
        if isinstance(value, (int, float)) and isinstance(other, (int, float)) and name != "n_eval":
            out["metrics"][name] = {"run": value, "against": other, "delta": value - other}
    for name, m in (a.get("slices") or {}).items():
        other = (b.get("slices") or {}).get(name)
        main = "accuracy" if "accuracy" in m else "pearson"
        if other and main in m and main in other:
            out["metrics"][f"{name}_{main}"] = {"run": m[main], "against": other[main], "delta": m[main] - other[main]}
    for key in ("train_time_s", "wall_time_s"):
        if a.get(key) and b.get(key):
            out[key.replace("_s", "_ratio")] = a[key] / b[key]
    return out
