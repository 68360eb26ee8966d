"""Ablation as a study and as an experiment of ``compare``: settings, the sweep plus head importance,
the headlines.

:func:`run_ablation_study` runs the sweep of :mod:`bertology.experiments.ablation_sweep` (every head and
layer disabled in turn, scored with paired bootstrap intervals; the table's conventions are written
there) and, unless switched off, head importance and pruning curves
(:mod:`bertology.experiments.head_importance`). :func:`summary` says the headlines in the task's own
metrics; ``SPEC`` runs it all inside ``compare`` when the tuned model has a task head. ``bertology
ablate`` runs it on its own (:func:`bertology.commands.ablate.ablate`).

This module re-exports the sweep's public names (``run_ablation``, ``plan_units``, ``score_units``,
``HeadScoring`` ...), so callers import them from here.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus
from bertology.data.labels import LABEL_MAP, map_labels
from bertology.errors import BertologyError
from bertology.metrics.bootstrap import bootstrap_counts  # noqa: F401  (re-exported: tests and the ablation API)
from bertology.models.revert import REVERT_UNITS
from bertology.config import CompareConfig
from bertology.experiments.ablation_sweep import _Sweep, run_ablation  # noqa: F401  (re-exported: the ablation API)
from bertology.experiments.ablation_table import (  # noqa: F401  (re-exported: the ablation API)
    METRICS,
    TABLE,
    TABLE_COLUMNS,
    AblationResult,
    degeneracy_record,
    score_units,
)
from bertology.experiments.ablation_units import LAYER_MODES, Method, SweepPlan, Unit, plan_units  # noqa: F401
from bertology.experiments.degenerate import table_degeneracy
from bertology.experiments.transplant_study import HEADS_HELP
from bertology.experiments.head_importance import ImportanceResult, PruningPlan, importance_vs_deltas, run_head_importance
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.config import ABLATION_MODES, DEVICE_HELP, AblationMode
from bertology.experiments.interventions import INTERVENTIONS, intervention, words_of
from bertology.conventions import PRESETS
from bertology.progress import parse_layer_list
from bertology.settings import Setting, check_fields, comma_list, setting_field, seed_field
from bertology.progress import stage_bars
from bertology.results import Result
from bertology.experiments.scoring import (  # noqa: F401  (re-exported: the ablation API)
    HIGHER_IS_BETTER,
    HeadScoring,
    head_means,
    label_ids_for,
    make_batches,
)
from bertology.reach import SeedNoise, changes
from bertology.tasks.catalog import task_of_model, task_of_table
from bertology.tasks.main_metric import METRIC_CHOICES, METRIC_HELP, MainMetric, check_metric, main_metric, metric_name
from bertology.tasks.match import config_label_problem, mismatch, training_labels
from bertology.tasks.classification import macro_f1_from_counts  # noqa: F401  (re-exported)

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


#: What ``bertology ablate`` and compare's ablation experiment both declare (their flags differ: ``--mode`` there,
#: ``--ablation-mode`` here), written once.
MODE_HELP = ("How a head is disabled: uniform (attention 1/L), zero, or mean (output); or revert: the base model's "
             "weights put back into each head, attention block, feed-forward block, layer and the embeddings; or transplant: the "
             "base encoder under the tuned head plus one tuned unit or the top/bottom k tuned layers (table transplant).")
EXAMPLES_HELP = "Seeded, label-stratified sample of this many examples (0 = all)."
EXCLUDE_SPECIAL_HELP = "Uniform mode: leave [CLS]/[SEP] out of the 1/L average."
BOOTSTRAP_HELP = "Bootstrap resamples of the examples for the 95% intervals (0 = none)."
IMPORTANCE_HELP = "Also head importance and pruning curves."
CONVENTIONS_HELP = ("Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (docs: Paper conventions), "
                    "recorded in the manifest; none of its conventions changes the ablation's numbers.")
KOVALEVA, MICHEL = "Kovaleva et al. 2019", "Michel et al. 2019"
#: ``--units-per-forward`` (``bertology ablate``) and ``--ablation-units-per-forward`` (compare, a study's [compare]):
#: one declaration, named by each owner. Recorded, not fingerprinted (as the device is not): it changes the numbers
#: by float rounding only, and the sweep's unit store fingerprints it when it is above 1 (a one-unit sweep's store
#: keeps its old fingerprint; no unit of one K is resumed into a sweep of another).
UNITS_PER_FORWARD = dict(
    default=None, kind=int, minimum=1, zero_is_none=True, changes_numbers=False, metavar="K",
    help="Head ablations scored by one forward pass (uniform, zero, mean): the batch's rows K times over, one "
         "unit's heads per copy, so a GPU runs fewer, larger kernels; skip, revert and transplant units run one "
         "per forward. 0 or not given: auto, 1 on the CPU (equal to the naive re-run bit for bit; no gain there), "
         "up to 8 on CUDA as memory allows (equal to the one-unit sweep to float rounding).")


def _layer_modes(text: str) -> tuple[str, ...]:
    """``"skip,heads"`` -> ``("skip", "heads")``; ``none`` or empty -> no whole-layer ablations."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    return () if names in ((), ("none",)) else names


