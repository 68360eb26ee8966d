"""Where each head's attention goes: special tokens, punctuation, neighbours, word classes, syntax roles.

Clark et al. (2019, §3) and Kovaleva et al. (2019, §4.4-4.5), per head, for the base and the tuned model.

Definitions (``A`` is one head's ``[T, T]`` map of one example, rows attend; ``Q`` the example's real
tokens, [CLS] and [SEP] included, as queries; keys are the real tokens):

- **Share of attention to a key set** ``C`` (``variant="share"``): ``mean_{q in Q} sum_{k in C} A[q, k]``,
  for ``cls``, ``sep`` (all [SEP]s), ``punct`` (non-special tokens whose string, with a leading ``##``,
  ``▁`` or ``Ġ`` removed, is made only of Unicode ``P*`` characters), ``other_tokens`` (every other real
  key, so cls + sep + punct + other_tokens = 1 for each example) and the word categories below
  (a word receives the sum over its pieces: every piece of a word in ``C`` is a key of ``C``).
- **Positions** (``variant="position"``): ``self`` = ``mean_q A[q, q]``, ``prev`` = ``mean_q A[q, q-1]``
  (0 for the first token), ``next`` = ``mean_q A[q, q+1]`` (0 for the last real token).
- **Entropy** (``variant="entropy"``, unit nats): ``mean_q -sum_k A[q, k] ln A[q, k]``; with
  ``entropy_smoothing="clark2019"`` (a convention) each row is first smoothed to
  ``0.9999 A[q] + 0.0001 / n`` over the ``n`` real keys, as Clark et al. (2019)'s notebook does
  (:func:`bertology.metrics.attention.smoothed_entropy_sums`).
- **Kovaleva's max** (``variant="max"``, targets ``max_<category>``): each target *t* (a [SEP] token, or
  a word with all its pieces) receives ``r(t) = mean_q sum_{k in t} A[q, k]``; the value is
  ``max_t r(t)`` over the targets of the category. For ``sep`` and the word categories.
- **[CLS] in the last layer** (``variant="from_cls"``, targets ``from_cls_<category>``, layer N only):
  ``sum_{k in C} A[cls, k]`` for cls, sep, punct, the word categories, and ``other`` (real keys in none
  of the others).

Word categories come from annotations (CoNLL-U, or :func:`bertology.data.annotate.annotate`; for a
sentence pair, both texts when its annotations cover both, ``Example.n_first_words``, else the first
text only): ``noun`` (UPOS NOUN or PROPN), ``verb``
(VERB), ``pron`` (PRON), ``subject`` (deprel nsubj, nsubj:pass, nsubjpass, csubj, csubj:pass,
csubjpass), ``object`` (obj, dobj, iobj), ``negation`` (the word, lower-cased, in ``negation_words``, or
deprel ``neg``, or UPOS PART and the word is "not"/"n't"). Examples without ``words``, ``upos`` and
``deprels`` contribute nothing to them; with ``word_level=False`` they are not computed.

**Kovaleva et al.'s categories** (``word_categories="kovaleva2019"``, the convention of their notebook):
a category's targets are single word pieces matched by string. The category's words are found per
text of the example: ``noun`` (PTB tag NN, NNS, NNP, NNPS), ``verb`` (VB, VBD, VBG, VBN, VBP, VBZ),
``pron`` (PRP, PRP$) from ``Example.xpos``; ``subject`` (spaCy relations nsubj, nsubjpass, csubj,
csubjpass, agent, expl) and ``object`` (dobj, iobj, dative, attr, oprd), plus UD's spellings of the
same relations (nsubj:pass, csubj:pass, obj) so gold CoNLL-U trees can be read; ``negation``: each of
their 17 items (:data:`KOVALEVA_NEGATION`) that occurs as a substring of either text, case-sensitive.
Each found word is tokenised on its own and every real, non-special token of the example whose
string is one of those pieces is a target (so the "t" of "don't" makes every "t" piece a target).
A target receives ``mean_q A[q, k]`` (one piece, not a word's sum); the ``max_`` value is the max over
the targets, 0 when words were found but none of their pieces is in the tokens. A category *occurs*
in an example when words were found, so ``value`` of ``max_negation`` is their number (they average
over examples with a negation) and ``value_all`` of the other ``max_`` categories is theirs (they
average over every example, 0 where absent). Examples need ``words``, ``xpos`` and ``deprels``.

Every value is averaged over the examples where its category occurs (``n`` counts them; position and
entropy targets occur in every example); ``value_all`` averages over all ``n_examples`` examples,
counting an absent category as 0 (so the token shares sum to 1 in ``value_all``).
"""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.device_state import moved as _moved, to_device, zeros
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.conventions import setting as convention
from bertology.config import CompareConfig
from bertology.data.align import annotated_word_ids
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.metrics.attention import smoothed_entropy_sums
from bertology.results import Result, weights_rows

