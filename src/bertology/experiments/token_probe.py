"""Token probes with control tasks and description length: is a word's label linearly readable from a layer?

For each probe task (``upos``, ``xpos``, ``deprel``: the word's relation to its head), each model (base, tuned, the random-init control) and each layer (0 = embeddings), a probe reads the
word vector (the mean of its sub-word pieces, as the structural probes pool them; one feature pass shared by
every task, control and description length) and predicts the label:

* **probe**: a linear classifier (multinomial logistic regression, scikit-learn's, on standardised features), or
  Tenney et al. 2019's two-layer MLP (``classifier="mlp"``);
* **control task** (Hewitt & Liang 2019): every word type gets one label drawn once from the empirical label
  distribution of the training words (seeded by ``seed`` and the type, so the same type gets the same label in
  every split and run); a probe of the same kind is trained on those labels. **Selectivity** = task accuracy
  minus control accuracy: a probe that memorises word types scores high on both; a representation that
  *encodes* the property is selective;
* **MDL** (Voita & Titov 2020): the online codelength of the training labels given the features, in bits, and
  the compression against the uniform code (:mod:`bertology.metrics.description_length`), for task and control.

Scores are on the test words with 95 % percentile intervals over test **sentences** (task and control accuracy
and selectivity on the same resamples, so the selectivity interval is paired). ``majority_rate`` is the share of
test words whose label is the most frequent training label: a probe at it has learned nothing.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.experiments.ablation_table import Bootstrap
from bertology.experiments.edge_probe import EDGE_FIELDS, EDGE_TASKS
from bertology.experiments.probe_features import FeaturePass
from bertology.experiments.probe_targets import (  # noqa: F401 (control_labels: public here too)
    ProbeTarget, control_labels, probe_target, refuse_single_label)
from bertology.experiments.probe_trees import WordSentences
from bertology.settings import check_fields, setting_field

logger = logging.getLogger(__name__)

TABLE = "token_probe"
#: Probe tasks and the example field their labels come from.
TASK_FIELDS = {"upos": "upos", "xpos": "xpos", "deprel": "deprels", "tags": "tags"}
#: Every word column a split may keep: the token tasks' and what edge tasks read (heads, relations).
_WORD_FIELDS = {**TASK_FIELDS, "heads": "heads"}
CLASSIFIERS = ("linear", "mlp")
TENNEY = "Tenney et al. 2019"
HEWITT_LIANG = "Hewitt & Liang 2019"
BELROSE = "Belrose et al. 2023"
COLUMNS = ["model", "layer", "probe_task", "split", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "macro_f1",
           "control_accuracy", "control_ci_low", "control_ci_high", "selectivity", "selectivity_ci_low",
           "selectivity_ci_high", "majority_rate", "mdl_bits", "control_mdl_bits", "uniform_bits", "compression",
           "control_compression", "n_words", "n_sentences", "n_labels", "classifier"]
#: Added when ``erase`` is asked, on the erased tasks' rows: the fresh probe's accuracy on LEACE-erased features.
ERASED_COLUMNS = ["erased_accuracy", "erased_ci_low", "erased_ci_high"]
#: An erased probe further above the majority rate than this is flagged: the erasure did not work there.
ERASURE_SLACK = 0.03


def _tasks(value: object) -> tuple[str, ...]:
    """``upos,deprel`` -> ``("upos", "deprel")``; each checked against :data:`TASK_FIELDS` and the edge tasks."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    tasks = tuple(dict.fromkeys(str(t).strip() for t in items if str(t).strip()))
    bad = [t for t in tasks if t not in TASK_FIELDS and t not in EDGE_TASKS]
    if bad:
        raise BertologyError(f"Unknown probe task(s) {bad}; choose from {', '.join([*TASK_FIELDS, *EDGE_TASKS])}.")
    return tasks


def _erasable(value: object) -> tuple[str, ...]:
    """The tasks to erase: token tasks only (an eraser acts on one word vector; an edge task reads two)."""
    tasks = _tasks(value)
    edges = [t for t in tasks if t in EDGE_TASKS]
    if edges:
        raise BertologyError(f"--erase {', '.join(edges)}: erasure acts on one word vector at a time and edge tasks "
                             f"read a pair; erase a token task ({', '.join(TASK_FIELDS)}).")
    return tasks


