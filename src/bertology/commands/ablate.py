"""``ablate``: disable every head and layer of a fine-tuned model and measure its task, into a run folder.

The library function behind ``bertology ablate``: it checks its settings against their declarations
(:class:`~bertology.experiments.ablation.AblationSettings` and :class:`QaOptions`, whose fields are the command's
generated flags: one error naming the flag and the field), loads the model and data, names the run with :func:`bertology.runs.fingerprint`, opens
``out`` in the one command lifecycle (:class:`AblateCommand`, a :class:`bertology.commands.base.Command`: an
identical earlier run resumes from its ``partial/`` folder), runs :func:`bertology.experiments.ablation.run_ablation_study`, writes ``tables/ablation``
(+ ``head_importance``, ``pruning_curve``), ``manifest.json`` (:func:`bertology.runs.build_manifest`) and
either ``report.html`` (which draws the figures) or the figures alone, and returns an :class:`AblateRun`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from bertology.conventions import record
from bertology.data.corpus import Corpus, source_name
from bertology.errors import BertologyError
from bertology.experiments.ablation import AblationSettings
from bertology.commands.base import Command, OpenRun
from bertology.commands.compat import ablate_metric, dtype_parts, without_added
from bertology.experiments.interventions import INTERVENTIONS, TRANSPLANT, intervention
from bertology.runs import RunResult, build_manifest, fingerprint, run_folder
from bertology.settings import check_fields, describe_fields, field_settings, setting_field, settings_object
from bertology.commands.inputs import Columns, Loading, resolve, stderr_console
from bertology.tasks.main_metric import MainMetric, main_metric

logger = logging.getLogger(__name__)

KIND = "ablate"
#: The modes that read the base model (--base): the interventions that need one.
BASE_MODES = tuple(name for name, how in INTERVENTIONS.items() if how.needs_base)


@dataclass(frozen=True)
class QaOptions:
    """Question answering only: how long contexts are windowed and answers read (``--doc-stride`` ...)."""

    doc_stride: int = setting_field(128, "QA model: context tokens shared by consecutive windows of a long context (at most half of what a window leaves for the context).",
                                    minimum=0)
    max_answer_length: int = setting_field(30, "QA model: the longest predicted answer, in tokens.", minimum=1)
    null_threshold: float = setting_field(
        0.0, "QA model, SQuAD v2.0 data: answer 'no answer' when the null score beats the best span's by more than this.")

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict:
        return {"doc_stride": self.doc_stride, "max_answer_length": self.max_answer_length,
                "null_threshold": self.null_threshold}


@dataclass
class AblateRun(RunResult):
    """An ablation run: ``tables`` (``ablation``, ``head_importance``, ``pruning_curve``), ``manifest``,
    the headlines (``summary``), how many ablations an interrupted run had already finished, and what it drew."""

    summary: str = ""
    resumed_units: int = 0
    figures: list[Path] = field(default_factory=list)
    report: Path | None = None


def settings_of(values: AblationSettings | Mapping[str, Any] | None) -> AblationSettings:
    """:class:`AblationSettings` from itself, from a mapping of its fields or None (defaults), checked against the
    declarations (one line naming the ``bertology ablate`` flag and the field)."""
    return settings_object(AblationSettings, values, "ablate")


def settings_record(settings: AblationSettings, qa: Mapping[str, Any]) -> dict:
    """The manifest's ``settings``: every declared setting with its value (the QA ones when the model answers questions)."""
    return describe_fields([("ablate", settings), *([("qa", QaOptions(**qa))] if qa else [])])