DEFAULT_NEGATION = (
    "not", "no", "never", "n't", "nor", "neither", "nobody", "nothing", "none", "nowhere", "without", "cannot",
)
TOKEN_TARGETS = ("cls", "sep", "punct", "other_tokens")
POSITION_TARGETS = ("self", "prev", "next")
WORD_TARGETS = ("noun", "verb", "pron", "subject", "object", "negation")
FROM_CLS_CATEGORIES = ("cls", "sep", "punct") + WORD_TARGETS + ("other",)

NOUN_UPOS = frozenset({"NOUN", "PROPN"})
VERB_UPOS = frozenset({"VERB"})
PRON_UPOS = frozenset({"PRON"})
SUBJECT_DEPRELS = frozenset({"nsubj", "nsubj:pass", "nsubjpass", "csubj", "csubj:pass", "csubjpass"})
OBJECT_DEPRELS = frozenset({"obj", "dobj", "iobj"})
#: Row of each category in the key masks built per batch: token targets, word targets, "other".
_KEY_INDEX = {c: i for i, c in enumerate(TOKEN_TARGETS + WORD_TARGETS + ("other",))}
_PIECE_PREFIXES = ("##", "\u2581", "\u0120")  # WordPiece, SentencePiece, byte-level BPE


#: How a row's entropy is taken (``entropy_smoothing`` convention): plain, or Clark et al.'s smoothing.
ENTROPY_SMOOTHING = ("none", "clark2019")
#: The word-category rules (``word_categories`` convention, :mod:`bertology.conventions`).
WORD_CATEGORY_RULES = ("bertology", "kovaleva2019")
#: Kovaleva et al. (2019)'s notebook: the PTB tags (spaCy ``tag_``) of each part-of-speech category.
KOVALEVA_XPOS = {
    "noun": frozenset({"NN", "NNP", "NNPS", "NNS"}),
    "verb": frozenset({"VB", "VBD", "VBG", "VBN", "VBP", "VBZ"}),
    "pron": frozenset({"PRP", "PRP$"}),
}
#: Their spaCy relation labels, plus UD's spellings of the same relations (nsubj:pass, csubj:pass, obj).
KOVALEVA_DEPRELS = {
    "subject": frozenset({"nsubj", "nsubjpass", "csubj", "csubjpass", "agent", "expl", "nsubj:pass", "csubj:pass"}),
    "object": frozenset({"dobj", "iobj", "dative", "attr", "oprd", "obj"}),
}
#: Their "manually curated negations", found as case-sensitive substrings of each text.
KOVALEVA_NEGATION = (
    "neither", "nor", "not", "never", "none", "don't", "won't", "didn't", "hadn't", "haven't", "can't", "isn't",
    "wasn't", "shouldn't", "couldn't", "nothing", "nowhere",
)

#: The punctuation rules (``punctuation`` convention, :mod:`bertology.conventions`).
PUNCTUATION_RULES = ("unicode", "clark2019")
#: Clark et al. (2019)'s code counts attention to these two tokens only.
CLARK_PUNCTUATION = frozenset({".", ","})


