"""The structural probes' data: gold trees per split (:class:`TreeSet`), spaCy parses for plain text, the
dev split, which sentences every model can encode, and the random-init control model.

Part of :mod:`bertology.experiments.probe` (which re-exports these names); see its docstring for the method.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.metrics.trees import check_heads, tree_depths, tree_distances
from bertology.experiments.probe_features import _unpack

logger = logging.getLogger(__name__)

#: The punctuation rules of UUAS and root accuracy (``probe_punctuation`` convention, :mod:`bertology.conventions`).
PUNCTUATION_RULES = ("upos", "hewitt2019")
#: The XPOS tags Hewitt & Manning's reporter.py leaves out of UUAS and root accuracy (prims_matrix_to_edges,
#: get_nopunct_argmin); HYPH, NFP, SYM, $ and # words stay in.
HEWITT_PUNCT_XPOS = ("''", ",", ".", ":", "``", "-LRB-", "-RRB-")


# --------------------------------------------------------------------------------------------------
# gold trees


class WordSentences:
    """What every probe's split shares: sentences of ``words`` (and their ``texts`` where known) on one word axis.

    A dataclass subclass gives ``words``, ``texts`` and ``name``; the feature pass reads ``offsets``, ``n_words``
    and :meth:`corpus`."""

    words: list[tuple[str, ...]]
    texts: list[str] | None
    name: str

    def __len__(self) -> int:
        return len(self.words)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(w) for w in self.words], dtype=np.int64)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @property
    def n_words(self) -> int:
        return int(self.lengths.sum())

    def sentences_key(self) -> str:
        """SHA-256 of what the encoders read (each sentence's text and words): two splits with the same key have the
        same word features, whatever their labels or trees."""
        texts = self.texts or [" ".join(w) for w in self.words]
        d = hashlib.sha256()
        for t, w in zip(texts, self.words):
            d.update(json.dumps([t, list(w)]).encode())
        return d.hexdigest()

    def corpus(self) -> Corpus:
        """The sentences with their words (what the encoders read): the text as written where known, so the
        model sees the sentence's own tokens ("don't", not "do n't"); the words are located in it."""
        texts = self.texts or [" ".join(w) for w in self.words]
        return Corpus([Example(text=t, words=w) for t, w in zip(texts, self.words)], name=self.name)


@dataclass
class TreeSet(WordSentences):
    """One split's sentences with gold trees: words, heads, punctuation mask, distances, depths."""

    words: list[tuple[str, ...]]
    heads: list[np.ndarray]
    keep: list[np.ndarray]  # True for words scored by UUAS / root accuracy (not punctuation)
    distances: list[np.ndarray]
    depths: list[np.ndarray]
    name: str = "split"
    stats: dict = field(default_factory=dict)
    texts: list[str] | None = None  # each sentence as written (CoNLL-U "# text"), where known

    def subset(self, idx: Sequence[int]) -> "TreeSet":
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return TreeSet(pick(self.words), pick(self.heads), pick(self.keep), pick(self.distances),
                       pick(self.depths), self.name, dict(self.stats), None if self.texts is None else pick(self.texts))

    def fingerprint(self) -> str:
        d = hashlib.sha256()
        for w, h, k in zip(self.words, self.heads, self.keep):
            d.update(json.dumps([list(w), h.tolist(), k.tolist()]).encode())
        return d.hexdigest()


def ensure_trees(corpus: Corpus, *, spacy_model: str | None = None, nlp=None) -> Corpus:
    """The corpus with gold trees: CoNLL-U trees as they are; plain text parsed with spaCy.

    A CoNLL-U file whose HEAD column is empty cannot be probed (refused with a clear message);
    sentence pairs are refused (probes read single sentences).
    """
    if len(corpus) == 0:
        raise BertologyError(f"The corpus {corpus.name!r} ({corpus.source}) has no examples.")
    if corpus.has_pairs:
        raise BertologyError(f"{corpus.source}: structural probes read single sentences, not sentence pairs.")
    if corpus.has_trees:
        return corpus
    if corpus.stats.get("format") == "conllu" or any(ex.words is not None and ex.heads is None for ex in corpus):
        n = sum(ex.heads is None for ex in corpus)
        raise BertologyError(
            f"{corpus.source}: {n} of {len(corpus)} sentences have no dependency heads (HEAD column '_'); "
            "structural probes need gold trees. Use a parsed CoNLL-U file or plain text (parsed with spaCy)."
        )
    from bertology.data.annotate import annotate

    return annotate(corpus, nlp_name=spacy_model, nlp=nlp)


def tree_set(corpus: Corpus, *, punct_upos: Sequence[str] = ("PUNCT",), name: str | None = None,
             punctuation: str = "upos") -> TreeSet:
    """Gold trees of a corpus (see :func:`ensure_trees`); sentences that are not one tree are dropped and counted.

    ``punctuation`` says which words UUAS and root accuracy leave out: ``upos`` (UPOS in ``punct_upos``)
    or ``hewitt2019`` (XPOS in :data:`HEWITT_PUNCT_XPOS`); a sentence without those tags keeps every word.
    """
    words, heads, keep, dist, depth, texts = [], [], [], [], [], []
    n_not_tree = n_no_upos = 0
    hewitt = punctuation == "hewitt2019"
    punct = set(HEWITT_PUNCT_XPOS if hewitt else punct_upos)
    for ex in corpus:
        if ex.heads is None or ex.words is None:
            raise BertologyError(f"{corpus.source}: an example has no words/heads; run ensure_trees first.")
        try:
            h = check_heads(ex.heads)
        except ValueError:
            n_not_tree += 1
            continue
        words.append(tuple(ex.words))
        texts.append(ex.text)
        heads.append(h)
        tags = ex.xpos if hewitt else ex.upos
        if tags is None:
            n_no_upos += 1
            keep.append(np.ones(len(h), dtype=bool))
        else:
            keep.append(np.array([u not in punct for u in tags], dtype=bool))
        dist.append(tree_distances(h))
        depth.append(tree_depths(h))
    stats = {"n_input": len(corpus), "n_not_single_tree": n_not_tree,
             ("n_without_xpos" if hewitt else "n_without_upos"): n_no_upos}
    if n_no_upos and hewitt:
        logger.warning("%s: %d sentence(s) have no %s tags; their punctuation is scored", corpus.name, n_no_upos,
                       "XPOS" if hewitt else "UPOS")
    if n_not_tree:
        logger.warning("%s: %d sentence(s) are not a single tree (e.g. several roots) and were dropped",
                       corpus.name, n_not_tree)
    return TreeSet(words, heads, keep, dist, depth, name or corpus.name, stats, texts)


def split_dev(train: TreeSet, fraction: float, seed: int) -> tuple[TreeSet, TreeSet]:
    """A seeded random ``fraction`` of ``train`` as dev (both kept in corpus order)."""
    n = len(train)
    k = max(1, int(round(fraction * n)))
    if n - k < 1:
        raise BertologyError(f"The training set has {n} sentence(s); too few to hold out a dev split.")
    perm = np.random.default_rng(seed).permutation(n)
    dev_idx, train_idx = sorted(perm[:k].tolist()), sorted(perm[k:].tolist())
    tr, dv = train.subset(train_idx), train.subset(dev_idx)
    tr.name, dv.name = "train", "dev"
    tr.stats = {**train.stats, "held_out_as_dev": k}
    dv.stats = {"from_train": True, "fraction": fraction, "seed": seed, "n": k}
    return tr, dv


# --------------------------------------------------------------------------------------------------
# models and features


def _probe_seed(seed: int, key: tuple[str, int, str]) -> int:
    digest = hashlib.sha256(json.dumps([seed, *key]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def random_init_model(loaded, seed: int = 0):
    """The random-init control: a bare encoder of the same config with seeded random weights.

    Uses ``loaded``'s tokenizer; returns a :class:`~bertology.models.loading.LoadedModel` named ``random``.
    """
    from transformers import AutoModel

    from bertology.models.loading import LoadedModel

    encoder, tok, _ = _unpack(loaded)
    cfg = encoder.config.__class__.from_dict(encoder.config.to_dict())
    cfg._attn_implementation = "eager"
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(_probe_seed(seed, ("random-init", 0, "control")))
        model = AutoModel.from_config(cfg, attn_implementation="eager")
    finally:
        torch.random.set_rng_state(state)
    model.to(next(encoder.parameters()).dtype).eval()  # the control runs in the dtype of the model it controls
    path = getattr(loaded, "path", None) or "(in memory)"
    return LoadedModel(model=model, tokenizer=tok, name="random", source="random-init", path=str(path),
                       is_classifier=False, weights_sha256=None, extra={"seed": seed, "config_of": path})


def _aligned(word_ids: np.ndarray, n_words: int) -> bool:
    ids = word_ids[word_ids >= 0]
    return n_words > 0 and np.array_equal(np.unique(ids), np.arange(n_words))


def position_limit(max_length: int, encoders: Sequence[torch.nn.Module]) -> int:
    """``max_length`` or, when lower, the longest input every encoder's position encoding takes
    (its family adapter's ``max_tokens``: RoBERTa reserves the rows up to its pad id)."""
    from bertology.models.adapters import adapter_for

    limits = [adapter_for(enc.config).max_tokens(enc.config) for enc in encoders]
    return min([max_length, *(int(n) for n in limits if n)])


def distinct_tokenizers(unpacked: Mapping[str, tuple]) -> list:
    """The tokenizers of ``(encoder, tokenizer, description)`` triples, each once (models may share one)."""
    toks: list = []
    for _, tok, _ in unpacked.values():
        if all(tok is not t for t in toks):
            toks.append(tok)
    return toks


def encodable(trees: TreeSet, tokenizers: Sequence, max_length: int) -> tuple[TreeSet, dict]:
    """Drop sentences longer than ``max_length`` tokens or with a word no tokenizer piece covers (counted).

    The limit is ``max_length`` or, when lower, a tokenizer's ``model_max_length`` (which loading sets
    from the model's position encoding): a longer sentence would index past the position table.
    """
    from bertology.data.encode import encode_example

    limits = [int(m) for m in (getattr(t, "model_max_length", None) for t in tokenizers) if m]
    max_length = min([max_length, *limits])
    keep, n_long, n_unaligned = [], 0, 0
    corpus = trees.corpus()
    for i, ex in enumerate(corpus):
        ok = True
        for tok in tokenizers:
            item = encode_example(tok, ex, i)
            if len(item) > max_length:
                n_long += 1
                ok = False
                break
            if not _aligned(item.word_ids, len(ex.words)):
                n_unaligned += 1
                ok = False
                break
        if ok:
            keep.append(i)
    out = trees.subset(keep) if len(keep) < len(trees) else trees
    info = {"max_length": max_length, "n_over_max_length": n_long, "n_unaligned_words": n_unaligned}
    out.stats = {**trees.stats, **info, "n_used": len(out)}
    if n_long or n_unaligned:
        logger.warning("%s: dropped %d sentence(s) longer than %d tokens and %d with words no sub-word covers",
                       trees.name, n_long, max_length, n_unaligned)
    if len(out) == 0:
        raise BertologyError(f"No usable sentence left in the {trees.name} split ({info}).")
    return out, info
