"""Structural probes (Hewitt & Manning 2019): is a parse tree linearly recoverable from each layer?

Two probes per layer and model, both a linear map ``B`` (``[rank, hidden]``) on word vectors:

* **distance**: ``||B(h_i - h_j)||²`` is fitted to the gold tree distance between words ``i`` and ``j``;
  loss = ``Σ_ij |pred - gold| / n²`` per sentence (``n`` words), averaged over the sentences of a batch;
* **depth**: ``||B h_i||²`` is fitted to the depth of word ``i``; loss = ``Σ_i |pred - gold| / n``.

How it runs:

1. **Features once.** Every model runs once per batch over each split (length-sorted batches,
   ``inference_mode``); the hidden states of layers 0..N (0 = embedding output) are mean-pooled over
   each word's sub-word pieces (:func:`bertology.data.align.pool_words`, in float32) and kept as one
   ``[layers, words, hidden]`` tensor per model and split, in ``feature_dtype`` (float32 by default; float16
   halves their bytes, see :func:`extract_word_features` for its precision). With a work folder they
   are cached on disk (safetensors, fingerprinted) and served from the memory-mapped file, so the
   features live in the page cache, not in the process's own memory, and training never runs an encoder.
   Probes always train in float32: each batch is widened on the device (:func:`_gather`).
2. **All probes in one pass.** The probes of every (model, layer, kind) are one parameter tensor
   ``[n_probes, rank, hidden]``; the per-probe losses are summed, so gradients never mix. Adam is
   applied per probe with its own learning rate, which is divided by 10 when its dev loss does not
   improve (``ReduceLROnPlateau(factor=0.1, patience=0)``, as Hewitt & Manning); each probe keeps
   its best dev-loss weights and stops on its own after ``patience`` epochs without improvement (a
   stopped probe is no longer computed; training ends when every probe has stopped). Results
   therefore equal training each probe alone (tested). A distance and a depth probe on the same
   layer read the layer's features once (their weights are multiplied in one product).
   Initial weights are drawn per probe from a generator seeded by ``seed`` and the probe's name;
   batches are reshuffled every epoch with a generator seeded by ``seed`` and the epoch.
3. **Scores** on dev and test with each probe's best weights: UUAS and DSpr (distance), root accuracy
   and NSpr (depth), as defined in :mod:`bertology.metrics.trees` (punctuation left out of UUAS and
   root accuracy only: UPOS ``PUNCT`` by default; with ``punctuation="hewitt2019"`` the PTB XPOS tags
   of Hewitt & Manning's ``reporter.py``, :data:`HEWITT_PUNCT_XPOS`).

Choices (recorded in the result's params): ``rank`` defaults to 128, which Hewitt & Manning found
enough for BERT (their effective rank saturates at 64-128; they trained full rank). It is capped at
the hidden size. Sentences whose words cannot all be aligned to sub-words, that are longer than
``max_length`` tokens, or whose tree is not a single tree (a spaCy parse of several sentences has
several roots) are dropped and counted in ``params["data"]``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


import pandas as pd
import torch

from bertology.config import CompareConfig
from bertology.conventions import choose
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.experiments.probe_features import (  # the word-feature store; re-exported for callers of this module
    FEATURE_DTYPES,
    _cached_features,
    _model_fingerprint,
    _unpack,
    cache_key,
    extract_word_features,
)
from bertology.experiments.probe_training import (  # noqa: F401  (re-exported: the probe API)
    EPOCHS_HELP,
    KINDS,
    RANK_HELP,
    ProbeData,
    ProbeSettings,
    ProbeStack,
    _batch_tensors,
    _Layout,
    _projected_batches,
    _StackTrainer,
    epoch_order,
    evaluate_probes,
    fit_probes,
    init_probe,
    predict,
    probe_losses,
)
from bertology.experiments.probe_baselines import (  # noqa: F401  (re-exported: the probe API)
    BASELINE_COLUMNS,
    BASELINE_TABLE,
    baseline_record,
    baseline_result,
    baseline_table,
    capacity_warning,
)
from bertology.experiments.probe_trees import (  # noqa: F401  (re-exported: the probe API)
    HEWITT_PUNCT_XPOS,
    PUNCTUATION_RULES,
    TreeSet,
    distinct_tokenizers,
    encodable,
    ensure_trees,
    position_limit,
    random_init_model,
    split_dev,
    tree_set,
)
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.conventions import setting as convention
from bertology.settings import Setting, field_settings
from bertology.progress import stage_bars
from bertology.reach import SeedNoise, changes
from bertology.results import Result

logger = logging.getLogger(__name__)

TABLE = "probe"
COLUMNS = ["model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr", "loss", "n_sentences",
           "rank", "epochs", "best_epoch", "best_dev_loss",
           *(f"{m}_ci_{end}" for m in ("uuas", "dspr", "root_acc", "nspr") for end in ("low", "high"))]

ProgressFn = Callable[[str, int, int], None]


# --------------------------------------------------------------------------------------------------
# the whole analysis


@dataclasses.dataclass(frozen=True)
class ProbeCorpora:
    """The probes' sentences: ``train`` and ``test``, ``dev`` (None: a seeded ``dev_fraction`` of train held out),
    and ``spacy_model``, the pipeline that parses any of them given as plain text (None: the default one)."""

    train: Corpus
    test: Corpus
    dev: Corpus | None = None
    spacy_model: str | None = None


def run_probes(
    models: Mapping[str, object],
    corpora: ProbeCorpora,
    settings: ProbeSettings | None = None,
    on_progress: ProgressFn | None = None,
    *,
    work_dir: str | os.PathLike | None = None,
    features_out: dict | None = None,
) -> Result:
    """Train and score distance and depth probes on every layer of every model.

    ``models`` maps a name (``base``, ``tuned``, ``random`` ...) to a
    :class:`~bertology.models.loading.LoadedModel` or a ``(model, tokenizer)`` tuple; all must share
    the hidden size. ``corpora`` (:class:`ProbeCorpora`): train, dev and test, from CoNLL-U (gold trees) or plain
    text (parsed with spaCy, ``corpora.spacy_model``). ``on_progress(stage,
    done, total)`` reports ``features <split> <model>`` (sentences), ``training`` (epochs) and
    ``scoring`` (splits). With ``work_dir``, word features are cached in ``work_dir/features`` and the
    training state in ``work_dir/probe-training.pt``, so an interrupted run resumes; the features are then
    served from the memory-mapped cache files (see :func:`_cached_features`). ``features_out``, when given, receives
    each model's features of each split as ``model -> [(sentences_key, layers, features)]``, for other probes of
    the same sentences (:func:`~bertology.experiments.probe_features.word_features_once`).

    Returns the ``probe`` table: one row per (model, layer, probe, split) for the dev and test splits.
    """
    from bertology.results import Result

    settings = settings or ProbeSettings()
    if not models:
        raise BertologyError("run_probes needs at least one model.")
    progress = on_progress or (lambda *_: None)
    work = Path(work_dir) if work_dir is not None else None
    unpacked, hidden = _one_stack(models)
    splits = _splits(unpacked, corpora.train, corpora.dev, corpora.test, settings, corpora.spacy_model)
    layer_numbers = _layer_numbers(unpacked, settings.layers)
    layer_index = {(m, layer): i for m, ls in layer_numbers.items() for i, layer in enumerate(ls)}
    feats, timings = _features(models, unpacked, splits, layer_numbers, hidden, settings, work, progress)
    if features_out is not None:
        _hand_out_features(features_out, splits, layer_numbers, feats)

    keys = [(m, layer, kind) for kind in settings.probes for m in models for layer in layer_numbers[m]]
    stack = _train(keys, layer_index, feats, splits, settings, work, progress)

    t0 = time.perf_counter()
    rows = _score(stack, layer_index, feats, splits, settings, progress)
    baselines = baseline_table(splits, n_bootstrap=settings.n_bootstrap, seed=settings.seed)
    rank = int(stack.weights.shape[1])
    warned = [w for w in [capacity_warning(splits["train"].n_words, rank, next(iter(hidden.values())))] if w]
    for w in warned:
        logger.info(w)  # the commands print their warnings at the end, with the summary
    params = {
        "settings": settings.to_dict(),
        "rank": rank,
        "n_probes": len(keys),
        "layers": {m: list(ls) for m, ls in layer_numbers.items()},
        "pooling": "mean of sub-word pieces",
        "features": {"dtype": settings.feature_dtype, "memory_mapped": work is not None,
                     "bytes": {s: {m: int(f.numel() * f.element_size()) for m, f in d.items()} for s, d in feats.items()}},
        "punctuation": punctuation_note(settings),
        "spearman_lengths": [5, 50],
        "models": {name: desc for name, (_, _, desc) in unpacked.items()},
        "data": {s: {"n_sentences": len(ts), "n_words": ts.n_words, **ts.stats} for s, ts in splits.items()},
        "timings_s": {
            **timings,
            "training": stack.seconds["training"],
            "training_per_epoch": stack.seconds["per_epoch"],
            "scoring": time.perf_counter() - t0,
        },
        "max_epoch_trained": int(stack.epochs.max()) if len(keys) else 0,
        "linear_chain": baseline_record(baselines),  # the BASELINE_TABLE (baseline_result)
        "warnings": warned,
    }
    return Result(TABLE, pd.DataFrame(rows, columns=COLUMNS), params)


def _one_stack(models: Mapping[str, object]) -> tuple[dict[str, tuple], dict[str, int]]:
    """Each model as ``(encoder, tokenizer, description)`` and its hidden size; one size for all (one probe stack)."""
    unpacked = {name: _unpack(m) for name, m in models.items()}
    hidden = {name: enc.config.hidden_size for name, (enc, _, _) in unpacked.items()}
    if len(set(hidden.values())) > 1:
        raise BertologyError(f"All models must share the hidden size to train in one stack; got {hidden}.")
    return unpacked, hidden


def _train(keys: list, layer_index: Mapping, feats: Mapping, splits: Mapping[str, TreeSet], settings: ProbeSettings,
           work: Path | None, progress: ProgressFn):
    """Every probe trained together on the train split, with dev held out (:func:`fit_probes`; the state saved
    after each epoch under ``work``, so a matching earlier run resumes)."""
    progress("training", 0, settings.epochs)
    stack = fit_probes(
        keys, layer_index, ProbeData(feats["train"], splits["train"]), ProbeData(feats["dev"], splits["dev"]), settings,
        checkpoint=None if work is None else work / "probe-training.pt",
        on_epoch=lambda e, _a: progress("training", e, settings.epochs),
    )
    progress("training", settings.epochs, settings.epochs)
    return stack


def _hand_out_features(features_out: dict, splits: Mapping[str, TreeSet], layer_numbers: Mapping[str, Sequence[int]],
                       feats: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """``features_out`` gains each model's features of each split, ``model -> [(sentences_key, layers, features)]``."""
    for split, ts in splits.items():
        for name in layer_numbers:
            features_out.setdefault(name, []).append((ts.sentences_key(), layer_numbers[name], feats[split][name]))


