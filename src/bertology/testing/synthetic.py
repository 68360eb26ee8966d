"""A synthetic study directory with planted effects, for tests of the seed-noise statistics and the study report.

Each model is a point per layer and head in a small latent space: the base at 0, a tuned seed of
task T at ``shift[T, layer] + noise * eps_seed``. Distances between points become the pair tables
(1 - cosine, JS, 1 - CKA grow with the distance), so base-vs-tuned and seed-vs-seed rows are as
consistent as those of real models. Per-model quantities (pattern fractions, probe UUAS, ablation
deltas) move with the same shift. No model is loaded; everything is written with the study contract's
columns (``tuned, task, seed`` first; ``task, seed_a, seed_b`` in the ``seedpair_*`` tables).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.results import write_table

PATTERNS = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
METRICS = ("rsa_pearson", "rsa_spearman", "cka_linear", "cka_debiased")


def _points(rng, shift: np.ndarray, noise: float, dim: int) -> np.ndarray:
    """One model's latent points [layers, heads, dim]."""
    n_layers, n_heads = shift.shape
    direction = np.zeros(dim)
    direction[0] = 1.0
    return shift[:, :, None] * direction + noise * rng.standard_normal((n_layers, n_heads, dim))


def _pair_rows(x: np.ndarray, y: np.ndarray, n_examples: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """attention_change and representation_similarity rows for two models' latent points."""
    dist = np.linalg.norm(x - y, axis=-1)  # [layers, heads]
    n_layers, n_heads = dist.shape
    att = [
        {"layer": layer + 1, "head": h, "cosine": float(1 - min(1.0, 0.1 * dist[layer, h])),
         "js_divergence": float(min(1.0, 0.05 * dist[layer, h])), "n_examples": n_examples}
        for layer in range(n_layers) for h in range(n_heads)
    ]
    layer_dist = np.concatenate([[0.0], dist.mean(axis=1)])  # layer 0 = embeddings: unchanged
    rep = [
        {"layer_base": lb, "layer_tuned": lt, "metric": metric,
         "value": float(1 - min(1.0, 0.08 * layer_dist[lb] * (1 + 0.1 * i))) if lb == lt else 0.3,
         "n_tokens": 500}
        for lb in range(n_layers + 1) for lt in range(n_layers + 1) for i, metric in enumerate(METRICS)
    ]
    return pd.DataFrame(att), pd.DataFrame(rep)


def _pattern_rows(rng: np.random.Generator, base_patterns: np.ndarray, shift: np.ndarray) -> pd.DataFrame:
    """Patterns: tuned = base fractions tilted towards "heterogeneous" by the shift, plus noise."""
    logits = np.log(base_patterns) + 0.05 * rng.standard_normal(base_patterns.shape)
    logits[..., -1] += 0.3 * shift
    tuned_patterns = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    n_layers, n_heads = shift.shape
    return pd.DataFrame([{"model": model, "layer": layer + 1, "head": h, "pattern": pattern,
                          "fraction": float(frac[layer, h, p])}
                         for model, frac in (("base", base_patterns), ("tuned", tuned_patterns))
                         for layer in range(n_layers) for h in range(n_heads) for p, pattern in enumerate(PATTERNS)])


def _ablation_rows(rng: np.random.Generator, n_layers: int, n_heads: int, planted: int | None) -> pd.DataFrame:
    """Ablation on the tuned model: head (planted layer, 0) matters (delta -0.2), the rest is noise."""
    rows = [{"target": "intact", "layer": -1, "head": -1, "mode": "uniform", "metric": "accuracy",
             "value": 0.9, "delta": 0.0, "ci_low": 0.0, "ci_high": 0.0, "n_examples": 200}]
    for layer in range(n_layers):
        for h in range(-1, n_heads):
            d = 0.01 * rng.standard_normal()
            if layer + 1 == planted and h == 0:
                d -= 0.2
            rows.append({"target": "layer" if h < 0 else "head", "layer": layer + 1, "head": h,
                         "mode": "uniform", "metric": "accuracy", "value": 0.9 + d, "delta": d,
                         "ci_low": d - 0.02, "ci_high": d + 0.02, "n_examples": 200})
    return pd.DataFrame(rows)


def _probe_rows(rng: np.random.Generator, base_uuas: np.ndarray, planted: int | None) -> pd.DataFrame:
    """Probes: the tuned model loses UUAS in the planted layer."""
    rows = []
    for layer in range(len(base_uuas)):
        drop = 0.15 if layer == planted else 0.0
        for model, u in (("base", base_uuas[layer]), ("tuned", base_uuas[layer] - drop + 0.01 * rng.standard_normal())):
            for probe in ("distance", "depth"):
                rows.append({"model": model, "layer": layer, "probe": probe, "split": "test",
                             "uuas": u if probe == "distance" else np.nan,
                             "dspr": 0.7 if probe == "distance" else np.nan,
                             "root_acc": 0.8 if probe == "depth" else np.nan,
                             "nspr": 0.75 if probe == "depth" else np.nan})
    return pd.DataFrame(rows)


def synthetic_study(
    folder: str | Path,
    seeds: Mapping[str, int] | None = None,
    *,
    planted: Mapping[str, int] | None = None,
    n_layers: int = 6,
    n_heads: int = 4,
    noise: float = 0.3,
    effect: float = 6.0,
    seed: int = 0,
    tables: tuple[str, ...] = ("attention_change", "representation_similarity", "attention_patterns",
                               "ablation", "probe"),
    failed_job: bool = True,
) -> Path:
    """Write a study directory and return it.

    ``seeds``: seeds per task (default ``{"sst2": 3, "mrpc": 3}``); ``planted``: task -> the layer
    whose every head fine-tuning moves by ``effect`` (default ``{"sst2": 5}``); all other units move
    by seed noise only. The ablation plants head (layer, 0) of those tasks (delta -0.2). With
    ``failed_job`` the manifest lists one failed job whose error holds markup (escaping test).
    """
    folder = Path(folder)
    seeds = dict(seeds or {"sst2": 3, "mrpc": 3})
    planted = dict({"sst2": 5} if planted is None else planted)
    rng = np.random.default_rng(seed)
    dim = 8
    base = np.zeros((n_layers, n_heads, dim))
    base_patterns = rng.dirichlet(np.ones(len(PATTERNS)) * 2, size=(n_layers, n_heads))
    base_uuas = np.linspace(0.3, 0.6, n_layers + 1)
    out: dict[str, list[pd.DataFrame]] = {}
    seedpair: dict[str, list[pd.DataFrame]] = {}
    models: dict[tuple[str, int], np.ndarray] = {}

    def add(store, name, df, lead: Mapping[str, object]):
        df = df.copy()
        for i, (k, v) in enumerate(lead.items()):
            df.insert(i, k, v)
        store.setdefault(name, []).append(df)

    pairs, seed_pairs, jobs = [], [], []
    for task, k in seeds.items():
        shift = np.zeros((n_layers, n_heads))
        if task in planted:
            shift[planted[task] - 1, :] = effect
        for s in range(k):
            tuned = f"{task}/s{s}"
            lead = {"tuned": tuned, "task": task, "seed": s}
            x = _points(rng, shift, noise, dim)
            models[(task, s)] = x
            att, rep = _pair_rows(base, x, 40)
            add(out, "attention_change", att, lead)
            add(out, "representation_similarity", rep, lead)
            layer = planted.get(task)
            add(out, "attention_patterns", _pattern_rows(rng, base_patterns, shift), lead)
            add(out, "ablation", _ablation_rows(rng, n_layers, n_heads, layer), lead)
            add(out, "probe", _probe_rows(rng, base_uuas, layer), lead)
            slug = f"{task}-s{s}"
            report = folder / "compare" / "pairs" / slug / "report.html"
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(f"<!DOCTYPE html><title>{slug}</title><p>pair report {slug}</p>", encoding="utf-8")
            pairs.append({"tuned": tuned, "task": task, "seed": s, "report": f"compare/pairs/{slug}/report.html"})
            jobs.append({"id": f"finetune:{tuned}", "kind": "finetune", "status": "done", "error": None,
                         "wall_time_s": 12.5})
        for a, b in combinations(range(k), 2):
            att, rep = _pair_rows(models[(task, a)], models[(task, b)], 40)
            lead = {"task": task, "seed_a": a, "seed_b": b}
            add(seedpair, "attention_change", att, lead)
            add(seedpair, "representation_similarity", rep, lead)
            seed_pairs.append({"task": task, "seed_a": a, "seed_b": b, "dir": f"compare/seedpairs/{task}-{a}-{b}"})
    if failed_job:
        jobs.append({"id": "finetune:qnli/s0", "kind": "finetune", "status": "failed",
                     "error": "CUDA out of memory <script>alert(1)</script>", "wall_time_s": 3.0})
    for name, frames in out.items():
        if name in tables:
            write_table(folder, name, pd.concat(frames, ignore_index=True))
    for name, frames in seedpair.items():
        if name in tables:
            write_table(folder, f"seedpair_{name}", pd.concat(frames, ignore_index=True))
    manifest = {
        "kind": "study", "status": "done", "base": "minilm",
        "tasks": [{"name": t, "task": "classification", "seeds": list(range(k))} for t, k in seeds.items()],
        "pairs": pairs, "seed_pairs": seed_pairs, "jobs": jobs, "executor": "local",
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return folder
