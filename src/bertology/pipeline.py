"""The Python API behind ``bertology compare``: load, extract once, analyse, write the run directory."""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.base import Analysis
from bertology.analyses.representation_similarity import RepresentationSimilarity
from bertology.analyses.attention_targets import AttentionTargets
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.geometry import Geometry
from bertology.analyses.head_map import HeadMap
from bertology.analyses.pca_views import PCAViews
from bertology.analyses.relation_heads import RelationHeads
from bertology.config import ANALYSES, NEEDS_ANNOTATIONS, STANDALONE, CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.models.device import resolve_device
from bertology.models.pair import ModelPair
from bertology.progress import stage_bars
from bertology.results import Result, RunDirectory, now_iso, package_versions, read_table, write_table

logger = logging.getLogger(__name__)

#: Counts in ``Corpus.stats`` of input rows the loader dropped, and how the report words them.
DROPPED_WHILE_READING = {
    "n_empty_text": "rows with an empty text were dropped",
    "n_no_gold_label": "rows without a gold label ('-') were dropped",
    "n_without_heads": "sentences without dependency heads were read without trees",
}


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
        return "".join(r._repr_html_() for r in self.results.values())


def build_analyses(
    config: CompareConfig, pair: ModelPair, corpus: Corpus | None = None, encoded: EncodedCorpus | None = None
) -> list[Analysis]:
    """Instantiate the analyses named in ``config.analyses`` (``corpus``: the one that will be encoded)."""
    unknown = [a for a in config.analyses if a not in ANALYSES]
    if unknown:
        raise BertologyError(f"Unknown analysis {', '.join(unknown)}; available: {', '.join(ANALYSES)}.")
    out: list[Analysis] = []
    for name in config.analyses:
        if name == "attention_change":
            out.append(AttentionChange(pair.num_layers, pair.num_heads, config.attention_mode, config.pad_length))
        elif name == "representation_similarity":
            out.append(RepresentationSimilarity(pair.num_layers, config.rsa_tokens, config.seed))
        elif name == "attention_targets":
            if corpus is None:
                raise ValueError("attention_targets needs the corpus")
            out.append(AttentionTargets(corpus, pair.tokenizer, pair.num_layers, pair.num_heads))
        elif name == "relation_heads":
            if corpus is None:
                raise ValueError("relation_heads needs the corpus")
            out.append(RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=config.relation_min_count))
        elif name == "attention_patterns":
            classifier = None
            if config.patterns_cnn:
                from bertology.experiments.pattern_cnn import PatternClassifier

                classifier = PatternClassifier.load(config.patterns_cnn)
            out.append(AttentionPatterns(pair.tokenizer, pair.num_layers, pair.num_heads, classifier=classifier))
        elif name == "head_map":
            indices = [it.index for it in encoded.items] if encoded is not None else None
            out.append(HeadMap(pair.num_layers, pair.num_heads, max_examples=config.head_map_examples, seed=config.seed,
                               distance=config.head_map_distance, example_indices=indices))
        elif name == "geometry":
            out.append(Geometry(pair.num_layers, tokenizer=pair.tokenizer, n_pairs=config.geometry_pairs,
                                min_contexts=config.geometry_min_contexts,
                                max_contexts=max(10, config.geometry_min_contexts), seed=config.seed))
        elif name == "pca_views":
            if corpus is None:
                raise ValueError("pca_views needs the corpus")
            if config.pca_examples:
                bad = [i for i in config.pca_examples if not 0 <= i < len(corpus)]
                if bad:
                    raise BertologyError(f"PCA view example(s) {bad} are not in the corpus (0..{len(corpus) - 1}).")
            out.append(PCAViews(pair.num_layers, tokenizer=pair.tokenizer, corpus=corpus,
                                examples=list(config.pca_examples) if config.pca_examples else None,
                                n_examples=config.pca_n_examples, seed=config.seed))
    return out


def annotate_if_needed(config: CompareConfig, corpus: Corpus, warnings: list[str]) -> tuple[Corpus, tuple[str, ...]]:
    """Give plain-text corpora POS tags and trees (spaCy) when a selected analysis reads them.

    Returns the corpus and the analyses that can run. Without spaCy, ``relation_heads`` is dropped and
    ``attention_targets`` runs on token-level targets only, each with a warning.
    """
    from bertology.data.annotate import annotate

    analyses = tuple(config.analyses)
    if not any(a in NEEDS_ANNOTATIONS for a in analyses) or corpus.has_trees:
        return corpus, analyses
    try:
        annotated = annotate(corpus, config.spacy_model)
    except BertologyError as err:
        warnings.append(f"No POS tags or trees ({err}); word-level attention targets and relation heads are skipped.")
        return corpus, tuple(a for a in analyses if a != "relation_heads")
    info = annotated.stats.get("annotated", {})
    warnings.append(
        f"POS tags and dependency trees come from spaCy ({info.get('pipeline', config.spacy_model or 'default')}) "
        "parses, not gold annotations; words are the parser's tokens."
    )
    return annotated, analyses


