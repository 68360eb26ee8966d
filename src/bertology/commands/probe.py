"""``probe``: structural probes (Hewitt & Manning 2019) on every layer of base, tuned and a random control, into a run folder.

The library function behind ``bertology probe``: it checks its settings against their declarations
(:class:`~bertology.experiments.probe.ProbeSettings` and :class:`ProbeData`, whose fields are the command's
generated flags: one error naming the flag and the field) before anything is loaded, loads the trees and models, names the run with :func:`bertology.runs.fingerprint`,
opens ``out`` in the one command lifecycle (:class:`ProbeCommand`, a :class:`bertology.commands.base.Command`: an
identical earlier run resumes from the cached
word features and finished epochs in ``partial/``; an identical finished run is returned as it is),
runs :func:`bertology.experiments.probe.run_probes`, writes ``tables/probe``, ``figures/probe_*.svg``,
``manifest.json`` (:func:`bertology.runs.build_manifest`) and ``report.html``, and returns a :class:`ProbeRun`.
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from bertology.config import SPACY_MODEL_HELP
from bertology.data.corpus import Corpus, source_name
from bertology.errors import BertologyError
from bertology.experiments.probe import BASELINE_TABLE, TABLE, ProbeSettings
from bertology.experiments.token_probe import TABLE as TOKEN_TABLE
from bertology.experiments.token_probe import TokenProbeSettings
from bertology.commands.base import Command, OpenRun
from bertology.commands.compat import dtype_parts, without_added
from bertology.experiments.ablation_table import TABLE as ERASE_TABLE  # the task-side erasure's rows (mode erase)
from bertology.runs import RunResult, build_manifest, fingerprint, run_folder
from bertology.settings import check_fields, describe_fields, setting_field, settings_object
from bertology.commands.inputs import Loading, resolve, stderr_console

logger = logging.getLogger(__name__)

KIND = "probe"


@dataclass(frozen=True)
class ProbeModels:
    """The models probed: ``base``, optionally ``tuned``, and a seeded random-init model of the base's config."""

    base: str = "minilm"
    tuned: str | None = None
    random_control: bool = False


@dataclass(frozen=True)
class ProbeData:
    """The trees: ``train`` and ``test`` (CoNLL-U with gold trees, or text parsed with spaCy), ``dev`` (default: a
    seeded 10% of train), at most ``max_sentences`` of each file, and the spaCy pipeline for plain text."""

    train: str | Corpus
    test: str | Corpus
    dev: str | Corpus | None = None
    max_sentences: int | None = setting_field(0, "Use at most the first N sentences of each file (0 = all).", minimum=0,
                                              zero_is_none=True)
    spacy_model: str | None = setting_field(None, SPACY_MODEL_HELP, kind=str)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ProbeOptions:
    """How a probe run is set up beyond the probes themselves: the paper conventions preset and whether the word
    features are kept (:func:`probe` takes them as its ``conventions`` and ``keep_features`` keywords)."""

    conventions: str = setting_field(
        "bertology", "Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (docs: Paper "
        "conventions); only probe_punctuation applies here.")
    keep_features: bool = setting_field(
        False, "Keep the word features (partial/features/*.safetensors) after the run.", changes_numbers=False)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class ProbeRun(RunResult):
    """A probe run: the ``probe`` table, the manifest, the figures and report it wrote, and whether it was
    already finished (an identical earlier run, returned as it was)."""

    figures: list[str] = field(default_factory=list)
    report: Path | None = None
    already_complete: bool = False


def settings_of(values: ProbeSettings | Mapping[str, Any] | None, conventions: str = "bertology") -> ProbeSettings:
    """:class:`ProbeSettings` from itself, from a mapping of its fields or None, checked against the declarations
    (one line naming the ``bertology probe`` flag and the field).

    A mapping whose ``punctuation`` is missing or None takes the ``conventions`` preset's ``probe_punctuation``.
    """
    from bertology.conventions import choose

    if isinstance(values, ProbeSettings):
        return settings_object(ProbeSettings, values, "probe")
    values = dict(values or {})
    settings = settings_object(ProbeSettings, values, "probe")
    settings.punctuation = choose(conventions, "probe_punctuation", values.get("punctuation"))
    return settings


