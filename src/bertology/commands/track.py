"""Trajectories: run analyses on every checkpoint of a fine-tuning run against its base model.

A run trained with ``save_every`` holds ``checkpoints/step-N/`` model folders. :func:`track` compares
each of them (and the final ``model/`` when its weights are not one of the checkpoints) with the base
model through :func:`bertology.commands.compare.compare` (one compare run per checkpoint under
``track/<name>/``, so an interrupted ``track`` resumes: finished checkpoints are reused; other
settings replace them), then
collects each analysis's table across checkpoints into ``tables/track_<analysis>.parquet``/``.csv``
in the run folder, with columns ``model`` (the checkpoint name; a table's own ``base`` rows keep
``base``), ``checkpoint`` and ``step``. :func:`track_figures` plots each metric over training steps.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from bertology.config import DEVICE_HELP
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.runs import RunResult
from bertology.settings import check_fields, comma_list, describe_fields, refuse_unknown, setting_field, seed_field
from bertology.viz.track import track_figures

logger = logging.getLogger(__name__)

DEFAULT_ANALYSES = ("attention_change", "representation_similarity")


@dataclass
class Checkpoint:
    name: str  # "step-N" or "final"
    step: int
    path: Path


@dataclass(frozen=True)
class TrackSettings:
    """What :func:`track` computes per checkpoint: the compare ``analyses`` on the first ``max_examples`` examples
    (``bertology track``'s flags are generated from these fields)."""

    analyses: tuple[str, ...] = setting_field(
        DEFAULT_ANALYSES, "Comma list of compare analyses to run per checkpoint.", parse=comma_list, metavar="NAMES")
    max_examples: int | None = setting_field(300, "Use the first N examples of the corpus (0 = all).", minimum=1,
                                             zero_is_none=True)
    max_length: int = setting_field(128, "Skip examples longer than this many tokens (counted).", minimum=2)
    batch_size: int = setting_field(32, "Examples per forward pass.", minimum=1)
    seed: int = seed_field("Seed of every random choice.")
    device: str = setting_field("cpu", DEVICE_HELP)
    include_final: bool = setting_field(True, "Also the final model when it is not one of the checkpoints.",
                                        flag="--final")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class TrackResult(RunResult):
    """Every checkpoint's analyses: ``tables`` by analysis name (written as ``tables/track_<analysis>``), the run's
    ``manifest`` (with its ``track`` section), the checkpoints, the figures and the checkpoints reused."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    figures: dict[str, Path] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)

    @property
    def run(self) -> Path | None:
        return self.out

    def _repr_html_(self) -> str:
        from html import escape

        names = ", ".join(c.name for c in self.checkpoints)
        return f"<b>TrackResult</b>: {len(self.checkpoints)} checkpoints ({escape(names)}), tables " + ", ".join(
            f"<code>track_{escape(a)}</code>" for a in self.tables
        )


def find_checkpoints(run: str | Path, *, include_final: bool = True) -> list[Checkpoint]:
    """The run's checkpoints by step, plus the final model when it is not byte-identical to one of them."""
    from bertology.models.loading import weights_fingerprint
    from bertology.runs import RunDirectory
    from bertology.training.loop import checkpoints

    run = Path(run)
    found = [Checkpoint(f"step-{s}", s, p) for s, p in checkpoints(run / "checkpoints")]
    final = run / "model"
    if include_final and (final / "config.json").exists():
        manifest = RunDirectory(run).read_manifest() or {}
        result = manifest.get("result", {})
        step = result.get("early_stopping", {}) or {}
        step = step.get("best_step") or result.get("steps_done") or result.get("steps")
        digest = weights_fingerprint(final)
        if not any(weights_fingerprint(c.path) == digest for c in found):
            found.append(Checkpoint("final", int(step) if step is not None else (found[-1].step + 1 if found else 0), final))
    return sorted(found, key=lambda c: (c.step, c.name != "final"))


def label_rows(table: pd.DataFrame, ckpt: Checkpoint) -> pd.DataFrame:
    """``table`` of one checkpoint with ``model`` (its ``tuned`` rows renamed), ``checkpoint`` and ``step`` columns."""
    t = table.copy()
    if "model" in t.columns:
        t["model"] = t["model"].replace({"tuned": ckpt.name})
    else:
        t.insert(0, "model", ckpt.name)
    t.insert(1, "checkpoint", ckpt.name)
    t.insert(2, "step", ckpt.step)
    return t


def track(
    run: str | Path,
    settings: TrackSettings | None = None,
    *,
    corpus: Corpus | None = None,
    data: str | None = None,
    base: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    figures: bool = True,
    **values: Any,
) -> TrackResult:
    """Compare every checkpoint of the fine-tuning run in ``run`` with its base model (see module docs).

    ``settings`` (default :class:`TrackSettings`), with any of its fields given as keywords
    (``track(run, max_examples=8)``). ``base`` defaults to the run's ``config.model``; the corpus to
    ``corpus``, else ``data``, else the run's eval data (or its training data), with the run's column
    settings; the first ``max_examples`` examples are used. ``overwrite`` recomputes every checkpoint.
    Returns the collected tables by analysis name.
    """
    from bertology.commands.selection import select

    settings = _settings(settings, values)
    run = Path(run).expanduser()
    manifest, ckpts = _checkpoints(run, base, settings.include_final)
    cfg = manifest.get("config", {})
    base = base or cfg.get("model")
    data_cfg = cfg.get("data", {}) or {}
    columns = {k: data_cfg.get(k) for k in ("text_column", "pair_column", "label_column")}
    corpus, data = _corpus(corpus, data, cfg, columns)
    corpus = corpus.head(settings.max_examples)
    analyses = select(settings.analyses).names()  # unknown names fail before any checkpoint is compared
    settings = replace(settings, analyses=tuple(analyses))
    if overwrite:
        import shutil

        shutil.rmtree(run / "track", ignore_errors=True)
    tables, reused = _compare_all(run, ckpts, base, corpus, data, columns, settings, progress)
    written = _write(run, tables, figures)
    return TrackResult(run, tables, _record(run, manifest, base, ckpts, corpus, settings, tables, written),
                       ckpts, written, reused)


def _settings(settings: TrackSettings | None, values: dict) -> TrackSettings:
    """The settings with ``values`` applied, each checked by its declaration (one line naming the flag and the field)."""
    refuse_unknown(TrackSettings, values, "track")
    return replace(settings or TrackSettings(), **values)  # replace() re-checks every field


def _checkpoints(run: Path, base: str | None, include_final: bool) -> tuple[dict, list[Checkpoint]]:
    """The fine-tuning run's manifest and checkpoints (one clear error when there is nothing to track)."""
    from bertology.runs import RunDirectory

    manifest = RunDirectory(run).read_manifest()
    if manifest is None or manifest.get("kind") != "finetune":
        raise BertologyError(f"{run} is not a fine-tuning run folder (no finetune manifest.json).")
    cfg = manifest.get("config", {})
    if cfg.get("drop_layers") and base is None:
        raise BertologyError(
            f"{run} removed layer(s) {cfg['drop_layers']} before training, so its checkpoints have fewer layers than "
            "the base model and cannot be compared layer by layer; pass --base with a model of the same depth."
        )
    ckpts = find_checkpoints(run, include_final=include_final)
    if not ckpts:
        raise BertologyError(
            f"{run} has no checkpoints (checkpoints/step-N/) and no final model; train with --save-every N."
        )
    return manifest, ckpts


def _corpus(corpus: Corpus | None, data: str | None, cfg: dict, columns: dict) -> tuple[Corpus, str | None]:
    """The corpus to compare on: given, else ``data``, else the run's eval data or training data."""
    from bertology.data.loaders import load_corpus

    if corpus is not None:
        return corpus, data
    data = data or cfg.get("eval_data") or (cfg.get("data", {}) or {}).get("path")
    if not data:
        raise BertologyError("No data to compare on: the run names no data file (trained on data in memory?); pass "
                             "--data (data= in Python).")
    try:
        return load_corpus(data, **columns), data
    except BertologyError:
        return load_corpus(data), data


def _compare_all(run: Path, ckpts: list[Checkpoint], base: str, corpus: Corpus, data: str | None, columns: dict,
                 settings: TrackSettings, progress: bool) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """One compare run per checkpoint under ``track/`` (an identical one resumed); the tables collected."""
    from bertology.config import CompareConfig, DataConfig
    from bertology.models.loading import load_model
    from bertology.models.pair import ModelPair
    from bertology.commands.compare import compare

    base_model = load_model(base)
    collected: dict[str, list[pd.DataFrame]] = {a: [] for a in settings.analyses}
    reused: list[str] = []
    for ckpt in ckpts:
        logger.info("track: %s (step %d) against %s", ckpt.name, ckpt.step, base)
        pair = ModelPair(base_model, load_model(ckpt.path))
        config = CompareConfig(
            base=str(base), tuned=str(ckpt.path),
            data=DataConfig(path=data or corpus.source, max_examples=settings.max_examples,
                            max_length=settings.max_length, **columns),
            out=str(run / "track" / ckpt.name), analyses=settings.analyses, batch_size=settings.batch_size,
            seed=settings.seed, device=settings.device, view_examples=0,
        )
        # track/ belongs to track: a sub-run with other settings is replaced, an identical one resumed
        result = compare(config, corpus=corpus, pair=pair, overwrite=True, progress=progress, report=False)
        if len(result.resumed) == len(settings.analyses):
            reused.append(ckpt.name)
        for a in settings.analyses:
            if a in result.results:
                collected[a].append(label_rows(result.results[a].table, ckpt))
    return {a: pd.concat(parts, ignore_index=True) for a, parts in collected.items() if parts}, reused


def _write(run: Path, tables: dict[str, pd.DataFrame], figures: bool) -> dict[str, Path]:
    """``tables/track_<analysis>`` and (``figures``) ``figures/track_<analysis>.svg``."""
    from bertology.results import atomic_write_text, write_table

    for a, t in tables.items():
        write_table(run, f"track_{a}", t)
    written: dict[str, Path] = {}
    if figures:
        from bertology.viz.figures import figure_to_svg

        for a, fig in track_figures(tables).items():
            path = run / "figures" / f"track_{a}.svg"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, figure_to_svg(fig, id_prefix=f"track-{a}"))
            written[a] = path
    return written


def _record(run: Path, manifest: dict, base: str, ckpts: list[Checkpoint], corpus: Corpus, settings: TrackSettings,
            tables: dict, written: dict[str, Path]) -> dict:
    """Record what was tracked in the run's manifest (its fine-tuning entries are left as they were); return it."""
    from bertology.results import now_iso
    from bertology.runs import RunDirectory

    run_dir = RunDirectory(run)
    manifest = run_dir.read_manifest() or manifest
    manifest["track"] = {
        "created": now_iso(),
        "base": str(base),
        "analyses": list(settings.analyses),
        "checkpoints": [{"name": c.name, "step": c.step, "path": str(c.path)} for c in ckpts],
        "data": corpus.describe(),
        "max_examples": settings.max_examples,
        "max_length": settings.max_length,
        "settings": describe_fields([("track", settings)]),
        "tables": [f"track_{a}" for a in tables],
        "figures": [str(p.relative_to(run)) for p in written.values()],
    }
    # the run's table list names every table in its folder (the report shows only those)
    manifest["tables"] = sorted(set(manifest.get("tables") or []) | {f"track_{a}" for a in tables})
    run_dir.write_manifest(manifest)
    return manifest