def _layers(text: str) -> tuple[int, ...] | None:
    return parse_layer_list(text, "layer numbers (1-based)")


@dataclass
class AblationSettings:
    """Every choice that changes the ablation numbers (recorded in the manifest); ``bertology ablate``'s flags are
    generated from the fields made with :func:`~bertology.settings.setting_field`."""

    mode: AblationMode = setting_field("uniform", MODE_HELP, choices=ABLATION_MODES, paper=KOVALEVA)
    metric: str = setting_field("auto", METRIC_HELP, choices=METRIC_CHOICES, metavar="METRIC")
    exclude_special: bool = setting_field(False, EXCLUDE_SPECIAL_HELP)
    layers: tuple[int, ...] | None = setting_field(
        None, "Comma list of layers (1-based) to ablate; default all.", kind=tuple, parse=_layers, metavar="LAYERS")
    heads: bool = True  # single-head ablations
    transplant_heads: bool = setting_field(False, HEADS_HELP)
    layer_modes: tuple[str, ...] = setting_field(
        LAYER_MODES, "Whole-layer ablations: skip (bypass the block), heads (all heads disabled); with --mode revert: "
        "attention, ffn, layer, embeddings (the default there: all four); or none.",
        choices=LAYER_MODES + REVERT_UNITS, parse=_layer_modes, metavar="skip,heads|attention,ffn,layer,embeddings|none")
    batch_size: int = setting_field(32, "Examples per forward pass.", minimum=1)
    units_per_forward: int | None = setting_field(**UNITS_PER_FORWARD)
    n_bootstrap: int = setting_field(1000, BOOTSTRAP_HELP, minimum=0, flag="--bootstrap")
    seed: int = seed_field("Seed of the sample, the bootstrap and the random pruning order.")
    device: str = setting_field("cpu", DEVICE_HELP, changes_numbers=False)  # results agree across devices to rounding
    max_examples: int | None = setting_field(500, EXAMPLES_HELP, minimum=2, zero_is_none=True)
    max_length: int = setting_field(128, "Truncate inputs to this many tokens (counted in the manifest).", minimum=2)
    label_map: str | None = setting_field(**LABEL_MAP)
    # head importance (Michel et al. 2019) and pruning curves
    importance: bool = setting_field(True, IMPORTANCE_HELP, paper=MICHEL)
    pruning_step: float = setting_field(0.1, "Fraction of all heads removed per pruning step.", above=0, maximum=1,
                                        paper=MICHEL)
    pruning_recompute: bool = setting_field(
        True, "Re-estimate importance after every pruning step (the paper's way).", flag="--recompute", paper=MICHEL)
    # recorded, not fingerprinted: no paper convention changes the sweep (they decide attention analyses and probes)
    conventions: str = setting_field("bertology", CONVENTIONS_HELP, choices=tuple(PRESETS), changes_numbers=False)

    def __post_init__(self) -> None:
        check_fields(self)
        self.layer_modes = intervention(self.mode).layer_modes(self.layer_modes)

    def to_dict(self) -> dict:
        return asdict(self)



# --------------------------------------------------------------------------------------------------
# Reading the table
# --------------------------------------------------------------------------------------------------


