"""Tokenise a corpus once, with a max length, counting what was truncated or skipped.

The result keeps, per example, the token ids and the sub-word -> word map that every analysis needs,
so the extraction loop never re-tokenises and no over-long example disappears without a count.

Examples with known ``words`` (CoNLL-U, spaCy) are tokenised as plain text, never word by word, so the
model sees exactly the ids it would see for the sentence (byte-level BPE and SentencePiece mark word
starts, which ``is_split_into_words`` loses); the words are located in the text and each token is given
to a word through its character offsets (see :func:`encode_example`).
"""
from __future__ import annotations

import bisect
import logging
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from transformers import PreTrainedTokenizerBase

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

Overlong = Literal["skip", "truncate"]
WordSource = Literal["tokenizer", "text", "multiword", "joined"]


@dataclass
class EncodedExample:
    """Token-level view of one example.

    ``word_ids[t]`` is the word index of token ``t`` (-1 for special tokens); ``segment[t]`` is 0 for
    the first sentence and 1 for the second (-1 for special tokens). ``index`` is the example's position
    in the corpus. Word ids restart at 0 in a pair's second sentence (see
    :func:`bertology.data.align.annotated_word_ids`).

    For an example with ``words``, each token belongs to the word holding its first character (a token
    starting in the space before a word, such as "▁x" or a lone "▁", to that word). A token that also
    covers the next word moves to it when that word would otherwise have no token on its characters
    and the word before keeps one. A word still without one is listed in ``shared_words``: its index
    (into ``Example.words``) -> the token it shares, the first covering its surface form (one token
    "cannot" for the words "can" + "not"; "du" for the CoNLL-U words "de" + "le"). Such a word usually
    has no token in ``word_ids`` (only whitespace after it can give it one), so word-level pooling leaves
    it out (NaN) rather than giving it a neighbour's pieces; an analysis that wants it can use the
    shared token.

    ``word_source`` says what was tokenised: ``"tokenizer"`` (no words: the raw text, with the
    tokenizer's own word ids), ``"text"`` (the words were found in the text as they are, so the ids are
    exactly the text's), ``"multiword"`` (also the text's ids, but some words stand for a surface form
    spelt differently, as multi-word tokens do) or ``"joined"`` (the words could not be found in the
    text, so ``" ".join(words)`` was tokenised instead and the ids are that string's).
    """

    index: int
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    special: np.ndarray  # bool, True for [CLS]/[SEP]/...
    word_ids: np.ndarray  # int, -1 for special tokens
    segment: np.ndarray  # int, -1 for special tokens
    truncated: bool = False
    shared_words: dict[int, int] = field(default_factory=dict)
    word_source: WordSource = "tokenizer"

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
        out = {
            "max_length": self.max_length,
            "overlong": self.overlong,
            "n_input": self.n_input,
            "n_kept": len(self.items),
            "n_skipped_overlong": len(self.skipped),
            "n_truncated": len(self.truncated),
            "n_tokens": self.n_tokens,
        }
        if any(it.word_source != "tokenizer" for it in self.items):  # corpora with words only: older manifests hold
            out["n_words_sharing_a_token"] = sum(len(it.shared_words) for it in self.items)
            out["n_examples_multiword"] = sum(it.word_source == "multiword" for it in self.items)
            out["n_examples_words_not_in_text"] = sum(it.word_source == "joined" for it in self.items)
        return out


# --------------------------------------------------------------------------------------------------
# words -> characters of the text
#
# Tokenisers must see the plain text: ``is_split_into_words`` tokenises each word on its own, which
# drops the byte-level BPE "Ġ" / SentencePiece "▁" word-start marker from all but (at best) the first
# word and changes the ids (RoBERTa's "the Ġmovie" became "the m o vi e"). So the words are
# located in the text, the text is tokenised as it is, and each token is given to a word through its
# character offsets.

Span = tuple[int, int]

#: The most words one surface form may stand for when words and text differ (CoNLL-U multi-word
#: tokens: "du" = "de" + "le", "dámelo" = "da" + "me" + "lo").
_MAX_GROUP = 4
#: Search states tried per word before the words are declared not to be the text.
_BUDGET_PER_WORD = 50

#: (next word, next position, spans, surfaces, whether the words stand for a differing form)
_Move = tuple[int, int, list[Span], list[Span], bool]


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