@dataclass
class TokenProbeSettings:
    """Every choice that changes the token-probe numbers (recorded in the manifest; flags generated from them)."""

    tasks: tuple[str, ...] | None = setting_field(
        None, "Token probe tasks, comma list: upos, xpos, deprel (the word's relation to its head, universal part), "
        "tags (a .conll/.bio/.iob tag file's tag column, e.g. NER), and edge probes edge_deprel (an arc's relation), "
        "edge_arc (arc or not); from CoNLL-U, a tag file or spaCy; none by default.", kind=tuple, parse=_tasks, metavar="TASKS", flag="--probe-task",
        paper=TENNEY)
    control: bool = setting_field(True, "Train a control-task probe beside each token probe (selectivity).",
                                  flag="--probe-control", paper=HEWITT_LIANG)
    mdl: bool = setting_field(True, "Online-code description length of the training labels (bits, compression).",
                              flag="--probe-mdl", paper="Voita & Titov 2020")
    classifier: str = setting_field("linear", "Token probe: linear (logistic regression) or mlp (Tenney et al.'s two "
                                    "layers).", choices=CLASSIFIERS, flag="--probe-classifier", paper=TENNEY)
    regularization: float = setting_field(1.0, "Inverse L2 strength C of the linear probe (scikit-learn's C); "
                                          "selectivity depends on it (Hewitt & Liang).", above=0,
                                          flag="--probe-c", paper=HEWITT_LIANG)
    mlp_hidden: int = setting_field(256, "Hidden units of the MLP probe.", minimum=1, flag="--probe-mlp-hidden")
    max_iter: int = setting_field(200, "Solver iterations of each token probe.", minimum=1, flag="--probe-max-iter")
    max_train_words: int | None = setting_field(0, "Train token probes on at most this many words (a seeded sample; "
                                                "0 = all).", minimum=0, zero_is_none=True,
                                                flag="--probe-max-train-words")
    erase: tuple[str, ...] | None = setting_field(
        None, "Erase these probe tasks' labels from each layer with LEACE and probe again (comma list; each is also "
        "probed): the erased probe should fall to the majority rate.", kind=tuple, parse=_erasable, metavar="TASKS",
        flag="--erase", paper=BELROSE)
    erase_task_data: str | None = setting_field(
        None, "Labelled data of the tuned model's own task (a file, as ablate reads it): its metric with each layer's "
        "--erase property erased, with intervals (one task in --erase).", kind=str, flag="--erase-task-data",
        paper="Elazar et al. 2021")
    erase_text_column: str | None = setting_field(None, "Text column of --erase-task-data (default: detected).",
                                                  kind=str)
    erase_pair_column: str | None = setting_field(None, "Second-text column of --erase-task-data (sentence pairs).",
                                                  kind=str)
    erase_label_column: str | None = setting_field(None, "Label column of --erase-task-data (default: detected).",
                                                   kind=str)
    erase_max_examples: int | None = setting_field(1000, "Score at most this many examples of --erase-task-data "
                                                   "(a seeded, stratified sample; 0 = all).", minimum=0,
                                                   zero_is_none=True)

    def __post_init__(self) -> None:
        self.erase = _erasable(self.erase) or None
        self.tasks = tuple(dict.fromkeys((*_tasks(self.tasks), *(self.erase or ())))) or None
        check_fields(self)
        if self.erase_task_data is not None and len(self.erase or ()) != 1:
            raise BertologyError("--erase-task-data (erase_task_data) scores the task with one property erased at a "
                                 f"time: give --erase exactly one task (got {', '.join(self.erase or ()) or 'none'}).")

    def to_dict(self) -> dict:
        """The settings as recorded (the erasure's only when asked: token-probe runs made before them keep their
        fingerprint; the task data with its content's SHA-256, so an edited file is a new run)."""
        d = asdict(self)
        if d["erase"] is None:
            d.pop("erase")
        if d["erase_task_data"] is None:
            for key in [k for k in d if k.startswith("erase_")]:
                d.pop(key)
        else:
            d["erase_task_data_sha256"] = _file_sha256(d["erase_task_data"])
        return d