def _score(stack, layer_index: Mapping, feats: Mapping, splits: Mapping[str, TreeSet], settings: ProbeSettings,
           progress: ProgressFn) -> list[dict]:
    """The ``probe`` table's rows of the dev and test splits (UUAS, DSpr, root accuracy, NSpr with intervals)."""
    rows = []
    for k, split in enumerate(("dev", "test")):
        progress("scoring", k, 2)
        rows += evaluate_probes(stack, layer_index, feats[split], splits[split],
                                batch_size=settings.extract_batch_size, device=settings.device,
                                n_bootstrap=settings.n_bootstrap, seed=settings.seed)
    progress("scoring", 2, 2)
    return rows


def punctuation_note(settings: ProbeSettings) -> str:
    """How the run's punctuation rule reads in the manifest: which words UUAS and root accuracy leave out."""
    rule, punct = settings.punctuation, settings.punct_upos
    return (f"XPOS in {list(HEWITT_PUNCT_XPOS)} (Hewitt & Manning's reporter.py)" if rule == "hewitt2019"
            else f"UPOS in {list(punct)}") + " left out of UUAS and root accuracy; DSpr/NSpr use every word"


def _splits(unpacked: Mapping[str, tuple], train: Corpus, dev: Corpus | None, test: Corpus, settings: ProbeSettings,
            spacy_model: str | None) -> dict[str, TreeSet]:
    """The train, dev and test trees every model can encode (dev: a seeded share of train when None)."""
    punct, rule = settings.punct_upos, settings.punctuation
    train_t = tree_set(ensure_trees(train, spacy_model=spacy_model), punct_upos=punct, name="train", punctuation=rule)
    test_t = tree_set(ensure_trees(test, spacy_model=spacy_model), punct_upos=punct, name="test", punctuation=rule)
    if dev is None:
        train_t, dev_t = split_dev(train_t, settings.dev_fraction, settings.seed)
    else:
        dev_t = tree_set(ensure_trees(dev, spacy_model=spacy_model), punct_upos=punct, name="dev", punctuation=rule)
    toks = distinct_tokenizers(unpacked)
    max_length = position_limit(settings.max_length, [enc for enc, _, _ in unpacked.values()])
    splits: dict[str, TreeSet] = {}
    for name, ts in (("train", train_t), ("dev", dev_t), ("test", test_t)):
        if len(ts) == 0:
            raise BertologyError(f"The {name} split has no sentence with a single dependency tree.")
        splits[name], _ = encodable(ts, toks, max_length)
        splits[name].name = name
    if len(splits["train"]) < 2:
        raise BertologyError("Probes need at least 2 training sentences.")
    return splits


