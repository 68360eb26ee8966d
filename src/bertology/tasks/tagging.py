"""Token classification (POS tagging from CoNLL-U, BIO tags from CoNLL-2003-style files): one tag per word.

The head is Hugging Face's ``*ForTokenClassification``. A word's target sits on its **first word piece**
(the first token the alignment of :mod:`bertology.data.encode` gives the word); its other pieces, the
special tokens and padding carry -100 and are ignored by the loss and the metrics. A word with no piece
of its own (a CoNLL-U multi-word token's second word sharing the first's token; a word cut off by
truncation) is not scored; the fine-tuning manifest counts such words.

Per-example records (what the ablation sweep stores per unit): ``correct`` and ``n_words`` (words tagged
right and words scored), ``loss`` (the example's **summed** word cross-entropy) and ``pred`` (how often
each tag was predicted: ``[n, K]``). Under example weights ``w`` the metrics are ratios of weighted sums,
``accuracy = Σ w·correct / Σ w·n_words`` and ``loss = Σ w·loss / Σ w·n_words`` (the mean word
cross-entropy, as training minimises it), so a resampled sentence brings all its words and the
bootstrap is over sentences, the unit that was sampled.

Which tags: a tagger saved by ``bertology finetune`` records the example field it learnt
(``upos``/``xpos`` of CoNLL-U, ``tags`` of a tag file) in its config (:data:`CONFIG_KEY`); for another
tagger the first field whose tags the model all knows is used.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedExample
from bertology.errors import BertologyError
from bertology.metrics.chance import accuracy_interval, chance_rate
from bertology.tasks.base import Degeneracy, Task

#: The loss's ignore index: pieces that are not a word's first, special tokens, padding.
IGNORE = -100
#: Example fields that hold one tag per word, in the order a tagger without a record is matched against.
TAG_FIELDS = ("tags", "upos", "xpos")
#: The config.json key where ``bertology finetune`` records which field a tagger learnt.
CONFIG_KEY = "bertology_tag_field"

_BIO = re.compile(r"^[BI]-.+$")


def is_bio(labels: Iterable[str]) -> bool:
    """Whether a tag set is BIO (IOB1/IOB2): every tag ``O``, ``B-X`` or ``I-X``, with at least one entity tag."""
    labels = [str(x) for x in labels]
    return bool(labels) and all(t == "O" or _BIO.match(t) for t in labels) and any(t != "O" for t in labels)


def word_tags(ex: Example, field: str) -> tuple[str, ...] | None:
    """The example's tags from ``field`` (``tags``, ``upos`` or ``xpos``), or None when it has none."""
    return getattr(ex, field, None)


def check_tags(corpus: Corpus, field: str, what: str = "data") -> list[tuple[str, ...]]:
    """Every example's tags from ``field``, one per word; one clear error naming the first example without them."""
    if field not in TAG_FIELDS:
        raise BertologyError(f"Unknown tag column {field!r}; choose from upos, xpos (CoNLL-U) or tags (a tag file).")
    out = []
    for i, ex in enumerate(corpus):
        tags = word_tags(ex, field)
        if tags is None or ex.words is None:
            hint = ("a CoNLL-U file (--tag-column upos or xpos) or a CoNLL-2003-style tag file (.conll, .bio, .iob)"
                    if field != "tags" else "a CoNLL-2003-style tag file (.conll, .bio, .iob)")
            raise BertologyError(
                f"The {what} ({corpus.source}) has no {field} tags for example {i + 1} ({ex.text[:40]!r}); "
                f"a tagging task needs one tag per word: pass {hint}."
            )
        if len(tags) != len(ex.words):  # pragma: no cover - the readers make them equal
            raise BertologyError(f"The {what} ({corpus.source}) example {i + 1} has {len(ex.words)} words but {len(tags)} tags.")
        out.append(tuple(str(t) for t in tags))
    return out


def label2id_of(model: torch.nn.Module) -> dict[str, int]:
    """The model's tag -> id map."""
    return {str(k): int(v) for k, v in (getattr(model.config, "label2id", None) or {}).items()}


def tag_field_of(model: torch.nn.Module, corpus: Corpus) -> str:
    """The example field whose tags ``model`` was trained on: its recorded field, else the first that fits."""
    recorded = getattr(model.config, CONFIG_KEY, None)
    if recorded in TAG_FIELDS:
        return str(recorded)
    known = set(label2id_of(model))
    for field in TAG_FIELDS:
        tags = [word_tags(ex, field) for ex in corpus]
        if all(t is not None for t in tags) and {x for t in tags for x in t} <= known:
            return field
    return "tags" if any(ex.tags is not None for ex in corpus) else "upos"


def first_pieces(item: EncodedExample, n_words: int) -> np.ndarray:
    """Token position of each word's first piece (-1 for a word with no piece of its own), first text only."""
    out = np.full(n_words, -1, dtype=np.int64)
    wid = np.asarray(item.word_ids)
    seg = np.asarray(item.segment)
    pos = np.flatnonzero((wid >= 0) & (seg <= 0))
    words, first = np.unique(wid[pos], return_index=True)
    keep = words < n_words
    out[words[keep]] = pos[first[keep]]
    return out