def ranked(table: pd.DataFrame, metric: str | None = None, *, target: str = "head", harmful: bool = True, top: int = 5) -> pd.DataFrame:
    """The ``top`` ablations whose removal hurts most (``harmful``) or helps most, for ``metric``
    (default: the task's primary metric).

    Ties (accuracy moves in steps of 1/n) are broken by the loss delta in the same direction.
    """
    task = task_of_table(table)
    metric = metric or task.primary
    keys = ["target", "layer", "head", "layer_mode"]
    t = table[(table["target"] == target) & (table["metric"] == metric)]
    loss = table[(table["target"] == target) & (table["metric"] == task.loss_metric)][keys + ["delta"]]
    t = t.merge(loss.rename(columns={"delta": "_loss_delta"}), on=keys, how="left")
    worse_first = HIGHER_IS_BETTER[metric] == harmful  # accuracy: most negative delta first
    t = t.sort_values(["delta", "_loss_delta", "layer", "head"], ascending=[worse_first, not harmful, True, True])
    return t.drop(columns="_loss_delta").head(top).reset_index(drop=True)


def _findings(table: pd.DataFrame, metric: str, column: str, best_first: bool) -> pd.DataFrame:
    """Units flagged in ``column`` (``helps``/``hurts``) for ``metric`` whose interval has width: a zero-width
    interval (every resample gave the same delta, e.g. a change that moves no prediction) is no finding."""
    t = table[(table["metric"] == metric) & table[column].astype(bool) & (table["ci_high"] > table["ci_low"])]
    return t.sort_values("delta", ascending=not best_first).reset_index(drop=True)