def _layer_numbers(unpacked: Mapping[str, tuple], layers: tuple[int, ...] | None) -> dict[str, tuple[int, ...]]:
    """The layers probed in each model (0 = embeddings): ``layers``, or all of them."""
    out: dict[str, tuple[int, ...]] = {}
    for name, (enc, _, _) in unpacked.items():
        n_layers = enc.config.num_hidden_layers
        if layers is None:
            out[name] = tuple(range(n_layers + 1))
            continue
        bad = [x for x in layers if not 0 <= x <= n_layers]
        if bad:
            raise BertologyError(f"Layer(s) {bad} out of range for {name!r} (layers 0..{n_layers}; 0 = embeddings).")
        out[name] = layers
    return out


def _features(models: Mapping[str, object], unpacked: Mapping[str, tuple], splits: Mapping[str, TreeSet],
              layer_numbers: Mapping[str, tuple[int, ...]], hidden: Mapping[str, int], settings: ProbeSettings,
              work: Path | None, progress: ProgressFn) -> tuple[dict[str, dict[str, torch.Tensor]], dict]:
    """Each model's word features of each split (one forward pass per split), cached under ``work/features``."""
    feats: dict[str, dict[str, torch.Tensor]] = {s: {} for s in splits}
    seconds: dict[str, dict[str, float]] = {s: {} for s in splits}
    cached: dict[str, dict[str, bool]] = {s: {} for s in splits}
    fps = {name: _model_fingerprint(enc, desc) for name, (enc, _, desc) in unpacked.items()}
    dtype = FEATURE_DTYPES[settings.feature_dtype]
    for split, ts in splits.items():
        for name, model in models.items():
            stage = f"features {split} {name}"
            done = [0]

            def on_batch(k, stage=stage, done=done, total=len(ts)):
                done[0] += k
                progress(stage, done[0], total)

            # the cache's key (a full SHA-256, not a run fingerprint): the model, the sentences, the layers, the pooling
            key = cache_key(fps[name], ts.fingerprint(), layer_numbers[name], "mean", settings.feature_dtype)
            path = None if work is None else work / "features" / f"{split}-{name}.safetensors"
            t0 = time.perf_counter()
            progress(stage, 0, len(ts))
            feats[split][name], cached[split][name] = _cached_features(
                path, key,
                lambda out, model=model, ts=ts, name=name, cb=on_batch: extract_word_features(
                    model, ts, layer_numbers[name], batch_size=settings.extract_batch_size,
                    device=settings.device, on_batch=cb, dtype=dtype, out=out),
                shape=(len(layer_numbers[name]), ts.n_words, hidden[name]), dtype=dtype,
            )
            progress(stage, len(ts), len(ts))
            seconds[split][name] = time.perf_counter() - t0
    return feats, {"features": seconds, "features_from_cache": cached}