def ablate(
    model: str,
    data: str | Corpus,
    settings: AblationSettings | Mapping[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    columns: Columns = Columns(),
    qa: QaOptions = QaOptions(),
    loading: Loading = Loading(),
    overwrite: bool = False,
    report: bool = True,
    progress: bool = False,
    base: str | None = None,
) -> AblateRun:
    """Ablate every head and layer of ``model`` (a classifier, regressor, tagger, parser or QA model) on ``data``.

    ``settings`` (an :class:`AblationSettings`, or a mapping of its fields such as ``{"mode": "zero"}``;
    default: its defaults) says how heads are disabled and what is measured;
    ``out`` is the run folder (None: a temporary one, so nothing is kept and the run cannot resume).
    ``report`` writes ``report.html`` (with the figures); without it the figures are written alone.
    ``base`` (``--base``) is the pretrained model ``model`` was fine-tuned from: ``mode="revert"`` needs it (and only
    that mode takes it); a base of another shape or tokenizer is refused in one line.
    Returns the tables, the manifest and the headlines.
    """
    settings = settings_of(settings)
    check_fields(qa)
    _check_base_given(settings, base)
    device, torch_dtype = resolve(settings.device, loading)
    settings = replace(settings, device=device)
    early = _labels_first(model, data, settings, columns, loading)  # a label mismatch: one line before any weights load
    loaded, corpus, task, encoded, qa_used = _inputs(model, data, settings, columns, qa, loading, torch_dtype, early)
    main = main_metric(task, settings.metric, corpus=corpus, model=loaded.model, model_path=loaded.path)
    base_loaded = None if base is None else _load_base(base, loaded, loading, torch_dtype)
    d = {**settings.to_dict(), **qa_used}
    # recorded, not fingerprinted (declared changes_numbers=False): the device and the units per forward (results agree
    # to float rounding; a run may resume on another device), the conventions (none changes the sweep)
    for declared in field_settings(AblationSettings):
        if not declared.changes_numbers:
            d.pop(declared.name)
    without_added(KIND, ablate_metric(d, main.metric, task.default_metric))  # earlier runs keep their fingerprints
    weights = loaded.weights_sha256 or loaded.path
    extra = dtype_parts(loading.dtype)
    if base_loaded is not None:  # revert's numbers depend on the base's weights
        extra.append(base_loaded.weights_sha256 or base_loaded.path)
    fp = fingerprint(d, corpus.fingerprint(word_tags=task.token_level), weights, *extra)
    with run_folder(out) as folder:
        how = _Run(columns, qa_used, loading, overwrite, report and out is not None, out is not None, progress,
                   base_loaded, main)
        result = AblateCommand(fp, (model, data), _Read(loaded, corpus, task, encoded), settings, how).run(
            folder, overwrite=how.overwrite)
        if out is None:
            result.out, result.figures, result.report = None, [], None
    return result


@dataclass(frozen=True)
class _Run:
    """What :func:`ablate` passes on to the part that writes the run folder."""

    columns: Columns
    qa: dict
    loading: Loading
    overwrite: bool
    report: bool
    draw: bool  # figures (or the report) at all: not for a run kept in memory
    progress: bool
    base: Any = None  # the loaded base model (revert mode), else None
    main: MainMetric | None = None  # the metric the run is judged by (None: decided by the study)


class _Read(NamedTuple):
    """What :func:`ablate` loaded: the model, the (sampled) corpus, the model's task and the encoded QA windows."""

    loaded: Any
    corpus: Corpus
    task: Any
    encoded: Any


def _check_base_given(settings: AblationSettings, base: str | None) -> None:
    """Revert needs ``--base``; the other modes do not read one (refused rather than silently ignored)."""
    needs = intervention(settings.mode).needs_base
    if needs and base is None:
        raise BertologyError(f"--mode {settings.mode} needs --base: the pretrained model the tuned one was fine-tuned from.")
    if not needs and base is not None:
        raise BertologyError(f"--base is read by --mode {' and '.join(BASE_MODES)} only, not by --mode {settings.mode}.")


def _load_base(base: str, tuned, loading: Loading, torch_dtype):
    """The base model, checked against the tuned one (architecture, shape, tokenizer: one line each)."""
    from bertology.models.loading import check_recorded_base, load_model
    from bertology.models.pair import check_compatible

    adapter = tuned.extra.get("adapter") or {}
    warning = check_recorded_base(tuned.name, adapter.get("recorded_base"), base)  # refused before the base loads
    if warning:
        logger.warning(warning)
    loaded = load_model(base, kind="auto", trust_remote_code=loading.trust_remote_code, dtype=torch_dtype)
    check_compatible(loaded, tuned)
    return loaded


def _require_some_labels(corpus: Corpus) -> None:
    """One line for data without any label (a sentence-level task needs them)."""
    if not any(ex.label is not None for ex in corpus):
        fix = ("Give rows with their labels: a list of dicts, a DataFrame or a file."
               if corpus.stats.get("format") == "list"
               else "Name the label column with --label-column (label_column= in Python).")
        raise BertologyError(f"{corpus.source} has no labels; ablation measures a task and needs labelled data. {fix}")


def _labels_first(model: str, data: str | Corpus, settings: AblationSettings, columns: Columns,
                  loading: Loading) -> Corpus | None:
    """The data, read before the model's weights when the model's ``config.json`` names a sentence classifier, its
    labels (put onto the model's by ``--label-map``) checked against the labels the config knows: a mismatch is one
    line (suggesting ``--label-map``) before anything heavy loads. None when the config cannot be read cheaply (a
    PEFT adapter, an unreachable hub id) or names another head: the data is then read after the model, as before."""
    from bertology.data.labels import map_labels
    from bertology.data.loaders import load_corpus
    from bertology.models.loading import read_config
    from bertology.tasks.match import config_label_problem, is_sentence_classifier

    config = read_config(model, trust_remote_code=loading.trust_remote_code)
    if config is None or not is_sentence_classifier(config):
        return None
    corpus = load_corpus(data, **columns.to_dict())
    _require_some_labels(corpus)
    problem = config_label_problem(config, map_labels(corpus, settings.label_map))
    if problem is not None:
        raise BertologyError(problem)
    return corpus


def _inputs(model: str, data: str | Corpus, settings: AblationSettings, columns: Columns, qa: QaOptions,
            loading: Loading, torch_dtype, read: Corpus | None = None):
    """The loaded model, the (sampled) corpus, the model's task, the encoded QA windows and the QA settings used.
    ``read``: the data already read (:func:`_labels_first`)."""
    from bertology.data.loaders import load_corpus
    from bertology.experiments.ablation import sample_examples
    from bertology.models.loading import load_model
    from bertology.tasks.catalog import task_of_model

    from bertology.data.labels import map_labels

    loaded = load_model(model, kind="auto", trust_remote_code=loading.trust_remote_code, dtype=torch_dtype)
    task = task_of_model(loaded.model, name=f"Model {model!r}")
    if settings.label_map is not None and (task.token_level or task.name == "qa"):
        raise BertologyError(f"--label-map (label_map) maps sentence labels; model {model!r} is a {task.name} model, "
                             "scored on its data's own word-level or answer targets.")
    if task.name == "qa":  # SQuAD JSON: every question cut into windows; the bootstrap resamples questions
        if not isinstance(data, str):
            raise BertologyError(f"Model {model!r} answers questions: its data is a SQuAD .json file; pass its path.")
        from bertology.data.qa_features import encode_squad
        from bertology.data.squad import read_squad

        corpus = read_squad(data).stratified_sample(settings.max_examples, settings.seed)
        used = qa.to_dict()
        return loaded, corpus, task, encode_squad(corpus, loaded.tokenizer, settings.max_length, **used), used
    corpus = read if read is not None else load_corpus(data, **columns.to_dict())
    # a parser scores trees and a tagger word tags, not sentence labels
    if not task.token_level:
        _require_some_labels(corpus)
        corpus = map_labels(corpus, settings.label_map)  # the data's labels as the model's (--label-map)
    task.targets(corpus, loaded.model)
    return loaded, sample_examples(corpus, settings.max_examples, settings.seed), task, None, {}


@dataclass
class AblateCommand(Command[AblateRun]):
    """``ablate`` in the one lifecycle (:class:`~bertology.commands.base.Command`): the sweep is its work; an
    identical earlier run resumes from its ``partial/`` folder (finished ablations are kept)."""

    name: ClassVar[str] = KIND
    fp: str
    given: tuple[str, Any]  # the model and the data as the user named them (recorded in the manifest's config)
    read: _Read
    settings: AblationSettings
    how: _Run
    study: Any = None  # the study's result (set by work)

    def fingerprint(self) -> str:
        return self.fp

    def manifest(self, run: OpenRun) -> dict:
        """The manifest written before the sweep (and the fine-tune's warnings about the model, logged)."""
        from bertology.tasks.match import training_warnings

        if run.resumed and (run.path / "partial").exists():
            logger.info("resuming the run in %s (finished ablations are kept)", run.path)
        warned = training_warnings(self.read.loaded.path, self.given[0])  # what its fine-tune said of the model
        for w in warned:
            logger.warning(w)
        settings, how, (model, data) = self.settings, self.how, self.given
        base = {"base": how.base.describe()} if how.base is not None else {}
        return build_manifest(
            KIND, self.fp, created=run.created, warnings=warned,
            config={"model": model, "data": source_name(data), **how.columns.to_dict(), **settings.to_dict(),
                    **how.qa, "dtype": how.loading.dtype},
            seed=settings.seed, device=settings.device, dtype=how.loading.dtype, attn_implementation="eager",
            settings=settings_record(settings, how.qa), ablation_mode=settings.mode, task=self.read.task.name,
            conventions=record(settings.conventions, {}),  # the preset; none of its conventions applies to the sweep
            models={"tuned": self.read.loaded.describe(), **base},
            data=self.read.corpus.describe(),
        )

    def work(self, run: OpenRun) -> dict:
        """The sweep (resuming finished ablations from ``partial/``): ``ablation``, ``head_importance`` ..."""
        from bertology.experiments.ablation import run_ablation_study
        from bertology.progress import stage_bars

        how, (loaded, corpus, _, encoded) = self.how, self.read
        with stage_bars(how.progress, lambda s: "ablations" if s == "ablation" else "importance + pruning",
                        console=stderr_console()) as on_progress:
            try:
                # the report draws every figure (and saves them under figures/); without it the study saves its own
                self.study = run_ablation_study(
                    loaded.model, loaded.tokenizer, encoded if encoded is not None else corpus,
                    self.settings, run.path / "partial", encoded=encoded, on_progress=on_progress,
                    base=None if how.base is None else how.base.model, main=how.main)
            except KeyboardInterrupt:
                logger.warning("interrupted: finished ablations are saved in %s; run the same command again to continue.",
                               run.path / "partial")
                raise
        return self.study.tables

    def finished(self, run: OpenRun, manifest: dict, tables) -> dict:
        figures = write_figures(tables, run.path) if self.how.draw and not self.how.report else []
        return {"result": self.study.summary, "tables": list(tables),
                "figures": [str(p.relative_to(run.path)) for p in figures]}

    def result(self, run: OpenRun, manifest: dict, tables) -> AblateRun:
        """The headlines and the report (rendered after the folder is released)."""
        from bertology.experiments.ablation import summary

        resumed = self.study.ablation.params.get("resumed_units", 0)
        headlines = summary(tables, note=f"; {resumed} ablations reused" if resumed else "")
        report_path = None
        if self.how.report:
            from bertology.report.render import render_report

            report_path = render_report(run.path)
        figures = [run.path / f for f in manifest["figures"]]
        return AblateRun(run.path, dict(tables), manifest, headlines, resumed, figures, report_path)


def write_figures(tables: dict, out: Path) -> list[Path]:
    """The ablation figures as ``figures/*.svg`` (without a report, which would otherwise draw them)."""
    from bertology.results import atomic_write_text
    from bertology.viz.ablation import ablation_figures
    from bertology.viz.figures import figure_to_svg

    written = []
    if TRANSPLANT.table in tables:  # --mode transplant: the two layer curves
        from bertology.viz.transplant import transplant_figures

        figs = transplant_figures(tables[TRANSPLANT.table])
    else:
        figs = ablation_figures(tables["ablation"], tables.get("head_importance"), tables.get("pruning_curve"))
    for stem, fig in figs.items():
        path = out / "figures" / f"{stem}.svg"
        atomic_write_text(path, figure_to_svg(fig))
        written.append(path)
    return written


__all__: Sequence[str] = ("AblateRun", "QaOptions", "ablate", "settings_of", "settings_record", "write_figures")
