"""``patterns export`` / ``patterns train``: label attention maps by hand, train Kovaleva's small CNN on the labels.

:func:`export_patterns` samples maps of one model and writes thumbnails, ``maps.npz``, ``labels.csv``
(label column empty), an ``index.html`` contact sheet and ``export.json`` for labelling;
:func:`train_patterns` cross-validates the CNN on the labelled rows, scores its agreement with the rule
classifier and saves it (``pattern_cnn.safetensors`` + ``pattern_cnn.json``), which
``AttentionPatterns(classifier=PatternClassifier.load(DIR))`` can use instead of the rules. Both check
their settings against the declarations (the fields of :class:`ExportSettings` and
:class:`~bertology.experiments.pattern_cnn.TrainSettings`, which are the commands' generated flags: one error
naming the flag and the field) before anything is loaded, and return a result object.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bertology.config import DEVICE_HELP
from bertology.errors import BertologyError
from bertology.experiments.pattern_cnn import META_FILE, TrainReport, TrainSettings
from bertology.experiments.pattern_labels import MapSample
from bertology.runs import RunResult
from bertology.settings import check_fields, describe_fields, field_setting, setting_field, seed_field
from bertology.commands.inputs import Columns, Loading


@dataclass(frozen=True)
class ExportSettings:
    """Which maps are exported: ``examples`` examples (seeded) x the ``heads`` (``all`` or ``L2H1,L3``), at most
    ``limit`` maps, resized to ``size`` pixels; inputs over ``max_length`` tokens skipped; ``batch_size`` per pass."""

    examples: int = setting_field(20, "How many examples to sample (seeded).", minimum=1)
    heads: str = setting_field("all", "'all' or comma-separated L<layer>H<head> / L<layer> (layers 1..N).")
    limit: int = setting_field(400, "At most this many maps (Kovaleva labelled ~400); sampled when more.", minimum=1,
                               paper="Kovaleva et al. 2019")
    size: int = setting_field(32, "Side of the resized map images the CNN will see (multiple of 8).", minimum=8)
    seed: int = seed_field("Seed for the choice of examples and maps.")
    max_length: int = setting_field(128, "Skip examples longer than this many tokens (counted).", minimum=1)
    batch_size: int = setting_field(16, "Examples per forward pass.", minimum=1)
    device: str = setting_field("cpu", DEVICE_HELP, changes_numbers=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.size % 8:
            raise field_setting(ExportSettings, "size").refuse("must be a positive multiple of 8", self.size)


@dataclass
class PatternExport(RunResult):
    """An export: ``tables["labels"]`` (the rows to label), ``manifest`` (``export.json``) and the sampled maps."""

    sample: MapSample | None = None
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class PatternTraining(RunResult):
    """A trained pattern CNN: ``tables`` ``folds`` (macro-F1 per fold) and ``per_class`` (out-of-fold F1, counts),
    ``manifest`` (``pattern_cnn.json``), the cross-validation report and how many unlabelled rows were skipped."""

    report: TrainReport | None = None
    n_skipped: int = 0


def export_patterns(
    model: str,
    data: str,
    settings: ExportSettings = ExportSettings(),
    *,
    out: str | Path,
    columns: Columns = Columns(),
    loading: Loading = Loading(),
    overwrite: bool = False,
) -> PatternExport:
    """Sample attention maps of ``model`` on ``data`` and write them into ``out`` for a person to label.

    A non-empty ``out`` is refused unless ``overwrite`` (which replaces only the export's own files).
    """
    from bertology.data.encode import encode_corpus
    from bertology.data.loaders import load_corpus
    from bertology.experiments.pattern_labels import MapChoice, sample_maps, write_export
    from bertology.metrics.patterns import PATTERNS, PatternThresholds
    from bertology.models.device import resolve_device
    from bertology.models.loading import load_model
    from bertology.viz.patterns import thumbnail_png

    check_fields(settings)
    resolve_device(settings.device)  # a missing GPU is an error now, not after loading
    out = Path(out).expanduser()
    if out.exists() and out.is_dir() and any(out.iterdir()) and not overwrite:
        raise BertologyError(f"--out {out} is not empty; choose an empty folder or pass --overwrite.")
    loaded = load_model(model, trust_remote_code=loading.trust_remote_code)
    corpus = load_corpus(data, text_column=columns.text, pair_column=columns.pair)
    encoded = encode_corpus(corpus, loaded.tokenizer, max_length=settings.max_length)
    if not encoded.items:
        raise BertologyError(f"every example of {corpus.source} is longer than --max-length {settings.max_length}.")
    thresholds = PatternThresholds()
    choice = MapChoice(settings.examples, settings.heads, settings.limit, settings.seed)
    sample = sample_maps(loaded, encoded, choice, size=settings.size, batch_size=settings.batch_size, thresholds=thresholds,
                         corpus=corpus, device=settings.device)
    info = {
        "model": loaded.describe(),
        "data": {"source": corpus.source, "n_examples": len(corpus), "encoding": encoded.describe()},
        "examples": settings.examples, "heads": settings.heads, "limit": settings.limit, "seed": settings.seed,
        "thresholds": thresholds.to_dict(), "settings": describe_fields([("export", settings)]),
    }
    write_export(sample, out, thumbnail_png, info=info, overwrite=overwrite)
    counts = {p: int((sample.predicted == i).sum()) for i, p in enumerate(PATTERNS)}
    labels = pd.read_csv(out / "labels.csv", keep_default_na=False)
    manifest = json.loads((out / "export.json").read_text(encoding="utf-8"))
    return PatternExport(out, {"labels": labels}, manifest, sample, counts)


def train_patterns(
    labels: str | Path,
    settings: TrainSettings = TrainSettings(),
    *,
    out: str | Path | None = None,
    folds: int = 5,
    overwrite: bool = False,
) -> PatternTraining:
    """Cross-validate the pattern CNN on the labelled rows of ``labels`` (a ``labels.csv`` from
    :func:`export_patterns`), then fit it on all of them and save it into ``out`` (default: ``cnn/`` beside the CSV)."""
    from bertology.experiments.pattern_cnn import train_pattern_cnn
    from bertology.experiments.pattern_labels import read_labels

    labels = Path(labels).expanduser()
    check_fields(settings)
    data = read_labels(labels)
    folder = Path(out or labels.parent / "cnn").expanduser()
    if (folder / META_FILE).exists() and not overwrite:
        raise BertologyError(f"{folder} already holds a pattern CNN; choose another --out or pass --overwrite.")
    clf, report = train_pattern_cnn(data.images, data.labels, folds=folds, settings=settings, rules=data.rules)
    clf.metadata["labels_csv"] = str(labels.resolve())
    clf.metadata["n_skipped_unlabelled"] = data.n_skipped
    clf.metadata["settings"] = describe_fields([("train", settings)])
    clf.save(folder)
    tables = {
        "folds": pd.DataFrame({"fold": range(1, len(report.fold_macro_f1) + 1), "macro_f1": report.fold_macro_f1}),
        "per_class": pd.DataFrame({"pattern": list(report.per_class_f1),
                                   "f1_out_of_fold": list(report.per_class_f1.values()),
                                   "n_labelled": [report.label_counts.get(c, 0) for c in report.per_class_f1]}),
    }
    return PatternTraining(folder, tables, dict(clf.metadata), report, data.n_skipped)