def _file_sha256(path: str) -> str | None:
    """The SHA-256 of a local file's bytes (None for a hub name or a missing file: the loader will say why)."""
    from pathlib import Path

    file = Path(path).expanduser()
    return hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None


# --------------------------------------------------------------------------------------------------
# the words and their labels


@dataclass
class LabelledWords(WordSentences):
    """One split's sentences, each word with one label per probe task (what the feature pass and the probes read)."""

    words: list[tuple[str, ...]]
    labels: dict[str, list[tuple[str, ...]]]  # task -> per sentence, one label per word
    texts: list[str] | None = None
    name: str = "split"
    stats: dict = field(default_factory=dict)

    def flat(self, task: str) -> np.ndarray:
        """Every word's label for ``task``, sentences concatenated."""
        return np.array([lab for sent in self.labels[task] for lab in sent], dtype=object)

    def flat_words(self) -> np.ndarray:
        return np.array([w for sent in self.words for w in sent], dtype=object)

    def sentence_of_word(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.words)), self.lengths)

    def subset(self, idx: Sequence[int]) -> "LabelledWords":
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return LabelledWords(pick(self.words), {t: pick(v) for t, v in self.labels.items()},
                             None if self.texts is None else pick(self.texts), self.name, dict(self.stats))

    def fingerprint(self) -> str:
        d = hashlib.sha256()
        for i, w in enumerate(self.words):
            d.update(json.dumps([list(w), {t: list(v[i]) for t, v in sorted(self.labels.items())}]).encode())
        return d.hexdigest()


def _task_labels(ex: Example, task: str) -> tuple[str, ...] | None:
    """The example's labels for ``task`` (deprel: the universal relation, the part before ``:``), or None."""
    values = getattr(ex, _WORD_FIELDS[task])
    if values is None or ex.words is None or len(values) != len(ex.words):
        return None
    if task == "deprel":
        return tuple(str(v).split(":")[0] for v in values)
    return tuple(str(v) for v in values)


def _word_fields(tasks: Sequence[str]) -> tuple[str, ...]:
    """The word columns ``tasks`` read: each token task's own, and heads and relations for edge tasks."""
    fields = [t for t in tasks if t in TASK_FIELDS]
    if any(t in EDGE_TASKS for t in tasks):
        fields += [f for f in EDGE_FIELDS if f not in fields]
    return tuple(fields)


def labelled_words(corpus: Corpus, tasks: Sequence[str], name: str) -> LabelledWords:
    """The sentences of ``corpus`` that carry a label for every word in every task (the others dropped, counted);
    edge tasks keep each word's head and relation instead (:data:`~bertology.experiments.edge_probe.EDGE_FIELDS`)."""
    tasks = _word_fields(tasks)
    words, texts, labels = [], [], {t: [] for t in tasks}
    dropped = 0
    for ex in corpus:
        per = {t: _task_labels(ex, t) for t in tasks}
        if ex.words is None or any(v is None for v in per.values()) or ex.text_pair is not None:
            dropped += 1
            continue
        words.append(tuple(ex.words))
        texts.append(ex.text)
        for t in tasks:
            labels[t].append(per[t])
    if not words:
        raise BertologyError(f"{corpus.source}: no sentence has word-level labels for {', '.join(tasks)} "
                             "(token probes need CoNLL-U columns, a tag file's tags, or plain text annotated with spaCy).")
    stats = {"n_input": len(corpus), "n_without_labels": dropped}
    return LabelledWords(words, labels, texts, name, stats)


# --------------------------------------------------------------------------------------------------
# control task and probes