def load_data(data: DataConfig) -> Corpus:
    """Read the corpus named by a DataConfig (path or hf: spec)."""
    from bertology.data.loaders import load_corpus

    if not data.path:
        raise BertologyError("No data given: pass --data FILE (.txt, .csv, .tsv, .jsonl, .conllu) or hf:NAME:SPLIT.")
    return load_corpus(
        data.path,
        text_column=data.text_column,
        pair_column=data.pair_column,
        label_column=data.label_column,
        limit=data.max_examples,
    )


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
) -> CompareRun:
    """Compare a base and a tuned model on one corpus and write the run directory.

    ``corpus``/``pair`` may be passed directly (Python API); otherwise they are loaded from the config.
    Re-running with identical settings into the same folder resumes: finished tables are kept.
    ``extra_results`` (e.g. the fine-tuning curve) are written beside the analyses' tables and shown in
    the report; ``summary`` holds headline numbers for the report's overview.
    """
    torch.manual_seed(config.seed)
    t0 = time.perf_counter()
    resolve_device(config.device)  # before any model is loaded
    pair = pair or ModelPair.load(config.base, config.tuned, trust_remote_code=config.trust_remote_code)
    corpus = corpus if corpus is not None else load_data(config.data)
    if len(corpus) == 0:
        raise BertologyError("The corpus has no examples.")
    warnings: list[str] = []
    raw_corpus = corpus  # ablation tokenises the original texts, not the parser's words
    corpus, selected = annotate_if_needed(config, corpus, warnings)
    max_length = config.data.max_length
    if config.attention_mode == "padded" and max_length > config.pad_length:
        max_length = config.pad_length
    encoded = encode_corpus(corpus, pair.tokenizer, max_length, config.data.overlong)
    spans = load_relations(config.relations) if config.relations else None
    if spans is not None and "relation_heads" in selected:
        _check_relation_names(corpus, spans[1])
    ood = load_ood(config) if config.ood_data and "representation_similarity" in selected else None
    run_dir = RunDirectory(config.out)
    fingerprint = run_fingerprint(config, pair, corpus, spans[0] if spans else None, ood)
    resuming = run_dir.prepare("compare", fingerprint, overwrite=overwrite)
    if not resuming:  # unfinished work of another run (ablation units, probe features) must not be reused
        shutil.rmtree(run_dir.path / "partial", ignore_errors=True)

    analyses = [a for a in build_analyses(config, pair, corpus, encoded) if a.name in selected]
    results: dict[str, Result] = {}
    done = [a.name for a in analyses if resuming and run_dir.has_table(a.name)]
    for name in done:
        logger.info("resuming: %s already computed in %s", name, run_dir.path)
        results[name] = Result(name, read_table(run_dir.path, name))
        for second in SECOND_TABLES.get(name, ()):
            if run_dir.has_table(second):
                results[second] = Result(second, read_table(run_dir.path, second))
    todo = [a for a in analyses if a.name not in done]

    enc = encoded.describe()
    if enc["n_skipped_overlong"]:
        warnings.append(f"{enc['n_skipped_overlong']} of {enc['n_input']} examples were longer than {enc['max_length']} tokens and were skipped.")
    if enc["n_truncated"]:
        warnings.append(f"{enc['n_truncated']} of {enc['n_input']} examples were truncated to {enc['max_length']} tokens.")
    for key, what in DROPPED_WHILE_READING.items():
        if corpus.stats.get(key):
            warnings.append(f"While reading the data, {corpus.stats[key]} {what}.")

    span_params = None
    run_spans = spans is not None and "relation_heads" not in done
    if spans is not None:
        span_analysis, span_encoded = _span_analysis(config, pair, spans, max_length)
        span_params = {**span_analysis.params(), "file": config.relations, **spans[0].stats}
    computed: dict[str, Result] = {}
    if todo:
        _extract(pair, encoded, todo, config, progress)
        for a in todo:
            for res in [a.compute(), *extra_results_of(a)]:
                computed[res.name] = res
    if run_spans:
        _extract(pair, span_encoded, [span_analysis], config, progress, label="user relations")
        computed["relation_heads"] = _with_user_relations(computed.get("relation_heads"), span_analysis.compute())
    for res in computed.values():
        write_table(run_dir.path, res.name, res.table)
        results[res.name] = res

    for res in extra_results or []:
        write_table(run_dir.path, res.name, res.table)
        results[res.name] = res
    if ood is not None:
        if resuming and run_dir.has_table(OOD_TABLE):
            results[OOD_TABLE] = Result(OOD_TABLE, read_table(run_dir.path, OOD_TABLE))
            done.append(OOD_TABLE)
        else:
            res = _ood_similarity(config, pair, ood, max_length, warnings, progress)
            write_table(run_dir.path, res.name, res.table)
            results[res.name] = res
    probe_info = None
    if "probe" in selected:
        probe_info = _probes(config, pair, run_dir, resuming, progress, results, done)
    ablation_info = None
    if "ablation" in selected:
        ablation_info = _ablation(config, pair, raw_corpus, run_dir, resuming, warnings, progress, results, done)
    views = write_views(run_dir.path, pair, corpus, encoded, config.view_examples, warnings)

    manifest = {
        "kind": "compare",
        "fingerprint": fingerprint,
        "bertology_version": package_versions().get("bertology"),
        "created": now_iso(),
        "command": " ".join(sys.argv) if sys.argv else None,
        "config": config.to_dict(),
        "models": pair.describe(),
        "data": {**corpus.describe(), "encoding": enc},
        **({"ood_data": ood.describe()} if ood is not None else {}),
        "analyses": {a.name: a.params() for a in analyses} | ({"user_relations": span_params} if span_params else {})
        | ({"ablation": ablation_info} if ablation_info else {}) | ({"probe": probe_info} if probe_info else {}),
        "seed": config.seed,
        "device": config.device,
        "dtype": str(next(pair.base.model.parameters()).dtype).replace("torch.", ""),
        "attn_implementation": "eager",
        "packages": package_versions(),
        "tables": sorted(results),
        "warnings": warnings,
        "wall_time_s": round(time.perf_counter() - t0, 2),
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


def probe_settings(config: CompareConfig) -> "ProbeSettings":
    """The structural probes' settings inside ``compare``."""
    from bertology.experiments.probe import ProbeSettings

    return ProbeSettings(rank=config.probe_rank or None, epochs=config.probe_epochs, seed=config.seed, device=config.device,
                         extract_batch_size=config.batch_size)


def _probe_corpus(path: str | None, limit: int | None) -> Corpus | None:
    from bertology.data.loaders import load_corpus

    return None if not path else load_corpus(path, limit=limit)


def _probes(
    config: CompareConfig, pair: ModelPair, run_dir: RunDirectory, resuming: bool, progress: bool,
    results: dict[str, Result], done: list[str],
) -> dict | None:
    """Structural probes (distance and depth) on every layer of base, tuned and a random-init control.

    They need trees of their own (``probe_train``/``probe_test``, CoNLL-U or text for spaCy), so with
    ``all`` (the default) and no probe data they are skipped silently; named without data, an error.
    Features and finished epochs are kept in ``partial/probe`` so an interrupted run resumes.
    """
    from bertology.experiments.probe import TABLE, random_init_model, run_probes

    if not (config.probe_train and config.probe_test):
        if tuple(config.analyses) == ANALYSES:
            return None
        raise BertologyError("Structural probes need treebank data: pass --probe-train and --probe-test "
                             "(CoNLL-U, or plain text parsed with spaCy).")
    settings = probe_settings(config)
    if resuming and run_dir.has_table(TABLE):
        results[TABLE] = Result(TABLE, read_table(run_dir.path, TABLE))
        done.append(TABLE)
        return {"settings": settings.to_dict(), "resumed": True}
    limit = config.probe_max_sentences
    train, test = _probe_corpus(config.probe_train, limit), _probe_corpus(config.probe_test, limit)
    dev = _probe_corpus(config.probe_dev, limit)
    models: dict = {"base": pair.base, "tuned": pair.tuned}
    if config.probe_random_control:
        models["random"] = random_init_model(pair.base, seed=config.seed)
    work = run_dir.path / "partial" / "probe"
    with stage_bars(progress, lambda s: f"probe {s}") as on_progress:
        res = run_probes(models, train, dev, test, settings, on_progress, work_dir=work, spacy_model=config.spacy_model)
    write_table(run_dir.path, res.name, res.table)
    results[res.name] = res
    shutil.rmtree(work, ignore_errors=True)  # cached word features: the table is written
    keep = ("pooling", "punctuation", "spearman_lengths", "max_epoch_trained")
    data = {split: {k: v for k, v in d.items() if k in ("n_sentences", "n_words")}
            for split, d in (res.params.get("data") or {}).items()}
    return _jsonable_summary({"settings": settings.to_dict(), "data": data,
                              **{k: v for k, v in res.params.items() if k in keep}})


#: Representation similarity on the second (out-of-domain) corpus.
OOD_TABLE = "representation_similarity_ood"


def load_ood(config: CompareConfig) -> Corpus:
    """The out-of-domain corpus (``--ood-data``), read like ``--data`` with the same example limit."""
    ood = load_data(DataConfig(path=config.ood_data or "", text_column=config.ood_text_column,
                               max_examples=config.data.max_examples, max_length=config.data.max_length,
                               overlong=config.data.overlong))
    if len(ood) == 0:
        raise BertologyError(f"The out-of-domain corpus {config.ood_data} has no examples.")
    return ood


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


def ablation_settings(config: CompareConfig) -> "AblationSettings":
    """The ablation sweep's settings inside ``compare`` (every head, every layer, both layer modes)."""
    from bertology.experiments.ablation import AblationSettings

    return AblationSettings(
        mode=config.ablation_mode, exclude_special=config.ablation_exclude_special, batch_size=config.batch_size,
        n_bootstrap=config.ablation_bootstrap, seed=config.seed, device=config.device,
        max_examples=config.ablation_examples or None, max_length=config.data.max_length,
        importance=config.ablation_importance,
    )


def ablation_skip_reason(pair: ModelPair, corpus: Corpus) -> str | None:
    """Why ``compare`` cannot ablate the tuned model on this corpus (None when it can)."""
    from bertology.experiments.ablation import check_classifier, label_ids_for

    if not pair.tuned.is_classifier:
        return "the tuned model has no classification head"
    if not any(ex.label is not None for ex in corpus):
        return "the data has no labels (name the label column with --label-column)"
    try:
        check_classifier(pair.tuned.model, name="The tuned model")
        label_ids_for(corpus, pair.tuned.model)
    except BertologyError as err:
        return str(err).rstrip(".")
    return None


def _ablation(
    config: CompareConfig, pair: ModelPair, corpus: Corpus, run_dir: RunDirectory, resuming: bool,
    warnings: list[str], progress: bool, results: dict[str, Result], done: list[str],
) -> dict | None:
    """Ablate every head and layer of the tuned classifier (and estimate head importance) into the run.

    Runs when the tuned model is a classifier and the data is labelled; otherwise, when ablation came
    with ``all`` (the default) it is skipped with a note, and when the user named it, that is an error.
    Finished ablations are kept in ``partial/`` so an interrupted run continues where it stopped.
    """
    from bertology.experiments.ablation import run_ablation_study

    reason = ablation_skip_reason(pair, corpus)
    if reason is not None:
        if tuple(config.analyses) == ANALYSES:
            warnings.append(f"Ablation and head importance were skipped: {reason}.")
            return None
        raise BertologyError(f"Cannot run the ablation: {reason}.")
    settings = ablation_settings(config)
    names = ("ablation", "head_importance", "pruning_curve") if settings.importance else ("ablation",)
    if resuming and all(run_dir.has_table(n) for n in names):
        for n in names:
            results[n] = Result(n, read_table(run_dir.path, n))
        done.append("ablation")
        return {"settings": settings.to_dict(), "resumed": True}
    with stage_bars(progress, lambda s: "ablations" if s == "ablation" else "head importance") as on_progress:
        study = run_ablation_study(pair.tuned.model, pair.tuned.tokenizer, corpus, settings, run_dir.path,
                                   figures=False, on_progress=on_progress)
    for n, table in study.tables.items():
        results[n] = Result(n, table, study.summary.get("settings", {}))
    # the manifest keeps what a reader needs to trust the numbers; the tables hold the rest
    keep = ("settings", "intact", "n_examples", "timing_s", "importance_vs_ablation_spearman")
    return _jsonable_summary({k: v for k, v in study.summary.items() if k in keep})


def _jsonable_summary(summary: dict) -> dict:
    """The study's manifest section, with NumPy scalars made plain (json.dumps would refuse them)."""
    return json.loads(json.dumps(summary, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


#: Tables an analysis writes beside its own, read back when a run resumes.
SECOND_TABLES = {"head_map": ("head_distance",), "geometry": ("geometry_words",)}


def extra_results_of(analysis: Analysis) -> list[Result]:
    """Second tables some analyses write beside their own (e.g. ``head_distance`` from ``head_map``)."""
    if isinstance(analysis, HeadMap):
        return [analysis.distances()]
    if isinstance(analysis, Geometry):
        return [analysis.word_table()]
    return []


def view_candidates(encoded: EncodedCorpus, n: int, min_tokens: int = 6, max_tokens: int = 24) -> list[int]:
    """Corpus indices of the first ``n`` examples short enough to read in the viewer (corpus order)."""
    return [it.index for it in encoded.items if min_tokens <= len(it) <= max_tokens][:n]


def write_views(run_dir: Path, pair: ModelPair, corpus: Corpus, encoded: EncodedCorpus, n: int, warnings: list[str]) -> list[str]:
    """Interactive attention views (base, tuned, diff) of a few examples, as ``views/example-<i>.json``.

    The report embeds them; each holds both models' attention for every layer and head (about
    0.5 MB for a 24-token sentence in a 6 x 12 model), so only short examples are chosen.
    """
    from bertology.results import atomic_write_text
    from bertology.activations.views import compute_view
    from bertology.viz.viewer import json_for_script

    folder = Path(run_dir) / "views"
    if folder.exists():
        for old in folder.glob("example-*.json"):
            old.unlink()
    written = []
    for index in view_candidates(encoded, n):
        ex = corpus[index]
        try:
            data = compute_view([pair.base, pair.tuned], ex.text, ex.text_pair)
        except BertologyError as err:  # e.g. a text the tokenizer splits differently from its words
            warnings.append(f"No attention view of example {index}: {err}")
            continue
        data["example"] = index
        name = f"views/example-{index}.json"
        atomic_write_text(Path(run_dir) / name, json_for_script(data))
        written.append(name)
    return written


def load_relations(path: str):
    """The user-given token relations file: (corpus of its texts, relation instances)."""
    from bertology.data.spans import load_span_relations

    return load_span_relations(path)


def _span_analysis(config: CompareConfig, pair: ModelPair, spans, max_length: int):
    """The analysis of the user relations and their encoded texts (over-long texts are truncated)."""
    from bertology.analyses.span_relations import SpanRelationHeads

    corpus, relations = spans
    encoded = encode_corpus(corpus, pair.tokenizer, max_length, "truncate")
    return SpanRelationHeads(relations, pair.num_layers, pair.num_heads), encoded


def _check_relation_names(corpus: Corpus, relations) -> None:
    """Refuse, before any extraction, user relation names that are dependency relations of the corpus."""
    deprels = {"all"} | {rel for ex in corpus if ex.deprels for rel in ex.deprels}
    clash = sorted({r.relation for r in relations} & deprels)
    if clash:
        raise BertologyError(
            f"User relation name(s) {', '.join(clash)} are also dependency relations in the data; rename them in the JSONL."
        )


def _with_user_relations(treebank: Result | None, user: Result) -> Result:
    """One ``relation_heads`` table: dependency relations (kind "dependency") and user spans (kind "span")."""
    if treebank is None:
        return user
    import pandas as pd

    clash = set(treebank.table.relation) & set(user.table.relation)
    if clash:
        raise BertologyError(
            f"User relation name(s) {', '.join(sorted(clash))} are also dependency relations in the data; rename them in the JSONL."
        )
    table = pd.concat([treebank.table, user.table], ignore_index=True)
    return Result(treebank.name, table, {**treebank.params, "user_relations": user.params})


def _extract(
    pair: ModelPair, encoded, analyses: list[Analysis], config: CompareConfig, progress: bool, label: str = "extracting"
) -> None:
    store = None
    if config.store and label == "extracting":  # the activation store holds the main corpus only
        from bertology.activations.store import ActivationStore

        store = ActivationStore.create(config.store, pair, encoded, overwrite=True)
    if not progress:
        run_analyses(pair, encoded, analyses, batch_size=config.batch_size, device=config.device, store=store)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("examples"),
            TimeRemainingColumn(), transient=False,
        ) as bar:
            task = bar.add_task("extract", total=len(encoded.items))
            run_analyses(
                pair, encoded, analyses, batch_size=config.batch_size, device=config.device, store=store,
                on_batch=lambda n: bar.advance(task, n),
            )
    if store is not None:
        store.close()