def _strip_piece_prefix(token: str) -> str:
    for prefix in _PIECE_PREFIXES:
        if token.startswith(prefix):
            return token[len(prefix):]
    return token


def is_punct_token(token: str, rule: str = "unicode") -> bool:
    """Whether the token (piece prefix removed) is punctuation under ``rule``.

    ``unicode``: non-empty and all Unicode punctuation (P*); ``clark2019``: exactly "." or ",".
    """
    token = _strip_piece_prefix(token)
    if rule == "clark2019":
        return token in CLARK_PUNCTUATION
    return bool(token) and all(unicodedata.category(ch).startswith("P") for ch in token)


class PunctuationLookup:
    """Token id -> "is a punctuation token" (:func:`is_punct_token` under ``rule``), converting each id once.

    A lookup array rather than a dict: a batch's ids are looked up in one vectorised indexing step.
    """

    def __init__(self, tokenizer, rule: str = "unicode"):
        if rule not in PUNCTUATION_RULES:
            raise ValueError(f"punctuation rule must be one of {PUNCTUATION_RULES}, not {rule!r}")
        self.tokenizer, self.rule = tokenizer, rule
        self.known = np.zeros(0, dtype=bool)
        self.punct = np.zeros(0, dtype=bool)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return np.zeros(ids.shape, dtype=bool)
        top = int(ids.max()) + 1
        if top > len(self.known):
            grow = top - len(self.known)
            self.known = np.concatenate([self.known, np.zeros(grow, dtype=bool)])
            self.punct = np.concatenate([self.punct, np.zeros(grow, dtype=bool)])
        missing = np.unique(ids[~self.known[ids]])
        if missing.size:
            tokens = self.tokenizer.convert_ids_to_tokens([int(i) for i in missing])
            self.punct[missing] = [is_punct_token(tok or "", self.rule) for tok in tokens]
            self.known[missing] = True
        return self.punct[ids]


def _norm_word(word: str) -> str:
    return word.lower().replace("\u2019", "'")


def kovaleva_target_words(ex: Example) -> tuple[frozenset[str], ...] | None:
    """Kovaleva et al.'s target words of each :data:`WORD_TARGETS` category in one example.

    None when the example lacks ``words``, ``xpos`` or ``deprels`` (the tags and relations they read).
    """
    if ex.words is None or ex.xpos is None or ex.deprels is None:
        return None
    if not len(ex.words) == len(ex.xpos) == len(ex.deprels):
        raise BertologyError(f"{len(ex.words)} words but {len(ex.xpos)} XPOS tags and {len(ex.deprels)} relations "
                             f"in the example {ex.text[:40]!r}")
    texts = [t for t in (ex.text, ex.text_pair) if t]
    by_tag = [frozenset(w for w, t in zip(ex.words, ex.xpos) if t in KOVALEVA_XPOS[c]) for c in ("noun", "verb", "pron")]
    by_rel = [frozenset(w for w, r in zip(ex.words, ex.deprels) if r in KOVALEVA_DEPRELS[c]) for c in ("subject", "object")]
    negation = frozenset(n for n in KOVALEVA_NEGATION if any(n in t for t in texts))
    return (*by_tag, *by_rel, negation)


@dataclass(frozen=True)
class TargetConventions:
    """The paper conventions attention targets follow (:mod:`bertology.conventions`): which tokens are
    ``punctuation`` (``unicode`` or ``clark2019``), how a row's entropy is taken (``entropy_smoothing``: ``none`` or
    ``clark2019``) and which tokens are a word category's targets (``word_categories``: ``bertology`` or
    ``kovaleva2019``)."""

    punctuation: str = "unicode"
    entropy_smoothing: str = "none"
    word_categories: str = "bertology"