def make_probe(settings: TokenProbeSettings, seed: int):
    """A fresh, unfitted probe: standardised features into logistic regression, or Tenney et al.'s MLP."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if settings.classifier == "mlp":
        clf = MLPClassifier(hidden_layer_sizes=(settings.mlp_hidden,), max_iter=settings.max_iter, random_state=seed,
                            early_stopping=False)
    else:
        clf = LogisticRegression(C=settings.regularization, max_iter=settings.max_iter)
    return make_pipeline(StandardScaler(), clf)


def fit_quietly(probe, x: np.ndarray, y: np.ndarray):
    """``probe.fit(x, y)`` with scikit-learn's convergence warnings counted, not printed (recorded instead)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        probe.fit(x, y)
    probe.not_converged_ = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return probe


def full_probabilities(probe, x: np.ndarray, n_labels: int, n_train: int) -> np.ndarray:
    """``[len(x), K]`` probabilities over every label id: a label the probe never saw in training gets the share of
    one pseudo-count (1 / (n_train + K)), the others are scaled to leave it room (the online code needs every label
    to have a probability; scikit-learn leaves unseen classes out)."""
    proba = probe.predict_proba(x)
    classes = np.asarray(probe.classes_, dtype=np.int64)
    out = np.zeros((len(x), n_labels))
    out[:, classes] = proba
    missing = n_labels - len(classes)
    if missing:
        floor = 1.0 / (n_train + n_labels)
        out[:, classes] *= 1.0 - missing * floor
        out[:, np.setdiff1d(np.arange(n_labels), classes)] = floor
    return out


# --------------------------------------------------------------------------------------------------
# scores