def helpful(table: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """Heads and layers whose removal improves ``metric`` (default: the primary one) beyond the 95% interval, the
    largest improvement first."""
    metric = metric or task_of_table(table).primary
    return _findings(table, metric, "helps", HIGHER_IS_BETTER[metric])


def harmful(table: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """Heads and layers whose removal (or revert) worsens ``metric`` beyond the 95% interval, the worst first:
    for a revert sweep, the changes of fine-tuning the task needs."""
    metric = metric or task_of_table(table).primary
    return _findings(table, metric, "hurts", not HIGHER_IS_BETTER[metric])


def findings_line(table: pd.DataFrame, metric: str, direction: str, noun: str = "removal", top: int = 8) -> str:
    """``removal hurts beyond the 95% CI (accuracy): L4 whole layer -0.075 [-0.150, -0.013], ...`` or ``... none``
    (or why there can be none: no intervals). ``direction`` is ``hurts`` or ``helps``; ``noun``: the intervention's
    (:attr:`~bertology.experiments.interventions.Words.noun`: ``removal``, ``revert``)."""
    head = f"{noun} {direction} beyond the 95% CI ({metric}): "
    if not (table["ci_high"] > table["ci_low"]).any():
        return head + "none can be said (no intervals: bootstrap 0, or every delta the same)"
    found = (harmful if direction == "hurts" else helpful)(table, metric)
    return head + (", ".join(_fmt_row(r) for r in found.head(top).itertuples()) if len(found) else "none") + (
        f" (+{len(found) - top} more)" if len(found) > top else "")

# --------------------------------------------------------------------------------------------------
# The whole study into a run directory (``bertology ablate``; ``compare`` when the tuned model classifies)
# --------------------------------------------------------------------------------------------------


def sample_examples(corpus: Corpus, n: int | None, seed: int) -> Corpus:
    """A seeded, label-stratified sample of ``n`` examples kept in corpus order (all when ``n`` is None or large)."""
    return corpus.stratified_sample(n, seed)


@dataclass
class AblationStudy:
    """What :func:`run_ablation_study` computed: its tables and a manifest section."""

    ablation: AblationResult
    importance: "ImportanceResult | None"
    tables: dict[str, pd.DataFrame]
    summary: dict

    def table(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def _sweep(model, base, encoded: EncodedCorpus, label_ids, scoring: HeadScoring, settings: AblationSettings,
           partial: Path | None, on_progress) -> AblationResult:
    """The ablation sweep of ``settings.mode``'s intervention (:mod:`bertology.experiments.interventions`), bound to
    ``base`` (refused with one line when it needs one and has none)."""
    on_unit = (lambda u, d, t: on_progress("ablation", d, t)) if on_progress else None
    progress_dir = None if partial is None else partial / "ablation"
    run = dict(n_bootstrap=settings.n_bootstrap, seed=settings.seed, progress_dir=progress_dir, on_unit=on_unit,
               sweep=SweepPlan(layers=settings.layers, heads=settings.heads, layer_modes=settings.layer_modes,
                               units_per_forward=settings.units_per_forward))
    return intervention(settings.mode).bound(base).sweep(model, encoded, label_ids, scoring, **run)


def run_ablation_study(
    model: torch.nn.Module,
    tokenizer,
    corpus: Corpus,
    settings: AblationSettings,
    work_dir: str | Path | None,
    *,
    encoded: EncodedCorpus | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    base: torch.nn.Module | None = None,
    main: MainMetric | None = None,
) -> AblationStudy:
    """Ablation sweep (+ head importance and pruning curves) of a classifier on labelled data.

    Puts the data's labels onto the model's (``settings.label_map``, when given; a corpus already mapped with it is
    left as it is), validates the model and labels (one :class:`BertologyError` each), samples ``settings.max_examples``
    (seeded, stratified) unless ``encoded`` is given, and resumes finished units from ``work_dir``
    (None: nothing kept). Returns the tables ``ablation`` (+ ``head_importance``, ``pruning_curve``);
    the caller writes them and owns the run directory's manifest (``summary`` is the section to put
    in it). ``on_progress(stage, done, total)`` with stage ``"ablation"`` or ``"importance"``.
    ``base``: the pretrained model the tuned one came from, needed by ``mode="revert"`` (which runs no head
    importance). ``main``: the main metric (default: :func:`~bertology.tasks.main_metric.main_metric` of
    ``settings.metric``, the corpus and the model), which every table lists first and the findings use.
    """
    from bertology.data.encode import encode_corpus

    task = task_of_model(model)
    corpus = map_labels(corpus, settings.label_map)  # the data's labels as the model's (once: a mapped corpus stays)
    main = main or main_metric(task, settings.metric, corpus=corpus if isinstance(corpus, Corpus) else None, model=model)
    if encoded is None:
        task.targets(corpus, model)  # the clear errors before any sampling
        corpus = sample_examples(corpus, settings.max_examples, settings.seed)
        encoded = encode_corpus(corpus, tokenizer, settings.max_length, overlong="truncate")
    label_ids = task.targets(corpus, model)
    partial = None if work_dir is None else Path(work_dir)
    how = intervention(settings.mode)
    scoring = HeadScoring.for_tokenizer(tokenizer, mode=how.scoring_mode(), exclude_special=settings.exclude_special,
                                        batch_size=settings.batch_size, device=settings.device, metric=main.metric)
    if how.table != TABLE:  # an intervention with its own table (transplant) runs its own study
        result, tables, summary = how.bound(base).study(model, encoded, label_ids, scoring, settings, partial,
                                                        on_progress)
        return AblationStudy(result, None, tables, {**summary, "main_metric": main.to_dict()})
    result = _sweep(model, base, encoded, label_ids, scoring, settings, partial, on_progress)
    tables = {TABLE: result.table}
    imp = None
    summary: dict = {
        "settings": settings.to_dict(),
        "ablation": result.params,
        "task": result.params["task"],
        "main_metric": main.to_dict(),
        "intact": result.intact,
        "degenerate": result.params["degenerate"],
        "n_examples": int(result.params["n_examples"]),
        "tokenisation": encoded.describe(),
        "timing_s": {k: round(v, 3) for k, v in result.timing.items()},
    }
    if settings.importance and not how.head_importance:
        summary["head_importance"] = {"skipped": how.no_importance()}
    elif settings.importance:
        imp = run_head_importance(
            model, encoded, label_ids, scoring,
            pruning=PruningPlan(settings.pruning_step, settings.pruning_recompute, seed=settings.seed), progress_dir=None if partial is None else partial / "head_importance",
            on_step=(lambda _n, d, t: on_progress("importance", d, t)) if on_progress else None,
        )
        tables["head_importance"] = imp.importance
        tables["pruning_curve"] = imp.curve
        summary["head_importance"] = imp.params
        summary["importance_vs_ablation_spearman"] = importance_vs_deltas(imp.importance, result.table) if settings.heads else None
    summary["tables"] = list(tables)
    return AblationStudy(result, imp, tables, summary)


# --------------------------------------------------------------------------------------------------
# Headlines and the experiment inside ``compare``
# --------------------------------------------------------------------------------------------------


def _fmt_row(r) -> str:
    """``L3H2 -0.012 [-0.020, -0.004]``; the interval is left out when there is none (``--bootstrap 0``)."""
    f = ".4f" if r.metric in ("loss", "mse") else ".3f"
    interval = "" if np.isnan(r.ci_low) else f" [{r.ci_low:+{f}}, {r.ci_high:+{f}}]"
    return f"{r.label} {r.delta:+{f}}{interval}"


def main_metric_line(task) -> str:
    """The summary's line naming a main metric that is not the task's own (``main metric: MCC, ...``)."""
    return (f"main metric: {metric_name(task.primary)}, with 95% bootstrap intervals (the findings below; the "
            f"{task.name} task's own is {metric_name(task.default_metric)}, which the degenerate check reads)")


def _rho(value: float) -> str:
    """A rank correlation for the summary; undefined when the deltas or importances do not vary (e.g. a model that
    predicts one class whatever is removed), said in words rather than printed as nan."""
    return f"{value:+.3f}" if value == value else "undefined (no variation)"


def summary(tables: Mapping[str, pd.DataFrame], note: str = "") -> str:
    """The ablation headlines of every mode the run has: each sweep mode's (:func:`mode_summary`), then transplant's.

    A run of several modes (``uniform,revert,transplant``) says each in turn; the head importance lines go with the
    head mode whose sweep they belong to (the first one: :func:`_importance_mode`).
    """
    parts = []
    if "ablation" in tables:
        t = tables["ablation"]
        modes = list(dict.fromkeys(t["mode"].astype(str))) if "mode" in t else [""]
        importance_mode = next((m for m in modes if m in INTERVENTIONS and INTERVENTIONS[m].head_importance), None)
        for mode in modes:
            one = dict(tables) if len(modes) == 1 else {
                **{k: v for k, v in tables.items() if mode == importance_mode or k not in ("head_importance", "pruning_curve")},
                "ablation": t[t["mode"].astype(str) == mode].reset_index(drop=True)}
            parts.append(mode_summary(one, note))
    for own in dict.fromkeys(i for i in INTERVENTIONS.values() if i.table != TABLE):  # transplant: its own table
        if own.table in tables:
            parts.append(own.summary(tables, note))
    return "\n".join(parts)


def mode_summary(tables: Mapping[str, pd.DataFrame], note: str = "") -> str:
    """One sweep mode's headlines: intact score, harmful heads, layers, helpful removals, importance, pruning.

    In the task's own metrics (accuracy for a classifier, Pearson for a regressor). A degenerate intact
    model (constant predictions, or not above chance) is said in the first line, and then no head is
    listed as harmful to remove.
    """
    t = tables["ablation"]
    task = task_of_table(t)
    main, loss = task.primary, task.loss_metric
    intact_rows = t[t["target"] == "intact"]
    intact = dict(zip(intact_rows["metric"], intact_rows["value"].astype(float)))
    first = t.iloc[0]
    verdict = table_degeneracy(t)
    flagged = verdict is not None and verdict.flagged
    lines = [f"DEGENERATE {verdict.what.upper()}: {verdict.note}"] if flagged else []
    lines += [
        "intact: " + ", ".join(f"{metric_name(m)} {intact[m]:.4f}" for m in task.metrics)
        + f" (n={int(first['n_examples'])}, mode {first['mode']}{', [CLS]/[SEP] excluded' if bool(first['exclude_special']) else ''}"
        + note + ")"
    ]
    if main != task.default_metric:  # a run judged by its own metric says so (the default's summary is unchanged)
        lines.append(main_metric_line(task))
    noun = words_of(first["mode"]).noun  # revert: the base's weights put back
    if (t["target"] == "layer").any():
        for lm, part in t[(t["target"] == "layer") & (t["metric"] == main)].groupby("layer_mode", sort=False):
            lines.append(f"layers, {lm}: Δ{main} " + " ".join(f"{'embeddings' if r.layer == 0 else f'L{r.layer}'} {r.delta:+.3f}" for r in part.itertuples()))
    # the verdicts, both ways, among the units whose interval excludes 0 (a degenerate model's deltas name no unit)
    for metric in (main, loss):
        for direction in ("hurts", "helps"):
            if direction == "hurts" and flagged:
                continue
            lines.append(findings_line(t, metric, direction, noun))
    imp = tables.get("head_importance")
    if imp is not None and len(imp) and (t["target"] == "head").any():
        rho = importance_vs_deltas(imp, t)
        lines.append(
            "head importance vs single-head deltas, Spearman: "
            f"{_rho(rho[loss]['spearman'])} ({loss}), {_rho(rho[main]['spearman'])} ({main}); "
            f"raw importance {_rho(rho[loss]['spearman_raw'])} ({loss})"
        )
    curve = tables.get("pruning_curve")
    if curve is not None and len(curve):
        c = curve[(curve["metric"] == main)]
        half = c[c["fraction_removed"] <= 0.5].groupby("order")["fraction_removed"].max()
        parts = []
        for order in ("importance", "random"):
            if order in half.index:
                row = c[(c["order"] == order) & (c["fraction_removed"] == half[order])].iloc[0]
                parts.append(f"{order} {row.value:.3f}")
        if parts:
            lines.append(f"pruning {100 * half.max():.0f}% of heads, {main}: " + ", ".join(parts))
    return "\n".join(lines)


def modes_of(config: CompareConfig) -> tuple[str, ...]:
    """The ablation modes compare runs, in the order given (``ablation_mode`` is a comma list: each mode its own sweep)."""
    mode = config.ablation_mode
    return tuple(dict.fromkeys(comma_list(mode) if isinstance(mode, str) else mode))


def settings_from(config: CompareConfig, mode: str | None = None) -> AblationSettings:
    """The sweep's settings inside ``compare`` for ``mode`` (default: the first mode): every head, every layer, the
    mode's whole-layer units."""
    return AblationSettings(
        mode=mode or modes_of(config)[0], exclude_special=config.ablation_exclude_special, batch_size=config.batch_size,
        units_per_forward=config.ablation_units_per_forward,
        n_bootstrap=config.ablation_bootstrap, seed=config.seed, device=config.device,
        max_examples=config.ablation_examples or None, max_length=config.data.max_length,
        importance=config.ablation_importance and mode in (None, _importance_mode(config)),
        conventions=config.conventions, metric=config.ablation_metric, label_map=config.label_map,
    )


def _importance_mode(config: CompareConfig) -> str | None:
    """The mode whose sweep head importance goes with: the first head mode (uniform, zero, mean) given; revert and
    transplant run none (Michel et al.'s importance removes heads, it does not revert them)."""
    return next((m for m in modes_of(config) if intervention(m).head_importance), None)


def _tables(config: CompareConfig) -> tuple[str, ...]:
    own = tuple(dict.fromkeys(intervention(m).table for m in modes_of(config)))  # ablation, transplant
    sweeps = (TABLE,) if TABLE in own else ()
    importance = ("head_importance", "pruning_curve") if config.ablation_importance and _importance_mode(config) else ()
    return sweeps + importance + tuple(t for t in own if t != TABLE)


def skip_reason(ctx: ExperimentContext) -> str | None:
    """Why the tuned model cannot be ablated on this corpus (None when it can)."""
    if not ctx.pair.tuned.is_classifier:
        try:  # a task head compare's corpus cannot score (question answering needs SQuAD data)
            other = task_of_model(ctx.pair.tuned.model)
        except BertologyError:
            return "the tuned model has no classification or regression head"
        return f"the tuned model's head ({other.name}) is ablated by `bertology ablate` on its own data (qa: a SQuAD JSON file)"
    try:
        task = task_of_model(ctx.pair.tuned.model, name="The tuned model")
        # a tagger reads word tags and a parser trees (token-level targets), not sentence labels
        if not task.token_level and not any(ex.label is not None for ex in ctx.corpus):
            return f"{ctx.corpus.source} has no labels (name the label column with --label-column)"
        corpus = map_labels(ctx.corpus, ctx.config.label_map)  # the labels as the model will be scored on them
        # labels of another kind of task (an STS-B regressor on SST-2's 0/1 classes) would score, but mean nothing
        peers = [(name, pair.tuned.model) for name, pair in ctx.peers]
        trained_on = training_labels(ctx.pair.tuned.path)
        if (other_task := mismatch(ctx.pair.tuned.model, corpus, peers, trained_on)) is not None:
            return other_task
        task.targets(corpus, ctx.pair.tuned.model)
        if ctx.config.ablation_metric != "auto":  # a metric another task's model has (a study of several tasks)
            check_metric(task, ctx.config.ablation_metric, ctx.pair.tuned.model)
    except BertologyError as err:
        return str(err).rstrip(".")
    return None


def precheck(config: CompareConfig, corpus: Corpus, tuned_config) -> str | None:
    """Before any weights load: why the tuned classifier cannot score the data's labels, from its config alone
    (``tuned_config``; None: nothing is said before loading). The same sentence :func:`skip_reason` gives later,
    ``--label-map`` suggested. With ``--label-map`` given, a map that leaves a label of the data out or puts one
    on a label the model does not know is an error, named or not: the map was written for this model."""
    mapped = map_labels(corpus, config.label_map)  # a label of the data the map does not name: an error now
    problem = config_label_problem(tuned_config, mapped)
    if problem is not None and config.label_map is not None:
        raise BertologyError(problem)
    return problem.rstrip(".") if problem is not None else None


#: What the manifest keeps of each mode's run: what a reader needs to trust the numbers (as ``bertology ablate``'s does:
#: how the sweep ran, what a delta is, the tokenisation, head importance's settings); the tables hold the rest.
_KEEP = ("settings", "ablation", "head_importance", "task", "main_metric", "intact", "degenerate", "n_examples", "tokenisation",
         "timing_s", "importance_vs_ablation_spearman", "transplant")


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """Ablate every head and layer of the tuned classifier (and estimate head importance), once per mode.

    Several modes (``uniform,revert,transplant``) run one after the other on the same sample: the sweeps' rows share
    the ``ablation`` table (its ``mode`` column tells them apart), transplant writes its own table. The manifest
    section is the first mode's, with every mode's under ``by_mode`` when there are several."""
    modes = modes_of(ctx.config)
    tables: dict[str, list[pd.DataFrame]] = {}
    params: dict[str, dict] = {}
    sections: dict[str, dict] = {}
    corpus = map_labels(ctx.corpus, ctx.config.label_map)
    for i, mode in enumerate(modes):
        settings = settings_from(ctx.config, mode)
        # the first mode keeps the folder a one-mode run resumes from; each other mode has its own
        work_dir = ctx.work_dir if i == 0 or ctx.work_dir is None else Path(ctx.work_dir) / f"mode-{mode}"
        label = f" ({mode})" if len(modes) > 1 else ""
        with stage_bars(ctx.progress, lambda s, lb=label: ("ablations" if s == "ablation" else "head importance") + lb) as on_progress:
            main = main_metric(task_of_model(ctx.pair.tuned.model), settings.metric, corpus=corpus,
                               model=ctx.pair.tuned.model, model_path=ctx.pair.tuned.path)
            study = run_ablation_study(ctx.pair.tuned.model, ctx.pair.tuned.tokenizer, corpus, settings, work_dir,
                                       on_progress=on_progress, base=ctx.pair.base.model, main=main)
        for name, table in study.tables.items():
            tables.setdefault(name, []).append(table)
            params.setdefault(name, study.summary.get("settings", {}))
        sections[mode] = jsonable({k: v for k, v in study.summary.items() if k in _KEEP})
    results = {n: Result(n, pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0], params[n])
               for n, parts in tables.items()}
    section = dict(sections[modes[0]])
    if len(modes) > 1:
        section["by_mode"] = sections
    return ExperimentOutcome(results, section)


SETTINGS = (
    Setting("ablation_mode", ("uniform",), MODE_HELP + " A comma list (uniform,revert,transplant) runs each mode in "
            "turn on the same examples.", kind=tuple, parse=comma_list, choices=ABLATION_MODES, minimum=1,
            paper=KOVALEVA, metavar="MODE[,MODE...]"),
    Setting("ablation_examples", 500, EXAMPLES_HELP, minimum=0),
    Setting("ablation_exclude_special", False, EXCLUDE_SPECIAL_HELP),
    Setting("ablation_bootstrap", 1000, BOOTSTRAP_HELP, minimum=0),
    Setting("ablation_importance", True, IMPORTANCE_HELP, paper=MICHEL, flag="--importance"),
    Setting("ablation_units_per_forward", **UNITS_PER_FORWARD),
    Setting("ablation_metric", "auto", METRIC_HELP, choices=METRIC_CHOICES, metavar="METRIC"),
    Setting("label_map", **LABEL_MAP),
)

SPEC = ExperimentSpec(
    "ablation", "the ablation of the tuned classifier", _tables, settings_from, skip_reason, _run,
    skipped_note="Ablation and head importance were skipped: {reason}.", summary=summary, settings=SETTINGS,
    precheck=precheck,
    seed_noise=(SeedNoise(False, changes.ablation), SeedNoise(False, changes.transplant, table="transplant")),
)