class Tagging(Task):
    name = "tagging"
    example_unit = "sentences"
    metrics: tuple[str, ...] = ("accuracy", "loss")
    higher_is_better = {"accuracy": True, "loss": False}
    loss_metric = "loss"
    loss_name = "cross-entropy per word"
    problem_type = "single_label_classification"  # one tag per word (Hugging Face's token heads ignore it)
    target_dtype = torch.long
    token_level = True

    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        if not type(model).__name__.endswith("ForTokenClassification"):
            raise BertologyError(f"{name} has no token-classification head; pass a fine-tuned tagger "
                                 "(e.g. `bertology finetune --task tagging`).")

    def targets(self, corpus: Corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        """Each example's tag ids, one per word (an object array of int64 arrays, corpus order)."""
        field = tag_field_of(model, corpus)
        tags = check_tags(corpus, field, what)
        label2id = label2id_of(model)
        unknown = sorted({t for seq in tags for t in seq} - set(label2id))
        if unknown:
            raise BertologyError(
                f"The {what} ({corpus.source}) has {field} tag(s) {', '.join(map(repr, unknown[:10]))}"
                f"{' ...' if len(unknown) > 10 else ''} that the model does not know; its tags are "
                f"{', '.join(map(repr, sorted(label2id)))}. Use data tagged like the model's training data."
            )
        out = np.empty(len(tags), dtype=object)
        out[:] = [np.array([label2id[t] for t in seq], dtype=np.int64) for seq in tags]
        return out

    def collate_targets(self, items: Sequence[EncodedExample], targets: Sequence[Any]) -> torch.Tensor:
        """``[B, T]``: each word's tag id on its first piece, -100 on every other position."""
        width = max(len(it) for it in items)
        out = np.full((len(items), width), IGNORE, dtype=np.int64)
        for row, (it, y) in enumerate(zip(items, targets)):
            y = np.asarray(y, dtype=np.int64)
            at = first_pieces(it, len(y))
            placed = at >= 0
            out[row, at[placed]] = y[placed]
        return torch.from_numpy(out)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy over the words' first pieces (mean over the batch's words, or their sum)."""
        return F.cross_entropy(outputs.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction=reduction)

    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        lg = outputs.detach().double()
        k = lg.shape[-1]
        scored = targets != IGNORE
        pred = lg.argmax(-1)
        ce = F.cross_entropy(lg.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")  # [B, T], 0 where ignored
        counts = torch.zeros(lg.shape[0], k, dtype=torch.int64, device=lg.device)
        counts.scatter_add_(1, torch.where(scored, pred, 0), scored.long())
        out = {
            "pred": counts.cpu().numpy(),
            "loss": ce.sum(1).cpu().numpy(),
            "correct": ((pred == targets) & scored).sum(1).cpu().numpy().astype(np.int64),
            "n_words": scored.sum(1).cpu().numpy().astype(np.int64),
        }
        out.update(self._entity_counts(pred, targets, scored))
        return out

    def _entity_counts(self, pred: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor) -> dict[str, np.ndarray]:
        """Further per-example counts (entity counts of BIO tags); none for plain tags."""
        return {}

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        w = np.asarray(weights, dtype=np.float64)
        words = w @ np.asarray(records["n_words"], dtype=np.float64).T  # [R, U]
        safe = np.where(words > 0, words, 1.0)
        nan = np.where(words > 0, 1.0, np.nan)
        return {
            "accuracy": (w @ np.asarray(records["correct"], dtype=np.float64).T) / safe * nan,
            "loss": (w @ np.asarray(records["loss"], dtype=np.float64).T) / safe * nan,
        }

    def n_predicted(self, pred: np.ndarray) -> int:
        """Distinct tags predicted over all words (``pred`` holds per-example tag counts)."""
        return int((np.asarray(pred).reshape(len(pred), -1).sum(0) > 0).sum())

    def chance(self, y: np.ndarray) -> float:
        """The majority-tag rate over every word of ``y`` (the accuracy of always predicting the commonest tag)."""
        words = np.concatenate([np.asarray(t) for t in y]) if len(y) else np.array([])
        return chance_rate(words)

    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        """Constant when one tag (or none) was predicted; at chance when the Wilson 95% interval of the word
        accuracy, taken over the ``n`` sentences (words of one sentence are not independent draws, so the
        sentence count is the conservative sample size), reaches down to the majority-tag rate."""
        lo, hi = accuracy_interval(round(value * n), n) if np.isfinite(value) else (float("nan"), float("nan"))
        return Degeneracy(
            metric="accuracy", value=float(value), n=int(n), ci=(lo, hi), ci_method="wilson 95% over sentences",
            chance=float(chance), chance_method="majority-tag rate over words", n_predicted=int(n_predicted),
            constant_predictions=int(n_predicted) <= 1, at_chance=bool(not np.isfinite(lo) or lo <= chance),
            what="tagger",
        )

    def prediction_summary(self, pred: np.ndarray, config: Any) -> dict:
        """The tags the intact tagger predicted, most frequent first, with their word counts."""
        id2label = getattr(config, "id2label", None) or {}
        total = np.asarray(pred).reshape(len(pred), -1).sum(0)
        order = [int(i) for i in np.argsort(-total, kind="stable") if total[i] > 0]
        return {"predicted_tags": {str(id2label.get(i, i)): int(total[i]) for i in order}}


TASK = Tagging()
