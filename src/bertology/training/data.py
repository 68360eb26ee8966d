"""Training-data filters for bias experiments: drop examples that mention chosen words, and slice the eval set.

A word matches as a whole word, case-insensitively, in either text of a pair: ``woman`` matches
"A Woman sits." and "the woman's bag" but not "womanhood" or "superwoman". The same matcher cuts the
evaluation set into the slice *with* any of the words and the slice *without* them, so a bias
experiment shows where accuracy moved.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from bertology.config import parse_word_list
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

#: ``parse_word_list`` (the word lists' reader) is declared with the settings it parses, in bertology.config.
__all__ = ["SLICE_ALL", "SLICE_WITH", "SLICE_WITHOUT", "eval_slices", "exclude_examples", "mention_mask", "mentions",
           "parse_word_list", "word_pattern"]

#: ``slice`` values of the finetune table.
SLICE_ALL = "all"
SLICE_WITH = "with_words"
SLICE_WITHOUT = "without_words"


def word_pattern(words: Iterable[str]) -> re.Pattern:
    """A case-insensitive whole-word regex for any of ``words`` (a "word" ends where \\w characters end)."""
    words = [w for w in words if w]
    if not words:
        raise BertologyError("The word list is empty.")
    alternation = "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))
    return re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE)


def mentions(example: Example, pattern: re.Pattern) -> bool:
    """Whether either text of the example contains one of the pattern's words."""
    return bool(pattern.search(example.text)) or (example.text_pair is not None and bool(pattern.search(example.text_pair)))


def mention_mask(corpus: Corpus, words: Sequence[str]) -> np.ndarray:
    """Boolean array: True where the example mentions any of ``words``."""
    pattern = word_pattern(words)
    return np.array([mentions(ex, pattern) for ex in corpus], dtype=bool)


def eval_slices(eval_corpus: Corpus, words: Sequence[str], exclusion: dict | None = None
                ) -> tuple[dict[str, np.ndarray] | None, dict | None]:
    """The held-out examples with / without ``words`` (masks by slice name) and the manifest's ``slicing``
    record; ``(None, None)`` without words. ``exclusion`` (the training-side record), when given, gains the
    eval counts so a bias experiment's manifest says how many held-out examples each slice scores."""
    if not words:
        return None, None
    with_words = mention_mask(eval_corpus, words)
    slicing = {"words": list(words), SLICE_WITH: int(with_words.sum()), SLICE_WITHOUT: int((~with_words).sum())}
    if exclusion is not None:
        exclusion["eval_with_words"], exclusion["eval_without_words"] = slicing[SLICE_WITH], slicing[SLICE_WITHOUT]
    return {SLICE_WITH: with_words, SLICE_WITHOUT: ~with_words}, slicing


def exclude_examples(corpus: Corpus, words: Sequence[str]) -> tuple[Corpus, dict]:
    """The corpus without the examples that mention any of ``words``, and what was dropped.

    The returned info (for the manifest) holds the words, ``n_before``, ``n_dropped``, ``n_after`` and
    the number of dropped examples per word (an example with two words counts for both).
    """
    pattern = word_pattern(words)
    mask = np.array([mentions(ex, pattern) for ex in corpus], dtype=bool)
    per_word: dict[str, int] = {}
    for w in words:
        p = word_pattern([w])
        per_word[w] = int(sum(mentions(corpus[i], p) for i in np.flatnonzero(mask)))
    kept = [int(i) for i in np.flatnonzero(~mask)]
    out = corpus.subset(kept, name=corpus.name)
    out.stats["excluded_words"] = {"n_dropped": int(mask.sum()), "words": list(words)}
    info = {
        "words": list(words),
        "n_before": len(corpus),
        "n_dropped": int(mask.sum()),
        "n_after": len(kept),
        "dropped_per_word": per_word,
    }
    return out, info
