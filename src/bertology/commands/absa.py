"""The aspect-based sentiment study end to end: SemEval-2014 XML -> pairs -> fine-tune -> task heads -> report.

``run_absa`` reads the file (:mod:`bertology.data.absa`), splits its *sentences* into train and held
out (so the pairs of one review never straddle the split), fine-tunes a sequence-pair classifier on
the training pairs (:func:`bertology.training.run.finetune_to_dir`, reused when identical) unless a
tuned model is given, then streams the held-out pairs through base and tuned model once for both
:class:`bertology.analyses.absa_heads.AbsaHeads` and attention change (``compare``'s
``extra_analyses``), and writes a compare run (attention change, the ABSA tables, the fine-tuning
curve, attention views of a few pairs and the report).

Layout under ``out``: ``finetune/`` (the fine-tuning run, ``model/`` inside) and ``study/`` (the
compare run: ``tables/absa_heads``, ``absa_head_change``, ``absa_sep_share``, ``report.html``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from bertology.config import (DEVICE_HELP, SPACY_MODEL_HELP, CompareConfig, DataConfig, FinetuneConfig,
                              attention_measures_field, check_measures_once)
from bertology.data.absa import STYLES, AbsaPairs, absa_pairs, opinion_spans, read_absa, split_sentences
from bertology.errors import BertologyError
from bertology.results import Result
from bertology.runs import RunResult
from bertology.settings import check_fields, describe_fields, setting_field, seed_field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AbsaConfig:
    """``bertology absa``: the study's settings (the fine-tuning ones are passed to ``finetune``); the command's flags
    are generated from the fields made with :func:`~bertology.settings.setting_field`, which are checked here."""

    data: str
    out: str = "runs/absa"
    base: str = "minilm"
    tuned: str | None = None  # a model already fine-tuned on these pairs: skip fine-tuning
    style: str = setting_field(
        "qa_m", "Auxiliary sentence: qa_m, nli_m (categories) or term_qa_m, term_nli_m (terms; laptops).",
        choices=STYLES, paper="Sun et al. 2019")
    conflict: str = setting_field("keep", "keep or drop the items labelled conflict (counted either way).",
                                  choices=("keep", "drop"))
    max_sentences: int | None = setting_field(  # a seeded sample of the file's sentences
        0, "A seeded sample of this many sentences (0 = all).", minimum=1, zero_is_none=True)
    eval_fraction: float = setting_field(0.2, "Share of the sentences held out (their pairs are analysed).", above=0,
                                         below=1)
    analysis_pairs: int | None = setting_field(  # at most this many held-out pairs are analysed (seeded)
        0, "Analyse at most this many held-out pairs (0 = all).", minimum=1, zero_is_none=True)
    epochs: float = setting_field(1.0, "Fine-tuning epochs.", above=0)
    batch_size: int = setting_field(32, "Pairs per fine-tuning step and per forward pass.", minimum=1)
    learning_rate: float = setting_field(5e-5, "Fine-tuning learning rate.", above=0, flag="--lr")
    max_length: int = setting_field(128, "Truncate pairs to this many tokens (counted).", minimum=2)
    seed: int = seed_field("Seed of every random choice.")
    device: str = setting_field("cpu", DEVICE_HELP)
    spacy_model: str | None = setting_field(None, SPACY_MODEL_HELP, kind=str)
    opinions: bool = setting_field(True, "Score the aspect_opinion relation (needs spaCy).")  # needs spaCy
    view_examples: int = setting_field(3, "Pairs shown in the report's attention viewer.", minimum=0,
                                       changes_numbers=False)
    attention_measures: tuple[str, ...] = attention_measures_field()
    report: bool = True

    def __post_init__(self) -> None:
        check_fields(self)
        check_measures_once(AbsaConfig, self.attention_measures)


@dataclass
class AbsaRun(RunResult):
    """What the study produced: the compare run folder (``out``), its ABSA tables, its manifest, the held-out
    scores, the pair counts and the report."""

    metrics: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    report: Path | None = None
    warnings: list[str] = field(default_factory=list)


def _sample(pairs: AbsaPairs, n: int | None, seed: int) -> tuple[AbsaPairs, list[int]]:
    """A seeded sample of ``n`` pairs kept in order (all when ``n`` is None or large)."""
    import numpy as np

    if n is None or n >= len(pairs.pairs):
        return pairs, list(range(len(pairs.pairs)))
    keep = sorted(int(i) for i in np.random.default_rng(seed).permutation(len(pairs.pairs))[:n])
    from collections import Counter

    kept = [pairs.pairs[i] for i in keep]
    labels = dict(sorted(Counter(p.label for p in kept).items()))
    return AbsaPairs(kept, pairs.style, {**pairs.counts, "n_pairs": len(kept), "labels": labels,
                                         "sampled_from": len(pairs.pairs)}), keep


def _seen_labels_only(held: AbsaPairs, seen: set[str], warnings: list[str]) -> AbsaPairs:
    """The held-out pairs whose label occurs in training (a classifier cannot predict the others); counted."""
    kept = [p for p in held.pairs if p.label in seen]
    dropped = len(held.pairs) - len(kept)
    if not dropped:
        return held
    unseen = sorted({p.label for p in held.pairs} - seen)
    warnings.append(f"{dropped} held-out pair(s) with label(s) never seen in training ({', '.join(unseen)}) were left out.")
    if not kept:
        raise BertologyError("No held-out pair has a label seen in training; use more sentences or another --seed.")
    return AbsaPairs(kept, held.style, {**held.counts, "n_pairs": len(kept), "n_unseen_label_dropped": dropped})


def view_indices(instances, encoded, n: int, max_tokens: int = 48) -> list[int]:
    """Pairs worth looking at: short ones whose aspect has review terms, then one whose aspect is absent."""
    length = {it.index: len(it) for it in encoded.items}
    short = [x for x in instances if length.get(x.example, max_tokens + 1) <= max_tokens]
    with_terms = [x.example for x in short if x.present and "aspect" in x.targets]
    absent = [x.example for x in short if not x.present]
    chosen = with_terms[: max(n - 1, 1)] + absent[:1]
    return chosen[:n] if n else []


def absa_analysis(instances, num_layers: int, num_heads: int, sep_token_id: int, measures: tuple[str, ...]):
    """The aspect heads, read from the attention weights (``("weights",)``: as they always were) or once per attention
    measure, their tables stacked with a ``measure`` column (:mod:`bertology.analyses.per_measure`)."""
    from bertology.activations.contributions import PER_LAYER
    from bertology.analyses.absa_heads import AbsaHeads
    from bertology.analyses.per_measure import PerMeasure

    if tuple(measures) == ("weights",):
        return AbsaHeads(instances, num_layers, num_heads, sep_token_id)
    return PerMeasure({m: AbsaHeads(instances, num_layers, 1 if m in PER_LAYER else num_heads, sep_token_id)
                       for m in measures})


def run_absa(config: AbsaConfig, *, overwrite: bool = False, progress: bool = False) -> AbsaRun:
    """Run the study (see the module docstring) and return its tables and held-out scores."""
    from bertology.analyses.absa_heads import TABLES, absa_instances
    from bertology.data.encode import encode_corpus
    from bertology.models.pair import ModelPair
    from bertology.commands.compare import compare
    from bertology.commands.compare_data import write_view_files
    from bertology.training.run import finetune_to_dir

    check_fields(config)
    data = read_absa(config.data)
    train_ids, eval_ids = split_sentences(data, config.eval_fraction, config.seed, config.max_sentences)
    train = absa_pairs(data, config.style, config.conflict, train_ids)
    held = absa_pairs(data, config.style, config.conflict, eval_ids)
    warnings: list[str] = []
    held = _seen_labels_only(held, {p.label for p in train.pairs}, warnings)
    out = Path(config.out).expanduser()
    train_corpus = train.corpus(name=f"{Path(data.path).stem} {config.style} (train)", source=data.path)
    held_corpus = held.corpus(name=f"{Path(data.path).stem} {config.style} (held out)", source=data.path)
    extra: list[Result] = []
    metrics: dict = {}
    tuned = config.tuned
    if tuned is None:
        ft = FinetuneConfig(model=config.base, out=str(out / "finetune"), epochs=config.epochs,
                            batch_size=config.batch_size, learning_rate=config.learning_rate, seed=config.seed,
                            device=config.device, task="classification",
                            data=DataConfig(max_examples=None, overlong="truncate", max_length=config.max_length))
        run = finetune_to_dir(ft, train_corpus, held_corpus, overwrite=overwrite, progress=progress)
        tuned, metrics = str(run.model_dir), dict(run.metrics)
        warnings += run.warnings
        extra.append(Result("finetune", run.table, {}))

    analysed, _ = _sample(held, config.analysis_pairs, config.seed)
    opinions = None
    if config.opinions:
        try:
            opinions = opinion_spans(analysed.pairs, nlp_name=config.spacy_model)
        except BertologyError as err:
            warnings.append(f"No aspect_opinion relation (opinion words need spaCy): {err}")
    instances = absa_instances(analysed.pairs, opinions)
    corpus = analysed.corpus(name=held_corpus.name, source=data.path)
    pair = ModelPair.load(config.base, tuned)
    sep = pair.tokenizer.sep_token_id
    if sep is None:
        raise BertologyError(f"The tokenizer of {config.base} has no separator token; the [SEP] share needs one.")
    encoded = encode_corpus(corpus, pair.tokenizer, config.max_length, "truncate")  # compare's encoding too
    analysis = absa_analysis(instances, pair.num_layers, pair.num_heads, sep, config.attention_measures)
    cmp_config = CompareConfig(base=config.base, tuned=tuned, out=str(out / "study"), analyses=("attention_change",),
                               data=DataConfig(max_length=config.max_length, overlong="truncate"), seed=config.seed,
                               device=config.device, batch_size=config.batch_size, view_examples=0,
                               attention_measures=config.attention_measures)
    # one pass per model feeds both the ABSA heads and attention change
    cmp = compare(cmp_config, corpus=corpus, pair=pair, overwrite=overwrite, progress=progress, report=False,
                  extra_results=extra, extra_analyses=[analysis],
                  summary={"held-out pairs": {k: metrics[k] for k in ("accuracy", "macro_f1") if k in metrics}})
    results = [cmp.results[name] for name in TABLES]
    views = write_view_files(cmp.out, pair, corpus, view_indices(instances, encoded, config.view_examples), warnings,
                             what="pair")
    from bertology.runs import RunDirectory

    run_dir = RunDirectory(cmp.out)
    manifest = run_dir.read_manifest() or {}
    manifest["views"] = views
    manifest["warnings"] = list(manifest.get("warnings", [])) + warnings
    manifest["settings"] = {**manifest.get("settings", {}), **describe_fields([("absa", config)])}
    manifest["absa"] = {"config": {k: v for k, v in vars(config).items()}, "train": train.counts,
                        "held_out": held.counts, "analysed": analysed.counts, "heldout_metrics": metrics,
                        "analysis": {r.name: r.params for r in results}, "tuned": tuned}
    run_dir.write_manifest(manifest)
    report = None
    if config.report:
        from bertology.report.render import render_report

        report = render_report(cmp.out)
    return AbsaRun(cmp.out, {r.name: r.table for r in results}, manifest, metrics,
                   {"train": train.counts, "held_out": held.counts}, report, warnings)