def settings_record(settings: ProbeSettings, data: ProbeData, options: ProbeOptions) -> dict:
    """The manifest's ``settings``: every declared setting with its value (punctuation's default: the preset's)."""
    from bertology.conventions import choose

    record = describe_fields([("probe", settings), ("data", data), ("options", options)])
    record["probe"]["punctuation"]["default"] = choose(options.conventions, "probe_punctuation", None)
    return record


def probe(
    models: ProbeModels | str,
    data: ProbeData,
    settings: ProbeSettings | Mapping[str, Any] | None = None,
    *,
    conventions: str = "bertology",
    out: str | Path | None = None,
    loading: Loading = Loading(),
    overwrite: bool = False,
    keep_features: bool = False,
    report: bool = True,
    progress: bool = False,
    token: TokenProbeSettings | Mapping[str, Any] | None = None,
) -> ProbeRun:
    """Distance and depth probes on every layer of ``models`` (a base model name, or :class:`ProbeModels`).

    ``settings`` is a :class:`ProbeSettings` or a mapping of its fields (``{"rank": 64, "epochs": 10}``);
    ``conventions`` is the paper preset that picks the punctuation rule when the settings leave it open.
    ``out`` is the run folder (None: a temporary one; nothing is kept). ``keep_features`` keeps the
    word features in ``partial/features`` after the run. ``token`` (a :class:`TokenProbeSettings` or a mapping of
    its fields, ``{"tasks": "upos"}``) adds token probes with control tasks and MDL (table ``token_probe``).
    Returns the ``probe`` table (and ``token_probe``) and the manifest.
    """
    from bertology.conventions import record

    models = ProbeModels(models) if isinstance(models, str) else models
    settings = settings_of(settings, conventions)
    token = settings_object(TokenProbeSettings, token if token is not None else {}, "probe")
    check_fields(data)
    options = ProbeOptions(conventions, keep_features)
    device, torch_dtype = resolve(settings.device, loading)
    settings = replace(settings, device=device)
    if not settings.probes and not token.tasks:
        raise BertologyError("Nothing to probe: --probes none leaves out the structural probes; name a token probe "
                             "task (--probe-task upos, tags, ...) or a structural probe (--probes distance,depth).")
    corpora = _corpora(data, trees=bool(settings.probes))
    if token.erase_task_data is not None:  # refused or read before any model loads
        from bertology.experiments.task_erasure import NEEDS_TUNED, task_corpus

        if models.tuned is None:
            raise BertologyError(NEEDS_TUNED)
        corpora["erase_task"] = task_corpus(token)
    loaded = _models(models, loading, torch_dtype, settings.seed)
    d = settings.to_dict()
    d.pop("device")
    without_added(KIND, d)  # earlier runs keep their fingerprints
    ids = {name: (m.weights_sha256 or m.path) for name, m in loaded.items() if name != "random"}
    extra = dtype_parts(loading.dtype)
    extra += [{"token_probe": token.to_dict()}] if token.tasks else []  # runs without token probes keep their fingerprint
    fp = fingerprint(d, {k: c.fingerprint() for k, c in corpora.items()}, ids, models.random_control, *extra)
    from bertology.tasks.match import training_warnings

    warned = training_warnings(loaded["tuned"].path, models.tuned) if "tuned" in loaded else []
    for w in warned:  # what its fine-tune said of the model
        logger.warning(w)
    manifest = build_manifest(
        KIND, fp, warnings=warned,
        config={"base": models.base, "tuned": models.tuned, "random_control": models.random_control,
                "train": source_name(data.train), "dev": source_name(data.dev), "test": source_name(data.test),
                "max_sentences": data.max_sentences or 0,
                "spacy_model": data.spacy_model, **settings.to_dict(), "dtype": loading.dtype,
                **({"token_probe": token.to_dict()} if token.tasks else {})},
        conventions=record(conventions, {"probe_punctuation": settings.punctuation}), seed=settings.seed, device=device,
        dtype=loading.dtype, attn_implementation="eager", pooling="mean of sub-word pieces",
        feature_dtype=settings.feature_dtype, settings=settings_record(settings, data, options),
        models={name: {**m.describe(), **({"seed": settings.seed} if name == "random" else {})} for name, m in loaded.items()},
        data={k: c.describe() for k, c in corpora.items()},
    )
    with run_folder(out) as folder:
        command = ProbeCommand(manifest, loaded, corpora, (settings, token), progress, draw=out is not None)
        run = command.run(folder, overwrite=overwrite)
        if not keep_features and not run.already_complete:
            shutil.rmtree(folder / "partial", ignore_errors=True)
        if report and out is not None and not run.already_complete:
            from bertology.report.render import render_report

            run.report = render_report(folder)
        if out is None:
            run.out, run.figures = None, []
    return run