# --------------------------------------------------------------------------------------------------
# The experiment inside ``compare``
# --------------------------------------------------------------------------------------------------


def settings_from(config: CompareConfig) -> ProbeSettings:
    """The structural probes' settings inside ``compare``."""
    punctuation = choose(config.conventions, "probe_punctuation", config.probe_punctuation)
    return ProbeSettings(rank=config.probe_rank or None, epochs=config.probe_epochs, seed=config.seed, device=config.device,
                         extract_batch_size=config.batch_size, punctuation=punctuation)


def _probe_corpus(path: str | None, limit: int | None) -> Corpus | None:
    from bertology.data.loaders import load_corpus

    return None if not path else load_corpus(path, limit=limit)


def skip_reason(ctx: ExperimentContext) -> str | None:
    """The probes need trees of their own: ``probe_train`` and ``probe_test`` (CoNLL-U, or text for spaCy)."""
    if ctx.config.probe_train and ctx.config.probe_test:
        return None
    return "they need treebank data: pass --probe-train and --probe-test (CoNLL-U, or plain text parsed with spaCy)"


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """Distance and depth probes on every layer of base, tuned and (by default) a random-init control.

    Features and finished epochs are kept in ``work_dir/probe`` so that an interrupted run resumes;
    they are removed once the table exists.
    """
    import shutil

    config, pair = ctx.config, ctx.pair
    settings = settings_from(config)
    limit = config.probe_max_sentences
    train, test = _probe_corpus(config.probe_train, limit), _probe_corpus(config.probe_test, limit)
    dev = _probe_corpus(config.probe_dev, limit)
    models: dict = {"base": pair.base, "tuned": pair.tuned}
    if config.probe_random_control:
        models["random"] = random_init_model(pair.base, seed=config.seed)
    work = ctx.work_dir / "probe"
    with stage_bars(ctx.progress, lambda s: f"probe {s}") as on_progress:
        corpora = ProbeCorpora(train, test, dev, spacy_model=config.spacy_model)
        res = run_probes(models, corpora, settings, on_progress, work_dir=work)
    shutil.rmtree(work, ignore_errors=True)  # cached word features: the table is done
    keep = ("pooling", "features", "punctuation", "spearman_lengths", "max_epoch_trained")
    data = {split: {k: v for k, v in d.items() if k in ("n_sentences", "n_words")}
            for split, d in (res.params.get("data") or {}).items()}
    baseline = baseline_result(res.params)
    results = {res.name: res, baseline.name: baseline}
    record = {"settings": settings.to_dict(), "data": data, **{k: v for k, v in res.params.items() if k in keep}}
    token = token_settings_from(config)
    warnings = list(res.params["warnings"])
    if token.tasks:  # a second feature pass (the token probes' own), shared by every token task, control and erasure
        from bertology.experiments.token_probe import TABLE as TOKEN_TABLE
        from bertology.experiments.ablation_table import Bootstrap
        from bertology.experiments.probe_features import FeaturePass
        from bertology.experiments.token_probe import token_probes

        features = FeaturePass(settings.layers, config.batch_size, config.device, settings.max_length)
        with stage_bars(ctx.progress, lambda s: f"token probe {s}") as on_progress:
            table, params = token_probes(models, train, test, token, features=features,
                                         bootstrap=Bootstrap(settings.n_bootstrap, config.seed), on_progress=on_progress)
        results[TOKEN_TABLE] = Result(TOKEN_TABLE, table, params)
        record["token_probe"] = params
        warnings += params.get("erasure", {}).get("warnings", [])
    return ExperimentOutcome(results, jsonable(record), warnings=warnings)


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """The best UUAS and DSpr layer of each model on the test trees."""
    t = tables[TABLE]
    t = t[t["split"] == "test"]
    lines = []
    for model, part in t.groupby("model", sort=False):
        dist = part[part["probe"] == "distance"].dropna(subset=["uuas"])
        if len(dist):
            best = dist.loc[dist["uuas"].idxmax()]
            ci = (f" [{best.uuas_ci_low:.3f}, {best.uuas_ci_high:.3f}]"
                  if "uuas_ci_low" in best.index and best.uuas_ci_low == best.uuas_ci_low else "")
            lines.append(f"structural probe, {model}: best UUAS {best.uuas:.3f}{ci} (layer {int(best.layer)}), "
                         f"best DSpr {dist['dspr'].max():.3f} (layer {int(dist.loc[dist['dspr'].idxmax(), 'layer'])})")
    chain = chain_line(tables.get(BASELINE_TABLE))
    from bertology.experiments.token_probe import TABLE as TOKEN_TABLE
    from bertology.experiments.token_probe import summary_lines

    tokens = summary_lines(tables[TOKEN_TABLE]) if TOKEN_TABLE in tables else []
    return "\n".join(lines + ([chain] if chain else []) + tokens) or None