#: Penn Treebank escapes that word forms of converted treebanks use for characters of the text.
_PTB = {"``": '"', "''": '"', "-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def _letters(s: str) -> set[str]:
    """The characters of ``s`` without case or accents ("À" -> "a"), Penn Treebank escapes and curly
    quotes read as the characters they stand for: to tell whether a form and its words are related."""
    for escape, char in _PTB.items():
        s = s.replace(escape, char)
    s = s.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    return {c for c in unicodedata.normalize("NFKD", s.casefold()) if not unicodedata.combining(c)}


def _moves(words: Sequence[str], text: str, i: int, pos: int) -> Iterator[_Move]:
    """Ways to place ``words[i]`` (and maybe the next ones) at ``pos``, most likely first.

    First the word as it is. Then groups: the words ``i..j-1`` (at most :data:`_MAX_GROUP`) standing for
    ``text[pos:q]``, a form without spaces that shares a letter with them (a multi-word token such as
    "du" for "de" + "le"); the first word takes the form's span, the others an empty one. Groups after
    which the next word is found as it is come first (shortest form, fewest words), then the others.
    """
    w = words[i]
    if text.startswith(w, pos):
        yield i + 1, _skip_space(text, pos + len(w)), [(pos, pos + len(w))], [(pos, pos + len(w))], False
    form_end = pos
    while form_end < len(text) and not text[form_end].isspace():
        form_end += 1
    groups: list[tuple[bool, _Move]] = []
    for q in range(pos + 1, form_end + 1):
        form = _letters(text[pos:q])
        after = _skip_space(text, q)
        for j in range(i + 1, min(i + _MAX_GROUP, len(words)) + 1):
            if form & _letters("".join(words[i:j])):
                resumes = after == len(text) if j == len(words) else text.startswith(words[j], after)
                spans = [(pos, q)] + [(q, q)] * (j - i - 1)
                groups.append((not resumes, (j, after, spans, [(pos, q)] * (j - i), True)))
    groups.sort(key=lambda g: g[0])  # stable: within each kind, shortest form and fewest words first
    for _, move in groups:
        yield move


def _locate(words: Sequence[str], text: str) -> tuple[list[Span], list[Span], bool] | None:
    """Character span of each word in ``text``, left to right, or ``None`` when the words are not the text.

    Returns ``(spans, surface, multiword)``. A word found as it is gets its own span; whitespace may
    separate words or not ("do" "n't" in "don't"). Where the text differs, a group of words stands for
    one surface form (see :func:`_moves`): its first word takes that form's span and the others an
    empty span, and ``surface`` holds the whole form for each of them (to find the token they share).
    The words must cover every non-space character of the text. A depth-first search takes the first
    placement that works in the order of :func:`_moves` and never revisits a failed (word, position)
    state, within a budget.
    """
    if any(not w.strip() for w in words):
        raise BertologyError(f"Cannot align the words {list(words)!r} to their text: a word is empty or only spaces.")
    words = [w.strip() for w in words]
    n, end = len(words), len(text)
    start = _skip_space(text, 0)
    if n == 0:
        return ([], [], False) if start == end else None
    stack: list[tuple[int, int, Iterator[_Move]]] = [(0, start, _moves(words, text, 0, start))]
    path: list[_Move] = []  # the move that led to each frame above the first
    failed: set[tuple[int, int]] = set()
    budget = _BUDGET_PER_WORD * n
    while stack:
        i, pos, moves = stack[-1]
        for move in moves:
            j, q = move[0], move[1]
            if j == n and q == end:
                path.append(move)
                spans = [span for m in path for span in m[2]]
                surface = [span for m in path for span in m[3]]
                return spans, surface, any(m[4] for m in path)
            if j == n or (j, q) in failed:
                continue
            budget -= 1
            if budget < 0:
                return None
            path.append(move)
            stack.append((j, q, _moves(words, text, j, q)))
            break
        else:  # no way on from here
            failed.add((i, pos))
            stack.pop()
            if path:
                path.pop()
    return None


@dataclass
class _Side:
    """One sentence of an example with words: the string tokenised and each word's characters in it."""

    text: str
    spans: list[Span]
    surface: list[Span]
    source: WordSource
    first_word: int | None  # index of this side's first word in Example.words; None: not annotated


def _side(words: Sequence[str], text: str, first_word: int | None) -> _Side:
    """Locate ``words`` in ``text``; when they are not there, tokenise ``" ".join(words)`` instead."""
    found = _locate(words, text)
    if found is not None:
        spans, surface, multiword = found
        return _Side(text, spans, surface, "multiword" if multiword else "text", first_word)
    joined = " ".join(words)
    found = _locate(words, joined)
    if found is None or found[2]:  # cannot happen: words always match their own join
        raise BertologyError(f"Cannot align the words {list(words)!r} even to their own join {joined!r}.")
    return _Side(joined, found[0], found[1], "joined", first_word)


def _token_words(offsets: Sequence[Span], spans: Sequence[Span]) -> list[int]:
    """The word of each token: the word whose span holds the token's first character.

    A token that starts between words (in whitespace) belongs to the next word: SentencePiece's
    "▁x" and a lone "▁" start at the space before "x", byte-level BPE's lone "Ġ" has an empty span
    at the next word's start. Past the last word, the last word. Empty spans (words that share a
    surface form with the word before) never get a token here.
    """
    owners = [k for k, (s, e) in enumerate(spans) if e > s]
    starts = [spans[k][0] for k in owners]
    out = []
    for a, _ in offsets:
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or (a >= spans[owners[k]][1] and k + 1 < len(owners)):
            k += 1
        out.append(owners[k])
    return out


def _assign(offsets: Sequence[Span], side: _Side) -> tuple[list[int], dict[int, int]]:
    """Word per token of one side, and the tokens shared by words left without one (side-local indices).

    A word is left without a token of its own when none of the tokens given to it covers any of its
    characters (a lone "▁"/"Ġ" in the space before it does not count): one token spans it and the word
    before ("cannot" for "can" + "not"), or it shares a surface form (multi-word tokens). If that token
    is the last token of the word before and that word keeps another token on its own characters, the
    token moves to this word, so both keep one; otherwise the word is recorded as sharing the first
    token that covers its surface form. A word whose characters the tokenizer's normaliser deletes (a
    lone combining accent, a control character) shares the token before it.
    """
    if not side.spans or not offsets:
        return [-1] * len(offsets), {}
    words = _token_words(offsets, side.spans)

    def on_own_characters(t: int, w: int) -> bool:
        (a, b), (s, e) = offsets[t], side.spans[w]
        return a < e and b > s

    real = np.zeros(len(side.spans), dtype=np.int64)
    for t, w in enumerate(words):
        real[w] += on_own_characters(t, w)
    shared: dict[int, int] = {}
    for w in np.flatnonzero(real == 0):
        w = int(w)
        own = side.spans[w][1] > side.spans[w][0]
        s, e = side.spans[w] if own else side.surface[w]
        over = [t for t, (a, b) in enumerate(offsets) if a < e and b > s]
        if not over:
            before = [t for t, (a, _) in enumerate(offsets) if a < s]
            shared[w] = before[-1] if before else 0
            continue
        t = over[-1]
        u = words[t]
        last_of_u = t + 1 == len(words) or words[t + 1] != u
        if own and u < w and last_of_u and real[u] - on_own_characters(t, u) > 0:
            real[u] -= on_own_characters(t, u)
            words[t] = w
            real[w] += 1
        else:
            shared[w] = over[0]
    return words, shared


def _sides(ex: Example) -> list[_Side]:
    """The sentence(s) of an example with words, each with its words located."""
    assert ex.words is not None
    if ex.text_pair is None:
        return [_side(ex.words, ex.text, 0)]
    if ex.n_first_words is not None:
        n = ex.n_first_words
        return [_side(ex.words[:n], ex.text, 0), _side(ex.words[n:], ex.text_pair, n)]
    # words for the first text only: the second text's words are its whitespace-separated parts and
    # carry no annotations (as :func:`bertology.data.align.annotated_word_ids` assumes)
    return [_side(ex.words, ex.text, 0), _side(ex.text_pair.split(), ex.text_pair, None)]


def _tokenise(tok: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None, offsets: bool):
    kwargs: dict = dict(return_special_tokens_mask=True, return_offsets_mapping=offsets)
    if max_length is not None:
        kwargs.update(truncation=True, max_length=max_length)
    return tok(*texts, **kwargs)


def _arrays(enc, word_ids: Sequence[int]) -> tuple[np.ndarray, ...]:
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    special = np.asarray(enc["special_tokens_mask"], dtype=bool)
    seq = enc.sequence_ids()
    wid = np.asarray(word_ids, dtype=np.int64)
    segment = np.array([-1 if s is None else s for s in seq], dtype=np.int64)
    wid[special] = -1
    segment[special] = -1
    tti = enc.get("token_type_ids")
    token_type_ids = np.asarray(tti if tti is not None else np.zeros_like(ids), dtype=np.int64)
    return ids, token_type_ids, special, wid, segment


def encode_example(
    tok: PreTrainedTokenizerBase, ex: Example, index: int, max_length: int | None = None
) -> EncodedExample:
    """Tokenise one example (truncating to ``max_length`` when given).

    Without ``words`` the text (and pair) is tokenised and the tokenizer's word ids are kept. With
    ``words`` the ids are still those of the plain text (``tok(text)`` / ``tok(text, text_pair)``), and
    each token is given to the annotated word holding its first character (see :class:`EncodedExample`
    for words without a token of their own and for words not found in the text). A pair annotated over
    both texts (``n_first_words``) maps both sides to words; a pair with words for its first text only
    maps its second text to its whitespace-separated parts, which carry no annotations. Needs a fast
    tokenizer (character offsets) when there are words.
    """
    if ex.words is None:
        texts = [ex.text] if ex.text_pair is None else [ex.text, ex.text_pair]
        enc = _tokenise(tok, texts, max_length, offsets=False)
        wid = [-1 if w is None else w for w in enc.word_ids()]
        return EncodedExample(index, *_arrays(enc, wid))
    if not getattr(tok, "is_fast", False):
        raise BertologyError(
            f"Aligning sub-words to the corpus's words needs a fast tokenizer (character offsets); "
            f"{type(tok).__name__} is not one. Load the model's tokenizer with use_fast=True (a tokenizer.json)."
        )
    sides = _sides(ex)
    texts = [s.text for s in sides]
    # words are mapped on the whole text, then cut like the tokens: a truncated example's word ids are
    # exactly the untruncated ones of the tokens it keeps
    full = _tokenise(tok, texts, None, offsets=True)
    enc = full if max_length is None else _tokenise(tok, texts, max_length, offsets=False)
    full_ids, full_offsets, kept_ids = full["input_ids"], full["offset_mapping"], enc["input_ids"]
    word_ids = [-1] * len(kept_ids)
    shared: dict[int, int] = {}
    for k, side in enumerate(sides):
        full_pos = _side_positions(full, k)
        offsets = [tuple(full_offsets[t]) for t in full_pos]
        if any(b > len(side.text) or a > b for a, b in offsets):
            raise BertologyError(f"{type(tok).__name__} gave character offsets outside the text {side.text!r}")
        words, side_shared = _assign(offsets, side)
        pos = _side_positions(enc, k)
        first = _kept_from(tok, [full_ids[t] for t in full_pos], [kept_ids[t] for t in pos])
        for t, w in zip(pos, words[first : first + len(pos)]):
            word_ids[t] = w
        if side.first_word is not None:
            kept = {w: t - first for w, t in side_shared.items() if 0 <= t - first < len(pos)}  # not cut off
            shared.update({side.first_word + w: pos[t] for w, t in kept.items()})
    sources = {s.source for s in sides}
    source: WordSource = "joined" if "joined" in sources else "multiword" if "multiword" in sources else "text"
    return EncodedExample(index, *_arrays(enc, word_ids), shared_words=shared, word_source=source)


def _side_positions(enc, k: int) -> list[int]:
    """Positions of the non-special tokens of sentence ``k`` (0 or 1) in an encoding."""
    special = enc["special_tokens_mask"]
    return [t for t, s in enumerate(enc.sequence_ids()) if s == k and not special[t]]


def _kept_from(tok: PreTrainedTokenizerBase, full: list[int], kept: list[int]) -> int:
    """Where the tokens truncation kept start among the whole side's (they are its head, or its tail
    when the tokenizer truncates on the left)."""
    starts = [0, len(full) - len(kept)]
    if getattr(tok, "truncation_side", "right") == "left":
        starts.reverse()
    for first in starts:
        if kept == full[first : first + len(kept)]:
            return first
    raise BertologyError(f"{type(tok).__name__}: the truncated tokens are not a part of the whole text's tokens")


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
    joined = sum(it.word_source == "joined" for it in out.items)
    if joined:
        logger.warning("%d of %d examples have words that are not their text; the joined words were tokenised",
                       joined, len(corpus))
    multiword = sum(it.word_source == "multiword" for it in out.items)
    if multiword:
        logger.info("%d of %d examples have words spelt differently from their text (multi-word tokens)",
                    multiword, len(corpus))
    n_shared = sum(len(it.shared_words) for it in out.items)
    if n_shared:
        logger.info("%d words have no token of their own (they share their surface form's token)", n_shared)
    if not out.items:
        raise BertologyError(f"All {len(corpus)} examples are longer than max_length={max_length}; raise --max-length.")
    return out
