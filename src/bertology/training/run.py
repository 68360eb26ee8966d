"""Fine-tuning into a run directory: reuse an identical earlier run, or train and write everything.

One place for what ``bertology finetune`` and the demo both need: the run fingerprint, the
reuse-or-refuse decision, the tables (``finetune``, ``finetune_predictions``) and the manifest.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.models.loading import resolve_model, weights_fingerprint
from bertology.results import RunDirectory, now_iso, package_versions, read_table, write_table

KIND = "finetune"


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
    d = config.to_dict()
    d.pop("out", None)
    source, where = resolve_model(config.model)
    weights = weights_fingerprint(where) if source != "hub" else None
    parts = [d, train.fingerprint(), evaluation.fingerprint() if evaluation is not None else None, weights or where]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
) -> FinetuneRun:
    """Fine-tune into ``config.out``, or reuse the identical run already there (unless ``retrain``).

    A folder holding a different run is refused unless ``overwrite`` (see :class:`RunDirectory`).
    """
    from bertology.training.finetune import finetune

    run_dir = RunDirectory(config.out)
    fingerprint = run_fingerprint(config, train, evaluation)
    identical = run_dir.prepare(KIND, fingerprint, overwrite=overwrite)
    model_dir = run_dir.path / "model"
    old = run_dir.read_manifest() or {}
    if identical and not retrain and (model_dir / "config.json").exists() and run_dir.has_table(KIND) and old.get("metrics"):
        return FinetuneRun(
            run_dir.path, model_dir, read_table(run_dir.path, KIND), old["metrics"],
            old.get("result", {}).get("n_train"), 0.0, reused=True, warnings=old.get("warnings", []),
        )

    result = finetune(config, train, evaluation, progress=progress)
    write_table(run_dir.path, KIND, result.table)
    tables = [KIND]
    if result.predictions is not None:
        write_table(run_dir.path, "finetune_predictions", result.predictions)
        tables.append("finetune_predictions")
    details = result.describe()
    warnings = [
        f"{enc['n_truncated']} of {enc['n_input']} {split} examples were truncated to {enc['max_length']} tokens."
        for split, enc in details.get("tokenisation", {}).items()
        if enc.get("n_truncated")
    ]
    run_dir.write_manifest(
        {
            "kind": KIND,
            "fingerprint": fingerprint,
            "bertology_version": package_versions().get("bertology"),
            "created": now_iso(),
            "command": " ".join(sys.argv) if sys.argv else None,
            "config": config.to_dict(),
            "seed": config.seed,
            "device": _device_info(config.device),
            "dtype": "float32",
            "attn_implementation": "eager",
            "packages": package_versions(),
            "models": {
                "base": details.pop("base_model", None),
                "tuned": {"path": str(result.model_dir), "weights_sha256": weights_fingerprint(result.model_dir)},
            },
            "data": {"train": train.describe(), "eval": evaluation.describe() if evaluation is not None else None},
            "result": details,
            "metrics": result.metrics,
            "tables": tables,
            "warnings": warnings,
            "wall_time_s": round(result.wall_time_s, 3),
        }
    )
    return FinetuneRun(
        run_dir.path, Path(result.model_dir), result.table, result.metrics, result.n_train,
        result.wall_time_s, reused=False, warnings=warnings,
    )