def chain_line(baselines: pd.DataFrame | None, split: str = "test") -> str | None:
    """The linear-chain baseline in one line (UUAS with its interval, DSpr, root accuracy), or None without it."""
    if baselines is None or baselines.empty:
        return None
    sub = baselines[(baselines["split"] == split) & (baselines["baseline"] == "linear_chain")]
    dist, depth = sub[sub["probe"] == "distance"], sub[sub["probe"] == "depth"]
    if dist.empty:
        return None
    d = dist.iloc[0]
    ci = f" [{d.uuas_ci_low:.3f}, {d.uuas_ci_high:.3f}]" if d.uuas_ci_low == d.uuas_ci_low else ""
    root = f", root acc. {depth.iloc[0].root_acc:.3f}" if len(depth) else ""
    return f"linear-chain baseline (no model): UUAS {d.uuas:.3f}{ci}, DSpr {d.dspr:.3f}{root}"


SETTINGS = (
    Setting("probe_train", None, "Training trees (CoNLL-U, or text parsed with spaCy).", kind=str,
            paper="Hewitt & Manning 2019"),
    Setting("probe_dev", None, "Dev trees for early stopping (default: 10% of --probe-train).", kind=str),
    Setting("probe_test", None, "Test trees the scores come from.", kind=str),
    Setting("probe_rank", 128, RANK_HELP, minimum=0, paper="Hewitt & Manning 2019"),
    Setting("probe_epochs", 30, EPOCHS_HELP, minimum=1, paper="Hewitt & Manning 2019"),
    Setting("probe_random_control", True, "Also probe a random-init model of the same shape."),
    Setting("probe_max_sentences", None, "Read at most this many sentences of each probe file.", kind=int,
            minimum=1),
    convention("probe_punctuation", paper="Hewitt & Manning 2019"),
)

