"""Label maps: the data's labels put onto a model's, for scoring a classifier on data labelled otherwise.

A model fine-tuned on Pang & Lee's polarity has the labels ``-1`` and ``1`` in its config (``id2label``); a
held-out file labelled ``0`` / ``1`` means the same classes under other names. ``--label-map 0=-1,1=1``
(``label_map="0=-1,1=1"`` or ``label_map={0: -1, 1: 1}`` in Python) says so: ``DATA=MODEL`` pairs, every label
of the data named once. The map is parsed and checked with the other settings (:func:`parse_label_map`: one line
for bad syntax or a label mapped twice) and applied to the corpus before anything scores it
(:func:`map_labels`), which then reads as if it had been labelled with the model's labels all along.

This module reads no model: whether the mapped labels are the model's is :mod:`bertology.tasks.match`'s question.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError

#: What ``--label-map`` says in ``--help`` (``bertology compare`` and ``bertology ablate`` declare it alike).
LABEL_MAP_HELP = ("Map the data's labels onto the model's: DATA=MODEL pairs, e.g. 0=-1,1=1 or neg=0,pos=1, naming "
                  "every label of the data once; for data labelled otherwise than the classifier's config (id2label).")
#: Where a mapped corpus keeps the map it was given (``stats``; the manifest's data section shows it).
STATS_KEY = "label_map"
EXAMPLE = "e.g. 0=-1,1=1"


def _label(value: object, side: str, item: str) -> str:
    """One side of a pair as text, refused when it is empty or holds a separator."""
    text = str(value).strip()
    if not text:
        raise ValueError(f"has an empty {side} label in {item!r} ({EXAMPLE})")
    if "," in text or "=" in text:
        raise ValueError(f"has a label with ',' or '=' in it ({text!r}), which a DATA=MODEL list cannot hold")
    return text


def _pairs(value: str | Mapping) -> list[tuple[str, str]]:
    if isinstance(value, Mapping):
        return [(_label(k, "data", f"{k}={v}"), _label(v, "model", f"{k}={v}")) for k, v in value.items()]
    if not isinstance(value, str):
        raise ValueError(f"takes DATA=MODEL pairs as text ({EXAMPLE}) or a mapping, not {type(value).__name__}")
    out = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"takes DATA=MODEL pairs separated by commas ({EXAMPLE}); {item!r} has no '='")
        data, model = item.split("=", 1)
        if "=" in model:
            raise ValueError(f"takes one '=' per DATA=MODEL pair; {item!r} has more")
        out.append((_label(data, "data", item), _label(model, "model", item)))
    return out


def parse_label_map(value: str | Mapping) -> str:
    """``" 0=-1, 1=1 "`` (or ``{0: -1, 1: 1}``) -> ``"0=-1,1=1"``: the map checked and written one way.

    A :class:`ValueError` (the setting's check words it as ``--label-map (label_map) ...``) for an empty map, a pair
    without ``=``, an empty label, or a data label named twice. Two data labels may go to one model label (classes
    merged); the canonical text parses back to itself.
    """
    pairs = _pairs(value)
    if not pairs:
        raise ValueError(f"is empty: give DATA=MODEL pairs ({EXAMPLE})")
    seen: dict[str, str] = {}
    for data, model in pairs:
        if data in seen:
            raise ValueError(f"maps the data's label {data!r} twice (to {seen[data]!r} and to {model!r})")
        seen[data] = model
    return ",".join(f"{d}={m}" for d, m in pairs)


#: The declaration both commands share (one record, as :func:`bertology.settings.compose` requires).
LABEL_MAP = dict(default=None, kind=str, parse=parse_label_map, help=LABEL_MAP_HELP, metavar="DATA=MODEL,...")


def label_map_pairs(label_map: str | Mapping | None) -> dict[str, str]:
    """The map as ``{data label: model label}`` (empty for None)."""
    return {} if label_map is None else dict(_pairs(parse_label_map(label_map)))


def map_labels(corpus: Corpus, label_map: str | Mapping | None) -> Corpus:
    """``corpus`` with every label replaced by the model's label the map gives it (None: ``corpus`` itself).

    Every label of the data must be in the map: one that is not is an error naming it (a label left as it was
    would be scored as whatever the model calls it). Unlabelled examples stay unlabelled. Mapping a corpus
    already mapped with the same map returns it unchanged (its ``stats`` record the map), so each step that scores
    the data may apply the run's map without applying it twice.
    """
    if label_map is None:
        return corpus
    text = parse_label_map(label_map)
    if corpus.stats.get(STATS_KEY) == text:
        return corpus
    pairs = label_map_pairs(text)
    missing = sorted({str(ex.label) for ex in corpus if ex.label is not None} - set(pairs))
    if missing:
        shown = ", ".join(map(repr, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise BertologyError(f"--label-map (label_map) {text} does not map the label(s) {shown} of {corpus.source}; "
                             "name every label of the data.")
    examples = [ex if ex.label is None else dataclasses.replace(ex, label=pairs[str(ex.label)]) for ex in corpus]
    return Corpus(examples, corpus.name, corpus.source, {**corpus.stats, STATS_KEY: text})