def _corpora(data: ProbeData, trees: bool = True) -> dict:
    """The train, dev (when given) and test corpora, with trees when the structural probes run (``trees``; plain text
    parsed with one spaCy pipeline); without them, files with words (CoNLL-U, a tag file) are taken as they are and
    only plain text is annotated."""
    from bertology.data.annotate import load_spacy
    from bertology.data.loaders import load_corpus
    from bertology.experiments.probe import ensure_trees

    limit = data.max_sentences or None
    nlp: dict = {}

    def load(path: str | Corpus, what: str):
        corpus = load_corpus(path, limit=limit, name=what)
        has_words = any(ex.words is not None for ex in corpus)
        if not trees and has_words:
            return corpus
        if not corpus.has_trees and not corpus.has_pairs and not has_words:
            if "nlp" not in nlp:
                nlp["nlp"] = load_spacy(data.spacy_model)
            return ensure_trees(corpus, nlp=nlp["nlp"])
        try:
            return ensure_trees(corpus, spacy_model=data.spacy_model)
        except BertologyError as err:
            if has_words and not corpus.has_trees:
                raise BertologyError(f"{err} To run token probes alone on it (e.g. a tag file's tags), pass "
                                     "--probes none.") from None
            raise

    corpora = {"train": load(data.train, "train")}
    if data.dev is not None:
        corpora["dev"] = load(data.dev, "dev")
    corpora["test"] = load(data.test, "test")
    return corpora


def _models(models: ProbeModels, loading: Loading, torch_dtype, seed: int) -> dict:
    from bertology.experiments.probe import random_init_model
    from bertology.models.loading import load_model

    loaded = {"base": load_model(models.base, kind="auto", trust_remote_code=loading.trust_remote_code, dtype=torch_dtype)}
    if models.tuned is not None:
        loaded["tuned"] = load_model(models.tuned, kind="auto", trust_remote_code=loading.trust_remote_code,
                                     dtype=torch_dtype, adapter_base=models.base, shared_base=loaded["base"])
    if models.random_control:
        loaded["random"] = random_init_model(loaded["base"], seed)
    return loaded


