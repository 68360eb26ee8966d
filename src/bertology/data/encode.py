"""Tokenise a corpus once, with a max length, counting what was truncated or skipped.

The result keeps, per example, the token ids and the sub-word -> word map that every analysis needs,
so the extraction loop never re-tokenises and no over-long example disappears without a count.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from transformers import PreTrainedTokenizerBase

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

Overlong = Literal["skip", "truncate"]


@dataclass
class EncodedExample:
    """Token-level view of one example.

    ``word_ids[t]`` is the word index of token ``t`` (-1 for special tokens); ``segment[t]`` is 0 for
    the first sentence and 1 for the second (-1 for special tokens). ``index`` is the example's position
    in the corpus.
    """

    index: int
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    special: np.ndarray  # bool, True for [CLS]/[SEP]/...
    word_ids: np.ndarray  # int, -1 for special tokens
    segment: np.ndarray  # int, -1 for special tokens
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class EncodedCorpus:
    """All kept examples, plus counts of the truncated and skipped ones."""

    items: list[EncodedExample]
    max_length: int
    overlong: Overlong
    n_input: int
    skipped: list[int] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return int(sum(len(it) for it in self.items))

    def describe(self) -> dict:
        return {
            "max_length": self.max_length,
            "overlong": self.overlong,
            "n_input": self.n_input,
            "n_kept": len(self.items),
            "n_skipped_overlong": len(self.skipped),
            "n_truncated": len(self.truncated),
            "n_tokens": self.n_tokens,
        }


def _encode_one(tok: PreTrainedTokenizerBase, ex: Example, max_length: int | None):
    """Tokenise one example; pre-split ``words`` are used so pieces align to annotated words.

    A pair annotated over both texts (``n_first_words``) passes both sides as words. A pair with words
    for its first text only passes the second text split on whitespace (a tokenizer cannot mix a
    pre-split and a raw side); its second-text words carry no annotations either way.
    """
    kwargs = dict(return_special_tokens_mask=True)
    if max_length is not None:
        kwargs.update(truncation=True, max_length=max_length)
    if ex.words is None:
        return tok(ex.text, ex.text_pair, **kwargs) if ex.text_pair is not None else tok(ex.text, **kwargs)
    kwargs["is_split_into_words"] = True
    if ex.text_pair is None:
        return tok(list(ex.words), **kwargs)
    if ex.n_first_words is not None:
        n = ex.n_first_words
        return tok(list(ex.words[:n]), list(ex.words[n:]), **kwargs)
    return tok(list(ex.words), ex.text_pair.split(), **kwargs)


def encode_example(
    tok: PreTrainedTokenizerBase, ex: Example, index: int, max_length: int | None = None
) -> EncodedExample:
    """Tokenise one example (truncating to ``max_length`` when given)."""
    enc = _encode_one(tok, ex, max_length)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    special = np.asarray(enc["special_tokens_mask"], dtype=bool)
    wid = enc.word_ids()
    seq = enc.sequence_ids()
    word_ids = np.array([-1 if w is None else w for w in wid], dtype=np.int64)
    segment = np.array([-1 if s is None else s for s in seq], dtype=np.int64)
    word_ids[special] = -1
    segment[special] = -1
    tti = enc.get("token_type_ids")
    token_type_ids = np.asarray(tti if tti is not None else np.zeros_like(ids), dtype=np.int64)
    return EncodedExample(index, ids, token_type_ids, special, word_ids, segment)


def encode_corpus(
    corpus: Corpus,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = 128,
    overlong: Overlong = "skip",
) -> EncodedCorpus:
    """Tokenise every example; over-long ones are skipped or truncated, and counted either way."""
    if len(corpus) == 0:
        raise BertologyError(f"The corpus {corpus.name!r} ({corpus.source}) has no examples.")
    if overlong not in ("skip", "truncate"):
        raise BertologyError(f"overlong must be 'skip' or 'truncate', not {overlong!r}")
    model_max = getattr(tokenizer, "model_max_length", None) or max_length
    if model_max < max_length:
        logger.warning("max_length %d exceeds the tokenizer's limit %d; using %d", max_length, model_max, model_max)
        max_length = int(model_max)
    out = EncodedCorpus([], max_length, overlong, len(corpus))
    for i, ex in enumerate(corpus):
        item = encode_example(tokenizer, ex, i)
        if len(item) > max_length:
            if overlong == "skip":
                out.skipped.append(i)
                continue
            item = encode_example(tokenizer, ex, i, max_length)
            item.truncated = True
            out.truncated.append(i)
        out.items.append(item)
    if out.skipped:
        logger.warning("%d of %d examples are longer than %d tokens and were skipped", len(out.skipped), len(corpus), max_length)
    if out.truncated:
        logger.warning("%d of %d examples were truncated to %d tokens", len(out.truncated), len(corpus), max_length)
    if not out.items:
        raise BertologyError(f"All {len(corpus)} examples are longer than max_length={max_length}; raise --max-length.")
    return out