def sentence_hits(correct: np.ndarray, sentence: np.ndarray, n_sentences: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sentence: words right and words counted (what a resample of sentences adds up)."""
    hits = np.bincount(sentence, weights=correct.astype(np.float64), minlength=n_sentences)
    counted = np.bincount(sentence, minlength=n_sentences).astype(np.float64)
    return hits, counted


def accuracy_intervals(task_hits: np.ndarray, control_hits: np.ndarray | None, counted: np.ndarray,
                       n_bootstrap: int, seed: int) -> dict[str, tuple[float, float]]:
    """95 % percentile intervals of task accuracy, control accuracy and selectivity over resampled sentences
    (one set of resamples for all three: selectivity's interval is paired)."""
    from bertology.metrics.bootstrap import bootstrap_counts, percentile_interval

    nan = (float("nan"), float("nan"))
    if n_bootstrap <= 0 or len(counted) < 2:
        return {"accuracy": nan, "control": nan, "selectivity": nan}
    w = bootstrap_counts(len(counted), n_bootstrap, seed).astype(np.float64)
    total = w @ counted
    acc = (w @ task_hits) / total
    out = {"accuracy": percentile_interval(acc), "control": nan, "selectivity": nan}
    if control_hits is not None:
        ctrl = (w @ control_hits) / total
        out["control"], out["selectivity"] = percentile_interval(ctrl), percentile_interval(acc - ctrl)
    return out


# --------------------------------------------------------------------------------------------------
# the whole experiment


def probe_layer(x_train: np.ndarray, x_test: np.ndarray, target: "ProbeTarget", n_test_sentences: int,
                settings: TokenProbeSettings, *, seed: int, n_bootstrap: int) -> dict:
    """One (model, layer, task): the probe's test scores with intervals, the control's, selectivity and MDL, on the
    inputs of ``target``'s items (:meth:`ProbeTarget.inputs`) and its labels, control labels and test sentences."""
    from sklearn.metrics import f1_score

    from bertology.metrics.description_length import online_codelength

    labels, control, test_sentence = target.labels, target.control, target.test_sentence
    probe = fit_quietly(make_probe(settings, seed), x_train, labels.train)
    pred = probe.predict(x_test)
    correct = pred == labels.test
    hits, counted = sentence_hits(correct, test_sentence, n_test_sentences)
    row = {"accuracy": float(correct.mean()),
           "macro_f1": float(f1_score(labels.test, pred, average="macro", labels=np.unique(labels.test[labels.test >= 0]),
                                      zero_division=0)),
           "not_converged": bool(probe.not_converged_)}
    control_hits = None
    if control is not None:
        cprobe = fit_quietly(make_probe(settings, seed), x_train, control.train)
        ccorrect = cprobe.predict(x_test) == control.test
        control_hits, _ = sentence_hits(ccorrect, test_sentence, n_test_sentences)
        row["control_accuracy"] = float(ccorrect.mean())
        row["selectivity"] = row["accuracy"] - row["control_accuracy"]
    ci = accuracy_intervals(hits, control_hits, counted, n_bootstrap, seed)
    row.update(accuracy_ci_low=ci["accuracy"][0], accuracy_ci_high=ci["accuracy"][1],
               control_ci_low=ci["control"][0], control_ci_high=ci["control"][1],
               selectivity_ci_low=ci["selectivity"][0], selectivity_ci_high=ci["selectivity"][1])
    if settings.mdl:
        order = np.random.default_rng(seed).permutation(len(labels.train))  # the online code's transmission order
        fit_predict = _fit_predict(settings, seed)
        code = online_codelength(x_train[order], labels.train[order], len(labels.names), fit_predict)
        row.update(mdl_bits=code["bits"], uniform_bits=code["uniform_bits"], compression=code["compression"])
        if control is not None:
            ccode = online_codelength(x_train[order], control.train[order], len(control.names), fit_predict)
            row.update(control_mdl_bits=ccode["bits"], control_compression=ccode["compression"])
    return row


def _fit_predict(settings: TokenProbeSettings, seed: int) -> Callable:
    """The online code's probe: fitted on a block's past, probabilities of the block over every label id."""

    def fit_predict(x_tr: np.ndarray, y_tr: np.ndarray, x_ev: np.ndarray, n_labels: int) -> np.ndarray:
        probe = fit_quietly(make_probe(settings, seed), x_tr, y_tr)
        return full_probabilities(probe, x_ev, n_labels, len(y_tr))

    return fit_predict


@dataclass(frozen=True)
class WordFeatures:
    """Precomputed word vectors and the layers they are of: ``by_split[split][model]`` is
    ``[len(layers[model]), n_words, hidden]`` (row ``i`` is layer ``layers[model][i]``; 0 = embeddings)."""

    by_split: Mapping[str, Mapping[str, np.ndarray]]
    layers: Mapping[str, Sequence[int]]


def run_token_probes(features: WordFeatures, train: LabelledWords, test: LabelledWords, settings: TokenProbeSettings,
                     *, seed: int, n_bootstrap: int, on_progress: Callable[[str, int, int], None] | None = None,
                     erasers: dict | None = None) -> pd.DataFrame:
    """The ``token_probe`` table from precomputed word features.

    ``features`` (:class:`WordFeatures`): the word vectors of ``train``/``test`` for each model and layer; every
    task, its control, MDL and erasure read them (one feature pass for all). ``erasers``, when given, receives each
    fitted LEACE eraser by ``(task, model, layer)`` (what an erasure of the model's own task applies)."""
    progress = on_progress or (lambda *_: None)
    targets = {task: probe_target(train, test, task, settings, seed) for task in settings.tasks}
    layers = features.layers
    jobs = [(task, m, i, layer) for task in settings.tasks for m in layers for i, layer in enumerate(layers[m])]
    edges = any(t in EDGE_TASKS for t in settings.tasks)
    rows = []
    for k, (task, model, i, layer) in enumerate(jobs):
        progress("token probes", k, len(jobs))
        target = targets[task]
        x_train = target.inputs(features.by_split["train"][model][i], target.train_rows)
        x_test = target.inputs(features.by_split["test"][model][i], target.test_rows)
        row = probe_layer(x_train, x_test, target, len(test), settings, seed=seed, n_bootstrap=n_bootstrap)
        if task in (settings.erase or ()):
            scores, eraser = erased_scores(x_train, x_test, target, len(test), settings, seed=seed,
                                           n_bootstrap=n_bootstrap)
            row.update(scores)
            if erasers is not None:
                erasers[(task, model, int(layer))] = eraser
        labels = target.labels
        majority = np.bincount(labels.train).argmax()
        rows.append({"model": model, "layer": int(layer), "probe_task": task, "split": "test", **row,
                     "majority_rate": float((labels.test == majority).mean()), "n_words": int(len(labels.test)),
                     "n_sentences": len(test), "n_labels": len(labels.names), "classifier": settings.classifier,
                     **({"unit": "word pair" if task in EDGE_TASKS else "word"} if edges else {})})
    progress("token probes", len(jobs), len(jobs))
    table = pd.DataFrame(rows)
    columns = COLUMNS + (ERASED_COLUMNS if settings.erase else [])
    return table.reindex(columns=columns + [c for c in table.columns if c not in columns])


def erased_scores(x_train: np.ndarray, x_test: np.ndarray, target: ProbeTarget, n_test_sentences: int,
                  settings: TokenProbeSettings, *, seed: int, n_bootstrap: int) -> tuple[dict, object]:
    """LEACE-erase the task's labels (fitted on the training words), train a fresh probe of the same kind on the
    erased features and score it on the erased test words, with its interval over test sentences; and the eraser."""
    from bertology.experiments.erasure import erased_probe

    labels, test_sentence = target.labels, target.test_sentence
    correct, eraser = erased_probe(x_train, x_test, labels.train, labels.test, len(labels.names),
                                   lambda x, y: fit_quietly(make_probe(settings, seed), x, y))
    hits, counted = sentence_hits(correct, test_sentence, n_test_sentences)
    ci = accuracy_intervals(hits, None, counted, n_bootstrap, seed)["accuracy"]
    return {"erased_accuracy": float(correct.mean()), "erased_ci_low": ci[0], "erased_ci_high": ci[1]}, eraser


def erasure_warnings(table: pd.DataFrame) -> list[str]:
    """One line per (task, model) whose erased probe stays above the majority rate by more than
    :data:`ERASURE_SLACK` at some layer: there the erasure did not remove what a linear probe reads."""
    if "erased_accuracy" not in table:
        return []
    rows = table[table["erased_accuracy"].notna()]
    bad = rows[rows["erased_accuracy"] > rows["majority_rate"] + ERASURE_SLACK]
    return [f"erasure of {task} in {model}: a fresh probe still reads it at layer(s) "
            f"{', '.join(str(int(v)) for v in part['layer'])} (accuracy above the majority rate by more than "
            f"{ERASURE_SLACK}); do not read the erased numbers there as 'the property removed'."
            for (task, model), part in bad.groupby(["probe_task", "model"], sort=False)]


def refuse_untrainable(train: Corpus, test: Corpus, settings: TokenProbeSettings, seed: int) -> None:
    """:func:`refuse_single_label` on the corpora as read (before any sentence is dropped for its tokenizer): what a
    command runs first, so a task no probe can be fitted to is refused before the structural probes' work."""
    if settings.tasks:
        words = {name: labelled_words(corpus, settings.tasks, name) for name, corpus in (("train", train), ("test", test))}
        refuse_single_label({t: probe_target(words["train"], words["test"], t, settings, seed) for t in settings.tasks})


def token_probes(models: Mapping[str, object], train: Corpus, test: Corpus, settings: TokenProbeSettings, *,
                 features: FeaturePass = FeaturePass(), bootstrap: Bootstrap = Bootstrap(),
                 on_progress: Callable[[str, int, int], None] | None = None, erasers: dict | None = None,
                 ) -> tuple[pd.DataFrame, dict]:
    """Token probes of every task on every layer of every model: the table and what the manifest records.

    ``models`` maps a name to a :class:`~bertology.models.loading.LoadedModel` or ``(model, tokenizer)``; the
    corpora need the tasks' word columns (CoNLL-U, a tag file, or text annotated with spaCy). Sentences a
    tokenizer cannot align or that exceed ``features.max_length`` are dropped (counted), as for the structural
    probes. ``features`` (:class:`~bertology.experiments.probe_features.FeaturePass`): the one pass every task,
    control and erasure reads. ``bootstrap``: ``n`` resamples for the intervals; its ``seed`` drives every random
    choice of the probes (control labels, fits, resamples). ``erasers``: see :func:`run_token_probes`."""
    from bertology.experiments.probe_features import _unpack, word_features_once
    from bertology.experiments.probe_trees import distinct_tokenizers, encodable, position_limit

    if not settings.tasks:
        raise BertologyError("token_probes needs at least one probe task (upos, xpos or deprel).")
    progress = on_progress or (lambda *_: None)
    unpacked = {name: _unpack(m) for name, m in models.items()}
    toks = distinct_tokenizers(unpacked)
    limit = position_limit(features.max_length, [enc for enc, _, _ in unpacked.values()])
    splits = {}
    for name, corpus in (("train", train), ("test", test)):
        splits[name], _ = encodable(labelled_words(corpus, settings.tasks, name), toks, limit)
        splits[name].name = name
    # before the feature pass: a task no probe can be fitted to is refused at once, not after it
    refuse_single_label({t: probe_target(splits["train"], splits["test"], t, settings, bootstrap.seed)
                         for t in settings.tasks})
    numbers = {m: tuple(range(enc.config.num_hidden_layers + 1)) if features.layers is None else tuple(features.layers)
               for m, (enc, _, _) in unpacked.items()}
    t0 = time.perf_counter()
    feats, source = word_features_once(dict(models), splits, numbers, work=features.work_dir, shared=features.shared,
                                       batch_size=features.batch_size, device=features.device, on_progress=progress)
    seconds_features = time.perf_counter() - t0
    t1 = time.perf_counter()
    table = run_token_probes(WordFeatures(feats, numbers), splits["train"], splits["test"], settings,
                             seed=bootstrap.seed, n_bootstrap=bootstrap.n, on_progress=on_progress, erasers=erasers)
    params = {"settings": settings.to_dict(), "pooling": "mean of sub-word pieces",
              "data": {s: {"n_sentences": len(w), "n_words": w.n_words, **w.stats} for s, w in splits.items()},
              "features_from": source,
              "timings_s": {"features": seconds_features, "probes": time.perf_counter() - t1},
              "not_converged": int(table["not_converged"].sum()) if "not_converged" in table else 0}
    if settings.erase:
        params["erasure"] = {"method": "LEACE (concept-erasure)", "paper": BELROSE,
                             "fitted_on": "training words", "warnings": erasure_warnings(table)}
    return table, params


def summary_lines(table: pd.DataFrame) -> list[str]:
    """Per task and model: the best layer's accuracy with its interval, its control accuracy and selectivity, the
    most selective layer, and the best compression (MDL); the majority rate beside them."""
    lines = []
    for (task, model), part in table.groupby(["probe_task", "model"], sort=False):
        best = part.loc[part["accuracy"].idxmax()]
        text = (f"token probe {task}, {model}: best accuracy {best.accuracy:.3f}"
                f"{_ci(best.accuracy_ci_low, best.accuracy_ci_high)} (layer {int(best.layer)}; majority rate "
                f"{best.majority_rate:.3f})")
        if part["selectivity"].notna().any():
            sel = part.loc[part["selectivity"].idxmax()]
            text += (f", control {best.control_accuracy:.3f}; most selective layer {int(sel.layer)}: "
                     f"{sel.selectivity:+.3f}{_ci(sel.selectivity_ci_low, sel.selectivity_ci_high, signed=True)}")
        if part["compression"].notna().any():
            mdl = part.loc[part["compression"].idxmax()]
            text += f"; MDL best compression {mdl.compression:.2f}x (layer {int(mdl.layer)})"
        if "erased_accuracy" in part and part["erased_accuracy"].notna().any():
            worst = part.loc[(part["erased_accuracy"] - part["majority_rate"]).idxmax()]
            text += (f"; after LEACE erasure at most {worst.erased_accuracy:.3f} (layer {int(worst.layer)}; "
                     f"majority {worst.majority_rate:.3f})")
        lines.append(text)
    return lines


def _ci(low: float, high: float, *, signed: bool = False) -> str:
    """`` [low, high]`` in three decimals, or nothing when there is no interval."""
    if not (low == low and high == high):
        return ""
    f = "{:+.3f}" if signed else "{:.3f}"
    return f" [{f.format(low)}, {f.format(high)}]"
