"""SQuAD exact match and F1, as the official evaluation scripts (evaluate-v1.1.py, evaluate-v2.0.py) define them.

An answer is normalised by lower-casing, removing punctuation (``string.punctuation``), removing the
articles ``a``/``an``/``the`` (whole words) and collapsing whitespace, in that order of effect (the
scripts apply ``white_space_fix(remove_articles(remove_punc(lower(s))))``). Exact match is equality of
the normalised strings; F1 is the harmonic mean of precision and recall of the normalised tokens
(whitespace split) counted as a multiset. A prediction scores the maximum over the gold answers.

v2.0 (unanswerable questions): the gold answers are those whose normalised text is not empty, and
``[""]`` when none is, so predicting the empty string scores 1 on an unanswerable question and 0 on an
answerable one. v2.0's F1 of two token lists where either is empty is ``float(a == b)`` (v1.1 never
meets an empty gold answer). The v2.0 filter is applied to v1.1 files too: the two rules differ only for a
gold answer that normalises to the empty string (an answer "the"), which SQuAD v1.1 does not hold.
Pure functions, no model code.
"""
from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (the official rule)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(s: str) -> list[str]:
    """The normalised answer's tokens (empty for an empty answer)."""
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings (v2.0's rule when either is empty: 1 if both are)."""
    pred, ref = answer_tokens(prediction), answer_tokens(gold)
    if not pred or not ref:
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def gold_answers(texts: Sequence[str]) -> list[str]:
    """The answers a prediction is scored against: those with a non-empty normalised text, else ``[""]``."""
    kept = [t for t in texts if normalize_answer(t)]
    return kept or [""]


def best_scores(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of one prediction: each the maximum over :func:`gold_answers` of ``golds``."""
    refs = gold_answers(golds)
    return max(exact_match(prediction, g) for g in refs), max(f1(prediction, g) for g in refs)
