"""``bertology compare``: load the pair, extract once, analyse, run the experiments, write the run directory.

The run's lifecycle for one pair (:class:`PairJob`: fingerprint, hold the folder, resume finished tables, stream,
experiments, views, manifest, report) and :func:`compare`, one job. What the run selects and how its settings are
completed is :mod:`bertology.commands.selection`; reading its data and the warnings about it,
:mod:`bertology.commands.compare_data`. (Was ``bertology.pipeline``.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec
from bertology.analyses.representation_similarity import OOD_TABLE, RepresentationSimilarity
from bertology.blas import one_blas_thread
from bertology.config import CompareConfig
from bertology.conventions import describe as describe_conventions
from bertology.conventions import preset_values, resolve as resolve_conventions
from bertology.experiments.registry import ExperimentContext, ExperimentSpec
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.memory import MemoryWatch
from bertology.models.device import resolve_device
from bertology.models.precision import resolve_dtype
from bertology.models.pair import ModelPair
from bertology.progress import BarText
from bertology.progress import progress_bar as bar_over
from bertology.results import Result, read_table, write_table
from bertology.commands.base import hold
from bertology.runs import RunDirectory, manifest_header
from bertology.tasks.match import training_warnings
from bertology.commands.compare_data import (
    annotate_if_needed,
    check_relation_names,
    encoding_warnings,
    load_data,
    load_ood,
    load_relations,
    relations_analysis,
    tree_warnings,
    with_user_relations,
    write_views,
)
from bertology.commands.selection import (
    Selection,
    build_analyses,
    complete_config,
    precheck_experiments,
    refuse_unrunnable,
    select,
    settings_record,
    unread_settings,
)


logger = logging.getLogger(__name__)


@dataclass
class CompareRun:
    """What ``compare`` produced: the run folder, the results by table name and the manifest."""

    out: Path
    results: dict[str, Result]
    manifest: dict
    report: Path | None = None
    resumed: list[str] = field(default_factory=list)

    def table(self, name: str):
        return self.results[name].table

    def _repr_html_(self) -> str:
        """A compact listing (the notebook API's ``bertology.compare`` returns a richer card)."""
        from html import escape

        return (f"<b>compare</b> run ({escape(str(self.out))}): tables "
                + ", ".join(f"<code>{escape(n)}</code> ({len(r.table)} rows)" for n, r in self.results.items()))


def record_plan(run_dir, selection: Selection, config: CompareConfig) -> None:
    """Put the tables each selected analysis and experiment will write into the running manifest (``planned``), so a
    report of an interrupted run can name what is missing; a finished manifest replaces it."""
    manifest = run_dir.read_manifest() or {}
    if manifest.get("status") != "running":
        return
    planned = {spec.name: list(spec.tables) for spec in selection.analyses}
    planned |= {spec.name: list(spec.tables(config)) for spec in selection.experiments}
    run_dir.write_manifest({**manifest, "planned": planned})


def run_fingerprint(
    config: CompareConfig, pair: ModelPair, corpus: Corpus, relations: Corpus | None = None, ood: Corpus | None = None
) -> str:
    """Identity of a run: settings, model weights and data. Equal fingerprints may resume each other."""
    parts = [config.fingerprint(), corpus.fingerprint()]
    if relations is not None:
        parts.append(relations.stats.get("file_sha256"))
    if ood is not None:
        parts.append(["ood", ood.fingerprint()])
    for path in (config.probe_train, config.probe_dev, config.probe_test):
        if path and Path(path).is_file():  # the probe files' contents, not only their names
            parts.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
    for m in (pair.base, pair.tuned):
        parts.append(m.weights_sha256 or m.path)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@dataclass
class Inputs:
    """What every pair of a run shares: the resolved settings, the selection and the data (annotated, encoded).

    Built once by :func:`prepare_inputs`; ``compare`` has one pair, ``compare_many`` several over the
    same inputs, so each pair sees exactly the examples, batches and settings of a run of its own.
    """

    config: CompareConfig
    selection: Selection
    specs: tuple[AnalysisSpec, ...]
    corpus: Corpus
    raw_corpus: Corpus
    encoded: EncodedCorpus
    max_length: int
    spans: tuple | None
    ood: Corpus | None
    warnings: list[str]


def resolve_settings(config: CompareConfig) -> tuple[CompareConfig, Selection, torch.dtype]:
    """The config with paper conventions and the device resolved, the selection, and the model dtype.

    Unknown names and devices fail here, before anything is loaded.
    """
    torch.manual_seed(config.seed)
    config = complete_config(config)  # every declared setting checked and its default filled in
    config = resolve_conventions(config)  # the paper conventions, set once for every analysis
    selection = select(config.analyses, allow_none=bool(config.own_analyses))  # unknown names fail before loading
    device = resolve_device(config.device)  # before any model is loaded
    if config.device == "auto":  # torch.device("auto") does not exist: record and use what it chose
        config = dataclasses.replace(config, device=str(device))
    return config, selection, resolve_dtype(config.dtype, device)


def in_dtype(pair: ModelPair, dtype: torch.dtype) -> ModelPair:
    """The pair with both models in ``dtype`` (a pair passed in runs in the configured dtype too)."""
    for m in (pair.base, pair.tuned):
        if next(m.model.parameters()).dtype != dtype:
            m.model.to(dtype)
    return pair


def prepare_inputs(config: CompareConfig, selection: Selection, corpus: Corpus | None, tokenizer) -> Inputs:
    """Read, annotate and encode the data, and read the relations and OOD files: everything before the run folder."""
    corpus = corpus if corpus is not None else load_data(config.data)
    if len(corpus) == 0:
        raise BertologyError("The corpus has no examples.")
    warnings: list[str] = unread_settings(config.settings, selection, preset_values(config.conventions))
    raw_corpus = corpus  # the experiments tokenise the original texts, not the parser's words
    corpus, specs = annotate_if_needed(config, corpus, selection.analyses, warnings)
    selected = {s.name for s in specs}
    max_length = config.data.max_length
    if config.attention_mode == "padded" and max_length > config.pad_length:
        max_length = config.pad_length
    encoded = encode_corpus(corpus, tokenizer, max_length, config.data.overlong)
    spans = load_relations(config.relations) if config.relations else None
    if spans is not None and "relation_heads" in selected:
        check_relation_names(corpus, spans[1])
    ood = load_ood(config) if config.ood_data and "representation_similarity" in selected else None
    return Inputs(config, selection, specs, corpus, raw_corpus, encoded, max_length, spans, ood, warnings)


class PairJob:
    """One pair's run folder, from its fingerprint to its manifest, in three steps around the streaming pass.

    ``open`` takes the folder (resuming finished tables) and builds the analyses still to stream
    (``todo``); the caller streams the main corpus into them (alone, or beside other pairs over one
    shared base forward); ``finish`` writes everything else. ``compare`` is one job; the many-model
    driver runs several over one :class:`Inputs`, each told its ``peers`` (the experiments' context).
    """

    def __init__(self, inputs: Inputs, pair: ModelPair, *, out: str | Path | None = None, overwrite: bool = False,
                 progress: bool = False, t0: float | None = None, peers: tuple[tuple[str, ModelPair], ...] = ()):
        self.inputs, self.pair, self.overwrite, self.progress, self.peers = inputs, pair, overwrite, progress, peers
        self.config = inputs.config if out is None else dataclasses.replace(inputs.config, out=str(out))
        self.t0 = time.perf_counter() if t0 is None else t0
        self.warnings = list(inputs.warnings)
        spans = inputs.spans
        self.fingerprint = run_fingerprint(self.config, pair, inputs.corpus, spans[0] if spans else None, inputs.ood)
        refuse_unrunnable(inputs.selection, self._context(Path(self.config.out) / "partial"))
        self.todo: list[Analysis] = []
        #: seconds per stage: ``forward``, ``update:<analysis>`` (the streaming pass), ``compute:<analysis>``
        self.timings: dict[str, float] = {}

    def _context(self, partial: Path) -> ExperimentContext:
        return ExperimentContext(self.config, self.pair, self.inputs.raw_corpus, partial, self.progress, self.peers)

    def open(self):
        """Take the run folder (:func:`bertology.commands.base.hold`) and build the analyses; a context manager for
        the run."""
        inputs = self.inputs
        self.opened = hold(self.config.out, "compare", self.fingerprint, overwrite=self.overwrite)
        self.memory = MemoryWatch.start(self.config.device)
        try:
            self.run_dir, self.resuming = self.opened.dir, self.opened.resumed
            record_plan(self.run_dir, inputs.selection, self.config)
            self.analyses = build_analyses(self.config, self.pair, inputs.corpus, inputs.encoded, inputs.specs)
            # the file's own trees, not spaCy's parses
            self.warnings += encoding_warnings(inputs.encoded, inputs.corpus) + tree_warnings(inputs.raw_corpus)
            self.warnings += training_warnings(self.pair.tuned.path, self.config.tuned or self.pair.tuned.name)
            self.results, self.done = _resumed_streams(inputs.specs, self.run_dir, self.resuming)
            self.todo = [a for a in self.analyses if a.name not in self.done]
        except BaseException as exc:
            self.opened.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self.opened

    def _finish_streams(self) -> dict | None:
        """The streamed analyses' tables (``todo`` has seen the main corpus), the user relations streamed and merged.

        Writes the tables into ``results`` and the run; returns the user relations' manifest section
        (their texts are a corpus of their own, streamed after the main one).
        """
        config, pair, spans = self.config, self.pair, self.inputs.spans
        span_params = None
        if spans is not None:
            span_analysis, span_encoded = relations_analysis(config, pair, spans, self.inputs.max_length)
            span_params = {**span_analysis.params(), "file": config.relations, **spans[0].stats}
        computed = finish_analyses(self.todo, self.timings)
        if spans is not None and "relation_heads" not in self.done:
            _extract(pair, span_encoded, [span_analysis], config, self.progress, label="user relations")
            computed["relation_heads"] = with_user_relations(computed.get("relation_heads"), span_analysis.compute())
        for res in computed.values():
            write_table(self.run_dir.path, res.name, res.table)
            self.results[res.name] = res
        return span_params

    def finish(self, *, report: bool = True, extra_results: list[Result] | None = None,
               summary: dict | None = None) -> CompareRun:
        """After the main corpus has streamed into ``todo``: write the tables, experiments, views, manifest and report."""
        config, pair, inputs, run_dir = self.config, self.pair, self.inputs, self.run_dir
        results, done, warnings = self.results, self.done, self.warnings
        span_params = self._finish_streams()
        for res in extra_results or []:
            write_table(run_dir.path, res.name, res.table)
            results[res.name] = res
        ood = inputs.ood
        if ood is not None:
            if self.resuming and run_dir.has_table(OOD_TABLE):
                results[OOD_TABLE] = Result(OOD_TABLE, read_table(run_dir.path, OOD_TABLE))
                done.append(OOD_TABLE)
            else:
                res = _ood_similarity(config, pair, ood, inputs.max_length, warnings, self.progress)
                write_table(run_dir.path, res.name, res.table)
                results[res.name] = res
        context = dataclasses.replace(self._context(run_dir.path / "partial"), tables=results)  # live: grows
        sections = {a.name: a.params() for a in self.analyses} | ({"user_relations": span_params} if span_params else {})
        for spec in inputs.selection.experiments:
            section = _experiment(spec, context, inputs.selection, run_dir, self.resuming, warnings, results, done)
            if section is not None:
                sections[spec.name] = section
        views = write_views(run_dir.path, pair, inputs.corpus, inputs.encoded, config.view_examples, warnings)

        manifest = {
            **manifest_header("compare", self.fingerprint),
            "status": "complete",
            "config": config.to_dict(),
            "settings": settings_record(config),
            "conventions": describe_conventions(config),
            "models": pair.describe(),
            "data": {**inputs.corpus.describe(), "encoding": inputs.encoded.describe()},
            **({"ood_data": ood.describe()} if ood is not None else {}),
            "analyses": sections,
            "seed": config.seed,
            "device": config.device,
            "dtype": str(next(pair.base.model.parameters()).dtype).replace("torch.", ""),
            "attn_implementation": "eager",
            "tables": sorted(results),
            "warnings": warnings,
            "wall_time_s": round(time.perf_counter() - self.t0, 2),
            "timings": stage_timings(self.timings),
            "memory": self.memory.record(),
            "resumed_tables": done,
            "views": views,
            "summary": summary or {},
        }
        run_dir.write_manifest(manifest)
        report_path = None
        if report:
            from bertology.report.render import render_report

            report_path = render_report(run_dir.path)
        return CompareRun(run_dir.path, results, manifest, report_path, done)


def compare(
    config: CompareConfig,
    *,
    corpus: Corpus | None = None,
    pair: ModelPair | None = None,
    overwrite: bool = False,
    progress: bool = False,
    report: bool = True,
    extra_results: list[Result] | None = None,
    summary: dict | None = None,
    extra_analyses: Sequence[Analysis] = (),
) -> CompareRun:
    """Compare a base and a tuned model on one corpus and write the run directory.

    ``corpus``/``pair`` may be passed directly (Python API); otherwise they are loaded from the config.
    Re-running with identical settings into the same folder resumes: finished tables are kept.
    ``extra_results`` (e.g. the fine-tuning curve) are written beside the analyses' tables and shown in
    the report; ``summary`` holds headline numbers for the report's overview. ``extra_analyses`` are
    streaming analyses built by the caller on the encoded ``corpus`` (items numbered as its examples,
    e.g. the ABSA heads): they ride the same pass as the selected ones (one forward per model), always
    (a resumed run still streams them), and their tables join ``extra_results``.
    """
    t0 = time.perf_counter()
    config, selection, dtype = resolve_settings(config)
    if pair is None:  # the data first: what it and the tuned model's config can tell is said before the weights load
        corpus = corpus if corpus is not None else load_data(config.data)
        precheck_experiments(config, selection, corpus)
    pair = in_dtype(pair or ModelPair.load(config.base, config.tuned, trust_remote_code=config.trust_remote_code,
                                           dtype=dtype), dtype)
    inputs = prepare_inputs(config, selection, corpus, pair.tokenizer)
    job = PairJob(inputs, pair, overwrite=overwrite, progress=progress, t0=t0)
    with job.open():
        streamed = [*job.todo, *extra_analyses]
        if streamed:
            _extract(pair, inputs.encoded, streamed, config, progress, timings=job.timings)
        extra = [*(extra_results or []), *(res for a in extra_analyses for res in a.results())]
        return job.finish(report=report, extra_results=extra, summary=summary)


def _resumed_streams(specs: Sequence[AnalysisSpec], run_dir: RunDirectory, resuming: bool) -> tuple[dict[str, Result], list[str]]:
    """The streaming analyses' finished tables read back from a resumed run, and their names."""
    results: dict[str, Result] = {}
    done = [spec.name for spec in specs if resuming and run_dir.has_table(spec.name)]
    for spec in specs:
        if spec.name in done:
            logger.info("resuming: %s already computed in %s", spec.name, run_dir.path)
            results.update(_read_back(run_dir, spec.tables))
    return results, done


def finish_analyses(todo: Sequence[Analysis], timings: dict[str, float] | None = None) -> dict[str, Result]:
    """Every streamed analysis's tables by name, in ``todo``'s order; ``timings`` gains ``compute:<name>``.

    The ``compute()``s run side by side in threads (as many as torch's intra-op threads), with NumPy's
    BLAS on one thread (:func:`bertology.blas.one_blas_thread`). Why: most of them are single-threaded
    (PCA's and geometry's fits, the head map's MDS) while representation similarity's runs its layers in
    parallel, so one after the other they left cores idle: 4.8-5.5 s -> 3.8-4.7 s at BERT-base size on 2
    cores (``benchmarks/analysis_replay.py``). Each analysis's arithmetic is the same whichever order they
    finish in. A ``compute:<name>`` is that analysis's own wall time, so they can add up to more than the phase.
    """
    def finish(a: Analysis) -> tuple[list[Result], float]:
        clock = time.perf_counter()
        return a.results(), time.perf_counter() - clock

    computed: dict[str, Result] = {}
    workers = max(1, min(len(todo), torch.get_num_threads()))
    with one_blas_thread(), ThreadPoolExecutor(max_workers=workers) as pool:
        for a, (out, seconds) in zip(todo, pool.map(finish, todo)):
            computed.update((res.name, res) for res in out)
            if timings is not None:
                timings[f"compute:{a.name}"] = seconds
    return computed


def _read_back(run_dir: RunDirectory, tables: Sequence[str]) -> dict[str, Result]:
    """The finished tables of a resumed run (those that exist)."""
    return {n: Result(n, read_table(run_dir.path, n)) for n in tables if run_dir.has_table(n)}


def _experiment(
    spec: ExperimentSpec, ctx: ExperimentContext, selection: Selection, run_dir: RunDirectory, resuming: bool,
    warnings: list[str], results: dict[str, Result], done: list[str],
) -> dict | None:
    """Run one experiment into the run (or read its finished tables back); its manifest section, or None if skipped.

    An experiment that cannot run on this model or data is an error when the user named it, and
    otherwise skipped with its note (or silently, when it has none).
    """
    reason = spec.skip_reason(ctx)
    if reason is not None:
        if spec.name in selection.named:
            raise BertologyError(spec.refusal(reason))
        if spec.skipped_note:
            warnings.append(spec.skipped_note.format(reason=reason))
        return None
    tables = spec.tables(ctx.config)
    if resuming and all(run_dir.has_table(n) for n in tables):
        results.update(_read_back(run_dir, tables))
        done.append(spec.name)
        return {"settings": spec.params(ctx.config).to_dict(), "resumed": True}
    outcome = spec.run(ctx)
    for res in outcome.results.values():
        write_table(run_dir.path, res.name, res.table)
        results[res.name] = res
    warnings += outcome.warnings
    return outcome.manifest


def _ood_similarity(config: CompareConfig, pair: ModelPair, ood: Corpus, max_length: int, warnings: list[str],
                    progress: bool) -> Result:
    """RSA/CKA between base and tuned on the out-of-domain corpus, with the in-domain run's settings.

    Merchant et al. (2020) found fine-tuning changes representations less on out-of-domain sentences;
    the table has the in-domain table's columns plus ``domain = "out"`` and the corpus it came from.
    """
    encoded = encode_corpus(ood, pair.tokenizer, max_length, config.data.overlong)
    info = encoded.describe()
    if info["n_skipped_overlong"] or info["n_truncated"]:
        warnings.append(f"Out-of-domain corpus: {info['n_skipped_overlong']} examples skipped and {info['n_truncated']} "
                        f"truncated at {max_length} tokens.")
    analysis = RepresentationSimilarity(pair.num_layers, config.rsa_tokens, config.seed)
    _extract(pair, encoded, [analysis], config, progress, label="out-of-domain")
    res = analysis.compute()
    table = res.table.assign(domain="out", corpus=str(config.ood_data))
    return Result(OOD_TABLE, table, {**analysis.params(), "corpus": config.ood_data, "n_examples": len(encoded.items)})


def stage_timings(timings: dict[str, float]) -> dict:
    """The manifest's ``timings``: the streaming pass's forward seconds, and per analysis its ``update``
    (summed over batches) and ``compute`` seconds; what each analysis costs beyond the forward passes."""
    per: dict[str, dict[str, float]] = {}
    for key, seconds in timings.items():
        if ":" in key:
            stage, name = key.split(":", 1)
            per.setdefault(name, {})[f"{stage}_s"] = round(seconds, 3)
    forward = {"forward_s": round(timings["forward"], 3)} if "forward" in timings else {}
    return {**forward, "analyses": per,
            "note": "wall seconds on this process; on a GPU the queued forward is charged to the first update that waits"}


def _extract(
    pair: ModelPair, encoded, analyses: list[Analysis], config: CompareConfig, progress: bool, label: str = "extracting",
    timings: dict[str, float] | None = None,
) -> None:
    store = None
    if config.store and label == "extracting":  # the activation store holds the main corpus only
        from bertology.activations.store import ActivationStore

        store = ActivationStore.create(config.store, pair, encoded, overwrite=True)
    with progress_bar(label, len(encoded.items), progress) as on_batch:
        run_analyses(pair, encoded, analyses, batch_size=config.batch_size, device=config.device, store=store,
                     on_batch=on_batch, timings=timings)
    if store is not None:
        store.close()


@contextlib.contextmanager
def progress_bar(label: str, total: int, show: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar over ``total`` examples, as the ``on_batch`` callback of the extraction loop (None when hidden)."""
    with bar_over(label, total, show, text=BarText(unit="examples")) as advance:
        yield advance