@dataclass
class ProbeCommand(Command[ProbeRun]):
    """``probe`` in the one lifecycle (:class:`~bertology.commands.base.Command`): training and scoring the probes is
    its work; an identical earlier run resumes from the cached word features and finished epochs in ``partial/``,
    and an identical finished run is returned as it is."""

    name: ClassVar[str] = KIND
    started: dict  # the manifest built before the folder is taken (its fingerprint is the run's)
    loaded: dict
    corpora: dict
    both: tuple
    progress: bool
    draw: bool
    params: dict = field(default_factory=dict)

    def fingerprint(self) -> str:
        return self.started["fingerprint"]

    def reuse(self, run: OpenRun) -> ProbeRun | None:
        from bertology.results import read_table

        old = run.previous
        if not (run.resumed and old.get("status") == "complete"
                and any(run.dir.has_table(name) for name in (TABLE, TOKEN_TABLE))):
            return None
        logger.info("%s already holds this finished run; nothing to do", run.path)
        tables = {name: read_table(run.path, name) for name in (TABLE, BASELINE_TABLE, TOKEN_TABLE, ERASE_TABLE)
                  if run.dir.has_table(name)}
        return ProbeRun(run.path, tables, old, list(old.get("figures", [])), already_complete=True)

    def manifest(self, run: OpenRun) -> dict:
        if run.resumed and (run.path / "partial").exists():
            logger.info("resuming the run in %s (cached features and finished epochs are kept)", run.path)
        self.started["created"] = run.previous.get("created") or self.started["created"]
        return self.started

    def work(self, run: OpenRun) -> dict:
        """The ``probe`` and ``probe_baseline`` tables (and ``token_probe`` when token probes were asked for)."""
        from bertology.experiments.probe import ProbeCorpora, baseline_result, run_probes
        from bertology.experiments.token_probe import refuse_untrainable
        from bertology.progress import stage_bars

        settings, token = self.both
        partial = run.path / "partial"
        refuse_untrainable(self.corpora["train"], self.corpora["test"], token, settings.seed)  # before any probe runs
        with stage_bars(self.progress, lambda s: "training (epochs)" if s == "training" else s,
                        console=stderr_console()) as on_progress:
            try:
                shared: dict = {}  # the structural probes' word features, for the token probes of the same sentences
                corpora = ProbeCorpora(self.corpora["train"], self.corpora["test"], self.corpora.get("dev"))
                result = None if not settings.probes else run_probes(
                    self.loaded, corpora, settings, on_progress=on_progress, work_dir=partial, features_out=shared)
                tokens = _token_probes(self.loaded, self.corpora, settings, token, on_progress, partial, shared)
            except KeyboardInterrupt:
                logger.warning("interrupted: features and finished epochs are saved in %s; run the same command again "
                               "to continue.", partial)
                raise
        self.params = result.params if result is not None else {"warnings": [], "structural_probes": "none asked"}
        tables = {} if result is None else {TABLE: result.table, BASELINE_TABLE: baseline_result(result.params).table}
        if tokens is not None:
            tables[TOKEN_TABLE] = tokens[0]
            self.started["token_probe"] = tokens[1]
            tables.update(tokens[2])
        return tables

    def finished(self, run: OpenRun, manifest: dict, tables) -> dict:
        figures = _write_figures(tables[TABLE], tables[BASELINE_TABLE], run.path) if self.draw and TABLE in tables else []
        erasure = manifest.get("token_probe", {}).get("erasure", {})
        manifest["warnings"] = [*manifest.get("warnings", []), *self.params["warnings"], *erasure.get("warnings", [])]
        return {"probe": self.params, "tables": list(tables), "figures": figures}

    def result(self, run: OpenRun, manifest: dict, tables) -> ProbeRun:
        return ProbeRun(run.path, dict(tables), manifest, list(manifest["figures"]))


def _token_probes(loaded: dict, corpora: dict, settings: ProbeSettings, token: TokenProbeSettings, on_progress,
                  partial: Path, shared: dict):
    """The ``token_probe`` table, its manifest record and the tables beside it (``ablation``: the tuned model's task
    with the erased property, when ``--erase-task-data`` is given), or None when no token probe task was asked for."""
    if not token.tasks:
        return None
    from dataclasses import replace

    from bertology.experiments.ablation_table import Bootstrap
    from bertology.experiments.probe_features import FeaturePass
    from bertology.experiments.token_probe import token_probes

    erasers: dict = {}
    bootstrap = Bootstrap(settings.n_bootstrap, settings.seed)
    features = FeaturePass(settings.layers, settings.extract_batch_size, settings.device, settings.max_length,
                           work_dir=partial, shared=shared)
    table, params = token_probes(loaded, corpora["train"], corpora["test"], token, features=features,
                                 bootstrap=bootstrap, on_progress=on_progress, erasers=erasers)
    if token.erase_task_data is None:
        return table, params, {}
    from bertology.experiments.task_erasure import task_erasure

    effect, params["task_erasure"] = task_erasure(loaded, erasers, token, corpora["erase_task"], bootstrap=bootstrap,
                                                  features=replace(features, work_dir=partial / "erasure"))
    return table, params, {ERASE_TABLE: effect}


def _write_figures(table, baselines, path: Path) -> list[str]:
    from bertology.results import atomic_write_text
    from bertology.viz.figures import figure_to_svg
    from bertology.viz.probe import probe_figures

    figures = []
    for stem, fig in probe_figures(table, baselines=baselines).items():
        file = path / "figures" / f"{stem}.svg"
        atomic_write_text(file, figure_to_svg(fig))
        figures.append(str(file.relative_to(path)))
    return figures