class AttentionTargets(Analysis):
    """Per head: how much attention goes to [CLS], [SEP], punctuation, neighbours and word categories.

    The sums (float64; float32 on MPS, which has no float64) and counts (int64) live where the maps are:
    each batch adds to them on the maps' device and they cross to the host once, in ``compute``. The key masks
    are built on the host from the items (:meth:`PairBatch.host_tokens`) and sent to the device, so nothing is
    copied back per batch.
    """

    name = "attention_targets"
    requires = frozenset({"attentions"})

    def __init__(
        self,
        corpus: Corpus,
        tokenizer,
        num_layers: int,
        num_heads: int,
        negation_words: Iterable[str] = DEFAULT_NEGATION,
        word_level: bool = True,
        conventions: TargetConventions = TargetConventions(),
    ):
        punctuation, entropy_smoothing = conventions.punctuation, conventions.entropy_smoothing
        word_categories = conventions.word_categories
        if entropy_smoothing not in ENTROPY_SMOOTHING:
            raise ValueError(f"entropy_smoothing must be one of {ENTROPY_SMOOTHING}, not {entropy_smoothing!r}")
        if word_categories not in WORD_CATEGORY_RULES:
            raise ValueError(f"word_categories must be one of {WORD_CATEGORY_RULES}, not {word_categories!r}")
        self.corpus, self.tokenizer = corpus, tokenizer
        self.punctuation, self.entropy_smoothing = punctuation, entropy_smoothing
        self.word_categories = word_categories
        self.num_layers, self.num_heads = num_layers, num_heads
        self.negation_words = frozenset(_norm_word(w) for w in negation_words)
        self.word_level = bool(word_level)
        self.cls_id = getattr(tokenizer, "cls_token_id", None)
        self.sep_id = getattr(tokenizer, "sep_token_id", None)
        words = WORD_TARGETS if self.word_level else ()
        self.targets: tuple[str, ...] = (
            TOKEN_TARGETS + POSITION_TARGETS + ("entropy",) + words
            + tuple(f"max_{c}" for c in ("sep",) + words)
            + tuple(f"from_cls_{c}" for c in FROM_CLS_CATEGORIES if c not in WORD_TARGETS or self.word_level)
        )
        self._index = {t: i for i, t in enumerate(self.targets)}
        self.sums = zeros((2, num_layers, num_heads, len(self.targets)), torch.float64)
        self.counts = zeros((len(self.targets),), torch.int64)
        self.n_examples = 0
        self.n_annotated = 0
        self._is_punct = PunctuationLookup(tokenizer, punctuation)
        self._word_cache: dict[int, np.ndarray | None] = {}
        self._category_memo: dict[tuple[str, str, str], tuple[bool, ...]] = {}
        self._kovaleva_cache: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        self._pieces_memo: dict[str, tuple[str, ...]] = {}

    def params(self) -> dict:
        kovaleva = self.word_categories == "kovaleva2019"
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "negation_words": list(KOVALEVA_NEGATION) if kovaleva else sorted(self.negation_words),
            "word_level": self.word_level,
            "punctuation": self.punctuation,
            "word_categories": self.word_categories,
            "queries": "all real tokens, [CLS]/[SEP] included",
            "word_target": "sum over the word's pieces (both texts of a pair when both are annotated)",
            "average": "over examples where the target occurs (value); over all examples (value_all)",
            "entropy_unit": "nats",
            "entropy_smoothing": self.entropy_smoothing,
        }

    # -- per-example annotations -------------------------------------------------------------------

    def _categories_of(self, word: str, pos: str, rel: str) -> tuple[bool, ...]:
        """One word's membership in :data:`WORD_TARGETS`."""
        w, rel = _norm_word(word), rel.lower()
        return (
            pos in NOUN_UPOS,
            pos in VERB_UPOS,
            pos in PRON_UPOS,
            rel in SUBJECT_DEPRELS,
            rel in OBJECT_DEPRELS,
            w in self.negation_words or rel == "neg" or (pos == "PART" and w in ("not", "n't")),
        )

    def _word_categories(self, index: int) -> np.ndarray | None:
        """``[n_words, len(WORD_TARGETS)]`` bool for an annotated example, else None."""
        if index in self._word_cache:
            return self._word_cache[index]
        ex = self.corpus[index]
        cats = None
        if ex.words is not None and ex.upos is not None and ex.deprels is not None:
            n = len(ex.words)
            if len(ex.upos) != n or len(ex.deprels) != n:
                raise BertologyError(
                    f"example {index}: {n} words but {len(ex.upos)} UPOS tags and {len(ex.deprels)} relations"
                )
            memo = self._category_memo
            rows = []
            for key in zip(ex.words, ex.upos, ex.deprels):
                row = memo.get(key)
                if row is None:
                    row = memo[key] = self._categories_of(*key)
                rows.append(row)
            cats = np.array(rows, dtype=bool).reshape(n, len(WORD_TARGETS))
        self._word_cache[index] = cats
        return cats

    def _kovaleva_keys(self, item) -> tuple[np.ndarray, np.ndarray] | None:
        """Kovaleva's targets in one encoded example: ``[n_word_targets, T]`` bool keys and which categories were found."""
        if item.index in self._kovaleva_cache:
            return self._kovaleva_cache[item.index]
        found = kovaleva_target_words(self.corpus[item.index])
        out = None
        if found is not None:
            tokens = np.array(self.tokenizer.convert_ids_to_tokens([int(i) for i in item.input_ids]), dtype=object)
            keys = np.zeros((len(WORD_TARGETS), len(item)), dtype=bool)
            for c, words in enumerate(found):
                pieces = set()
                for w in words:
                    if w not in self._pieces_memo:
                        self._pieces_memo[w] = tuple(self.tokenizer.tokenize(w))
                    pieces.update(self._pieces_memo[w])
                keys[c] = ~item.special & np.isin(tokens, list(pieces))
            out = keys, np.array([bool(w) for w in found])
        self._kovaleva_cache[item.index] = out
        return out

    def _batch_masks(self, batch: PairBatch):
        """Key masks ``[B, C, T]`` (C = TOKEN_TARGETS, WORD_TARGETS, other), presence ``[B, C]``, word map."""
        B, T = batch.mask.shape
        ids, mask, content = batch.host_tokens()  # from the items: no copy of a GPU batch
        special = mask & ~content
        is_cls = mask & (ids == self.cls_id) if self.cls_id is not None else np.zeros_like(mask)
        is_sep = mask & (ids == self.sep_id) if self.sep_id is not None else np.zeros_like(mask)
        punct = mask & ~special & self._is_punct(ids)
        other_tokens = mask & ~is_cls & ~is_sep & ~punct
        n_words = len(WORD_TARGETS)
        word_keys = np.zeros((B, n_words, T), dtype=bool)
        annotated = np.zeros(B, dtype=bool)
        piece_word = np.full((B, T), -1, dtype=np.int64)  # annotated word of each piece
        n_w = 1
        kovaleva = self.word_level and self.word_categories == "kovaleva2019"
        found = np.zeros((B, n_words), dtype=bool)  # kovaleva2019: which categories' words were found
        if kovaleva:
            for b, item in enumerate(batch.items):
                got = self._kovaleva_keys(item)
                if got is not None:
                    annotated[b] = True
                    word_keys[b, :, : len(item)], found[b] = got
        elif self.word_level:
            for b, item in enumerate(batch.items):
                cats = self._word_categories(item.index)
                if cats is None:
                    continue
                annotated[b] = True
                k = len(item)
                wid = annotated_word_ids(item.word_ids, item.segment, self.corpus[item.index].n_first_words)
                if wid.size and wid.max() >= len(cats):
                    raise BertologyError(
                        f"example {item.index}: tokens refer to word {wid.max()} but the example has {len(cats)} "
                        "annotated words; encode the same corpus that the analysis was given"
                    )
                piece_word[b, :k] = wid
                has = wid >= 0
                word_keys[b, :, :k][:, has] = cats[wid[has]].T
                n_w = max(n_w, len(cats))
        other = other_tokens & ~word_keys.any(1)
        keys = np.concatenate([np.stack([is_cls, is_sep, punct, other_tokens], 1), word_keys, other[:, None]], 1)
        present = keys.any(-1)
        if self.word_level:  # word categories (and "other", which excludes them) need annotations
            present[:, len(TOKEN_TARGETS):] &= annotated[:, None]
        if kovaleva:  # a category occurs where its words were found, even if none of their pieces is a token
            present[:, len(TOKEN_TARGETS) : len(TOKEN_TARGETS) + n_words] = found
        return keys, present, piece_word, n_w, is_cls, annotated

    # -- streaming ---------------------------------------------------------------------------------

    def _to(self, device: torch.device) -> None:
        """Move the accumulators to ``device`` (the first batch's, or a shard's when merging into an empty one)."""
        self.sums = to_device(self.sums, device, torch.float64)
        self.counts = to_device(self.counts, device, torch.int64)

    def update(self, batch: PairBatch) -> None:
        self._to(batch.mask.device)
        keys_np, present_np, piece_word, n_w, is_cls_np, annotated = self._batch_masks(batch)
        dev = batch.mask.device
        B, T = batch.mask.shape
        dt = torch.float64
        real = batch.mask.to(dt)  # [B, T]
        nq = real.sum(-1)  # [B]
        keys = transfer.send(keys_np, dev).to(dt)  # [B, C, T]
        present = transfer.send(present_np, dev)
        n_tok, n_word = len(TOKEN_TARGETS), len(WORD_TARGETS)
        is_sep = transfer.send(keys_np[:, 1], dev)
        # word one-hot of first-text pieces [B, T, W] and the category of each word [B, n_word, W]
        # (a scatter, not a boolean index: no device sync; a piece of no word writes its 0 to word 0's column)
        pw = transfer.send(piece_word, dev)
        onehot = torch.zeros(B, T, n_w, dtype=dt, device=dev).scatter_(2, pw.clamp_min(0)[..., None],
                                                                      (pw >= 0)[..., None].to(dt))
        kovaleva = self.word_categories == "kovaleva2019"
        word_cat = transfer.send(self._batch_word_categories(batch, annotated, n_w), dev)
        has_cls = transfer.send(is_cls_np.any(-1), dev)
        cls_pos = transfer.send(is_cls_np.argmax(-1), dev)
        idx = self._index
        word_level = self.word_level
        w0, m0 = idx.get(WORD_TARGETS[0]), idx.get(f"max_{WORD_TARGETS[0]}")  # None without word level
        L, H = self.num_layers, self.num_heads
        neg_inf = float("-inf")  # a Python scalar: a tensor made from it on the device would be a host copy
        cats = ("cls", "sep", "punct") + (WORD_TARGETS if word_level else ()) + ("other",)
        pres = self._presence(present, has_cls, cats)
        nq_ = nq[:, None]  # [B, 1]
        # Padding keys hold exactly zero attention (masked softmax). Everything after the per-layer read works on
        # small per-head vectors and runs once for all models and layers (stacked on a leading axis
        # S = 2 L): a dozen small ops per batch instead of per layer.
        rec, ent, diag = self._layer_sums(batch)
        S = 2 * L
        col = torch.stack(rec).to(dt) / nq_[..., None]  # [S, B, H, T]: mean attention received
        share = torch.einsum("sbht,bct->sbhc", col, keys)  # [S, B, H, C]
        out = torch.zeros(S, B, H, len(self.targets), dtype=dt, device=dev)
        out[..., :n_tok] = share[..., :n_tok]
        d = torch.stack(diag).to(dt) / nq_[..., None]  # [S, B, H, 3]
        out[..., idx["prev"]], out[..., idx["self"]], out[..., idx["next"]] = d.unbind(-1)
        out[..., idx["entropy"]] = torch.stack(ent).to(dt) / nq_
        out[..., idx["max_sep"]] = torch.where(is_sep[:, None, :], col, neg_inf).amax(-1)
        if word_level:
            out[..., w0 : w0 + n_word] = share[..., n_tok : n_tok + n_word]
            if kovaleva:  # each piece is a target; no piece of the found words in the text: 0, as in their code
                pieces = keys[:, n_tok : n_tok + n_word].bool()  # [B, n_word, T]
                mx = torch.where(pieces[None, :, None], col[..., None, :], neg_inf).amax(-1)  # [S, B, H, n_word]
                mx = torch.where(torch.isinf(mx), torch.zeros((), dtype=dt, device=dev), mx)
            else:
                col_w = torch.einsum("sbht,btw->sbhw", col, onehot)  # attention each word receives
                mx = torch.where(word_cat[:, None], col_w[..., None, :], neg_inf).amax(-1)  # [S, B, H, n_word]
            out[..., m0 : m0 + n_word] = mx
        for m, cap in enumerate((batch.base, batch.tuned)):  # the [CLS] row of the last layer
            row = cap.attentions[L][torch.arange(B, device=dev), :, cls_pos, :].to(dt)  # [B, H, T]
            from_cls = torch.einsum("bht,bct->bhc", row, keys)
            for c in cats:
                out[m * L + L - 1, ..., idx[f"from_cls_{c}"]] = from_cls[..., _KEY_INDEX[c]]
        out = torch.where(pres[:, None, :], out, torch.zeros((), dtype=dt, device=dev))
        self.sums += _moved(out.sum(1).reshape(2, L, H, len(self.targets)), self.sums)
        self.counts += pres.sum(0)
        self.n_examples += batch.size
        self.n_annotated += int(annotated.sum())

    def _batch_word_categories(self, batch: PairBatch, annotated: np.ndarray, n_w: int) -> np.ndarray:
        """``[B, n_word, W]``: which word category (noun, verb, ...) each first-text word of an annotated example
        has (all False under Kovaleva's word lists, which are matched piece by piece instead)."""
        word_cat = np.zeros((batch.size, len(WORD_TARGETS), n_w), dtype=bool)
        if self.word_level and self.word_categories != "kovaleva2019":
            for b, item in enumerate(batch.items):
                if annotated[b]:
                    cats = self._word_categories(item.index)
                    word_cat[b, :, : len(cats)] = cats.T
        return word_cat

    def _presence(self, present: torch.Tensor, has_cls: torch.Tensor, cats: tuple[str, ...]) -> torch.Tensor:
        """``[B, targets]``: which targets each example has; the same for every model, layer and head."""
        idx, n_tok, n_word = self._index, len(TOKEN_TARGETS), len(WORD_TARGETS)
        pres = torch.zeros(present.shape[0], len(self.targets), dtype=torch.bool, device=present.device)
        pres[:, :n_tok] = present[:, :n_tok]
        for t in POSITION_TARGETS + ("entropy",):
            pres[:, idx[t]] = True
        pres[:, idx["max_sep"]] = present[:, 1]
        if self.word_level:
            w0, m0 = idx[WORD_TARGETS[0]], idx[f"max_{WORD_TARGETS[0]}"]
            pres[:, w0 : w0 + n_word] = present[:, n_tok : n_tok + n_word]
            pres[:, m0 : m0 + n_word] = present[:, n_tok : n_tok + n_word]
        for c in cats:
            pres[:, idx[f"from_cls_{c}"]] = present[:, _KEY_INDEX[c]] & has_cls
        return pres

    def _layer_sums(self, batch: PairBatch) -> tuple[list, list, list]:
        """Per model and layer (base's layers first): the attention each key received, the row entropies and the
        prev/self/next diagonals summed over the real rows. The maps are read once per layer for all analyses
        (``batch.layer_stats``), and once more only for Clark et al.'s smoothed entropy."""
        rec, ent, diag = [], [], []
        for m, cap in enumerate((batch.base, batch.tuned)):
            for layer in range(1, self.num_layers + 1):
                rec.append(batch.received(m, layer))
                stats = batch.layer_stats(layer)
                if self.entropy_smoothing == "clark2019":  # one more pass over the maps, only when asked
                    ent.append(smoothed_entropy_sums(cap.attentions[layer], batch.mask))
                else:
                    ent.append(stats.entropy_sum[m])  # [B, H]: over real rows
                diag.append(stats.diagonal_sums[m])  # [B, H, 3]: prev, self, next over real rows
        return rec, ent, diag

    def merge(self, other: "AttentionTargets") -> "AttentionTargets":
        self._check_mergeable(other)
        if other.n_examples:
            if not self.n_examples:
                self._to(other.sums.device)
            with torch.inference_mode(False):
                self.sums += _moved(other.sums, self.sums)
                self.counts += _moved(other.counts, self.counts)
        self.n_examples += other.n_examples
        self.n_annotated += other.n_annotated
        return self

    def compute(self) -> Result:
        if self.n_examples == 0:
            raise ValueError("attention_targets saw no examples")
        rows = []
        L, H = self.num_layers, self.num_heads
        sums = self.sums.cpu().numpy().astype(np.float64)  # the one copy to the host
        counts = self.counts.cpu().numpy()
        layers, heads = np.meshgrid(np.arange(1, L + 1), np.arange(H), indexing="ij")
        skipped = [t for t, c in zip(self.targets, counts) if c == 0]
        for ti, target in enumerate(self.targets):
            n = int(counts[ti])
            if n == 0:
                continue
            if target.startswith("from_cls_"):
                variant, layer_sel = "from_cls", slice(L - 1, L)
            else:
                layer_sel = slice(0, L)
                variant = ("max" if target.startswith("max_") else "position" if target in POSITION_TARGETS
                           else "entropy" if target == "entropy" else "share")
            for m, model in enumerate(("base", "tuned")):
                s = sums[m, layer_sel, :, ti]
                rows.append(
                    pd.DataFrame(
                        {
                            "model": model,
                            "layer": layers[layer_sel].ravel(),
                            "head": heads[layer_sel].ravel(),
                            "target": target,
                            "value": (s / n).ravel(),
                            "n": n,
                            "value_all": (s / self.n_examples).ravel(),
                            "n_examples": self.n_examples,
                            "variant": variant,
                            "unit": "nats" if target == "entropy" else "attention",
                        }
                    )
                )
        table = pd.concat(rows, ignore_index=True)
        params = dict(self.params())
        params.update(n_examples=self.n_examples, n_annotated=self.n_annotated, targets_without_examples=skipped)
        if self.word_level and self.n_annotated == 0:
            params["word_level_note"] = "no example had words/upos/deprels: word categories skipped (run data.annotate)"
        return Result(self.name, table, params)


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """Last-layer attention to [CLS], [SEP] and punctuation, base -> tuned."""
    t = weights_rows(tables["attention_targets"])
    last = t[(t["layer"] == t["layer"].max()) & t["target"].isin(["cls", "sep", "punct"])]
    means = last.groupby(["model", "target"])["value"].mean()
    return "last-layer attention to [CLS] / [SEP] / punctuation, base vs tuned: " + " ".join(
        f"{tgt} {means.get(('base', tgt), float('nan')):.2f}->{means.get(('tuned', tgt), float('nan')):.2f}"
        for tgt in ("cls", "sep", "punct"))


def _build(config: CompareConfig, ctx: BuildContext) -> AttentionTargets:
    return AttentionTargets(ctx.corpus, ctx.tokenizer, ctx.num_layers, ctx.num_heads, conventions=TargetConventions(
        config.punctuation, config.entropy_smoothing, config.word_categories))


SETTINGS = (
    convention("punctuation", paper="Clark et al. 2019"),
    convention("word_categories", paper="Kovaleva et al. 2019"),
    convention("entropy_smoothing", paper="Clark et al. 2019"),
)

SPEC = AnalysisSpec("attention_targets", _build, ("attention_targets",), needs=frozenset({"pos_tags"}), summary=summary,
                    settings=SETTINGS, per_measure=True)