def _token_settings() -> tuple[Setting, ...]:
    """The token probes' declared settings under compare's names (``probe_tasks``, ``probe_control``, ...; the flags
    ``bertology probe`` has, ``--probe-erase`` for its ``--erase``); added after compare runs existed, so at their
    defaults they stay out of the fingerprint. The erasure of the model's own task is ``probe``'s alone."""
    from bertology.experiments.token_probe import TokenProbeSettings

    out = []
    for s in field_settings(TokenProbeSettings):
        if s.name.startswith("erase_"):
            continue
        name = "probe_tasks" if s.name == "tasks" else f"probe_{s.name}"
        flag = "--probe-erase" if s.name == "erase" else s.cli_flag
        out.append(dataclasses.replace(s, name=name, flag=flag, added=True))
    return tuple(out)


TOKEN_SETTINGS = _token_settings()


def token_settings_from(config: CompareConfig):
    """The token probes' settings inside ``compare`` (no task: none run)."""
    from bertology.experiments.token_probe import TokenProbeSettings

    values = {s.name: getattr(config, s.name) for s in TOKEN_SETTINGS}
    return TokenProbeSettings(**{("tasks" if k == "probe_tasks" else k[len("probe_"):]): v for k, v in values.items()})


def _tables(config: CompareConfig) -> tuple[str, ...]:
    """The structural probes' tables, and ``token_probe`` when a token probe task is asked for."""
    from bertology.experiments.token_probe import TABLE as TOKEN_TABLE

    return (TABLE, BASELINE_TABLE, *((TOKEN_TABLE,) if config.probe_tasks else ()))


def token_probe_changes(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Seed noise of the token probes: per task and layer, tuned - base of selectivity, accuracy and (when run)
    MDL compression; one unit per layer, the metric named with its task (``upos selectivity``)."""
    from bertology.reach import as_units, per_model_change

    rows = []
    for metric in ("selectivity", "accuracy", "compression"):
        if metric not in df or df[metric].isna().all():
            continue
        one = per_model_change(df, keys, ["probe_task", "layer"], metric)
        one["metric"] = one.pop("probe_task") + " " + metric
        rows.append(one)
    if not rows:
        return pd.DataFrame()
    return as_units(pd.concat(rows, ignore_index=True), "layer")


SPEC = ExperimentSpec("probe", "the structural probes", _tables, settings_from, skip_reason, _run,
                      summary=summary, settings=SETTINGS + TOKEN_SETTINGS,
                      seed_noise=(SeedNoise(False, changes.probe),
                                  SeedNoise(False, token_probe_changes, table="token_probe")))
