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
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class LatentSpace:
    """The latent model a synthetic study is drawn from: its size, the seed noise, the planted effect, the seed.

    ``n_layers`` x ``n_heads`` points per model; a tuned seed is its task's shift plus ``noise`` times a
    standard normal draw; every head of a planted layer moves by ``effect``; ``seed`` drives every draw.
    """

    n_layers: int = 6
    n_heads: int = 4
    noise: float = 0.3
    effect: float = 6.0
    seed: int = 0


DIM = 8  # the latent points' dimension


def _add(store: dict[str, list[pd.DataFrame]], name: str, df: pd.DataFrame, lead: Mapping[str, object]) -> None:
    """Append ``df`` to ``store[name]`` with the ``lead`` columns first (the study contract's order)."""
    df = df.copy()
    for i, (k, v) in enumerate(lead.items()):
        df.insert(i, k, v)
    store.setdefault(name, []).append(df)


def _write_pair_report(folder: Path, slug: str) -> str:
    """A stand-in pair report page; returns its path relative to the study folder."""
    rel = f"compare/pairs/{slug}/report.html"
    report = folder / rel
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(f"<!DOCTYPE html><title>{slug}</title><p>pair report {slug}</p>", encoding="utf-8")
    return rel


@dataclass
class _Draws:
    """One synthetic study being drawn: the random stream, the base model's quantities, and what is gathered.

    ``out`` holds the per-model tables, ``seedpair`` the seed-vs-seed ones; ``pairs``, ``seed_pairs`` and
    ``jobs`` are the manifest's lists.
    """

    folder: Path
    space: LatentSpace
    rng: np.random.Generator
    base_patterns: np.ndarray
    base_uuas: np.ndarray
    out: dict[str, list[pd.DataFrame]] = field(default_factory=dict)
    seedpair: dict[str, list[pd.DataFrame]] = field(default_factory=dict)
    pairs: list[dict] = field(default_factory=list)
    seed_pairs: list[dict] = field(default_factory=list)
    jobs: list[dict] = field(default_factory=list)

    @classmethod
    def start(cls, folder: Path, space: LatentSpace) -> _Draws:
        """The base model's pattern fractions and UUAS, drawn first from the study's seed."""
        rng = np.random.default_rng(space.seed)
        patterns = rng.dirichlet(np.ones(len(PATTERNS)) * 2, size=(space.n_layers, space.n_heads))
        return cls(folder, space, rng, patterns, np.linspace(0.3, 0.6, space.n_layers + 1))

    def task_seeds(self, task: str, k: int, layer: int | None) -> list[np.ndarray]:
        """Draw the ``k`` seeds of one task (``layer``: its planted layer, None: seed noise only), gather their
        pair and per-model tables, and return their latent points."""
        space = self.space
        shift = np.zeros((space.n_layers, space.n_heads))
        if layer is not None:
            shift[layer - 1, :] = space.effect
        base = np.zeros((space.n_layers, space.n_heads, DIM))
        points = []
        for s in range(k):
            tuned = f"{task}/s{s}"
            lead = {"tuned": tuned, "task": task, "seed": s}
            points.append(x := _points(self.rng, shift, space.noise, DIM))
            att, rep = _pair_rows(base, x, 40)
            _add(self.out, "attention_change", att, lead)
            _add(self.out, "representation_similarity", rep, lead)
            _add(self.out, "attention_patterns", _pattern_rows(self.rng, self.base_patterns, shift), lead)
            _add(self.out, "ablation", _ablation_rows(self.rng, space.n_layers, space.n_heads, layer), lead)
            _add(self.out, "probe", _probe_rows(self.rng, self.base_uuas, layer), lead)
            report = _write_pair_report(self.folder, f"{task}-s{s}")
            self.pairs.append({"tuned": tuned, "task": task, "seed": s, "report": report})
            self.jobs.append({"id": f"finetune:{tuned}", "kind": "finetune", "status": "done", "error": None,
                              "wall_time_s": 12.5})
        return points

    def seed_pairs_of(self, task: str, points: list[np.ndarray]) -> None:
        """Gather the seed-vs-seed pair tables of one task's seeds."""
        for a, b in combinations(range(len(points)), 2):
            att, rep = _pair_rows(points[a], points[b], 40)
            lead = {"task": task, "seed_a": a, "seed_b": b}
            _add(self.seedpair, "attention_change", att, lead)
            _add(self.seedpair, "representation_similarity", rep, lead)
            self.seed_pairs.append({"task": task, "seed_a": a, "seed_b": b,
                                    "dir": f"compare/seedpairs/{task}-{a}-{b}"})

    def write(self, tables: tuple[str, ...], seeds: Mapping[str, int]) -> None:
        """Write the asked ``tables`` (and their ``seedpair_`` twins) and the study manifest."""
        for name, frames in self.out.items():
            if name in tables:
                write_table(self.folder, name, pd.concat(frames, ignore_index=True))
        for name, frames in self.seedpair.items():
            if name in tables:
                write_table(self.folder, f"seedpair_{name}", pd.concat(frames, ignore_index=True))
        manifest = {
            "kind": "study", "status": "done", "base": "minilm",
            "tasks": [{"name": t, "task": "classification", "seeds": list(range(k))} for t, k in seeds.items()],
            "pairs": self.pairs, "seed_pairs": self.seed_pairs, "jobs": self.jobs, "executor": "local",
        }
        (self.folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def synthetic_study(
    folder: str | Path,
    seeds: Mapping[str, int] | None = None,
    *,
    planted: Mapping[str, int] | None = None,
    space: LatentSpace = LatentSpace(),
    tables: tuple[str, ...] = ("attention_change", "representation_similarity", "attention_patterns",
                               "ablation", "probe"),
    failed_job: bool = True,
) -> Path:
    """Write a study directory and return it.

    ``seeds``: seeds per task (default ``{"sst2": 3, "mrpc": 3}``); ``planted``: task -> the layer
    whose every head fine-tuning moves by ``space.effect`` (default ``{"sst2": 5}``); all other units
    move by seed noise only. The ablation plants head (layer, 0) of those tasks (delta -0.2). ``space``:
    the models' size, noise, effect and seed (:class:`LatentSpace`). With ``failed_job`` the manifest
    lists one failed job whose error holds markup (escaping test).
    """
    folder = Path(folder)
    seeds = dict(seeds or {"sst2": 3, "mrpc": 3})
    planted = dict({"sst2": 5} if planted is None else planted)
    draws = _Draws.start(folder, space)
    for task, k in seeds.items():
        draws.seed_pairs_of(task, draws.task_seeds(task, k, planted.get(task)))
    if failed_job:
        draws.jobs.append({"id": "finetune:qnli/s0", "kind": "finetune", "status": "failed",
                           "error": "CUDA out of memory <script>alert(1)</script>", "wall_time_s": 3.0})
    draws.write(tables, seeds)
    return folder
