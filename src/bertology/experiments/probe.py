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

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from bertology.config import CompareConfig
from bertology.conventions import choose
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.experiments.probe_features import (  # the word-feature store; re-exported for callers of this module
    FEATURE_DTYPES,
    _cached_features,
    _unpack,
    extract_word_features,
)
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.conventions import setting as convention
from bertology.settings import Setting
from bertology.metrics.trees import check_heads, score_depths, score_distances, tree_depths, tree_distances
from bertology.progress import stage_bars
from bertology.results import atomic_write

if TYPE_CHECKING:
    from bertology.results import Result

logger = logging.getLogger(__name__)

TABLE = "probe"
#: The punctuation rules of UUAS and root accuracy (``probe_punctuation`` convention, :mod:`bertology.conventions`).
PUNCTUATION_RULES = ("upos", "hewitt2019")
#: The XPOS tags Hewitt & Manning's reporter.py leaves out of UUAS and root accuracy (prims_matrix_to_edges,
#: get_nopunct_argmin); HYPH, NFP, SYM, $ and # words stay in.
HEWITT_PUNCT_XPOS = ("''", ",", ".", ":", "``", "-LRB-", "-RRB-")
KINDS = ("distance", "depth")
COLUMNS = ["model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr", "loss", "n_sentences",
           "rank", "epochs", "best_epoch", "best_dev_loss"]

ProgressFn = Callable[[str, int, int], None]


@dataclass
class ProbeSettings:
    """Every choice that changes the probe numbers (recorded in the manifest)."""

    rank: int | None = 128  # None: full rank (the hidden size); capped at the hidden size
    layers: tuple[int, ...] | None = None  # None: every layer 0..N (0 = embedding output)
    probes: tuple[str, ...] = KINDS
    epochs: int = 30  # at most; each probe stops early on its own
    batch_size: int = 20  # sentences per training step (Hewitt & Manning: 20)
    extract_batch_size: int = 32  # sentences per forward pass
    lr: float = 1e-3
    lr_factor: float = 0.1  # learning rate multiplied by this when the dev loss does not improve
    lr_patience: int = 0  # epochs without improvement before the learning rate drops
    patience: int = 5  # stop a probe after this many epochs without a dev-loss improvement
    min_delta: float = 1e-4  # an improvement must beat the best dev loss by this much
    dev_fraction: float = 0.1  # share of train held out as dev when no dev set is given
    seed: int = 0
    device: str = "cpu"
    max_length: int = 512  # longer sentences (in tokens, [CLS]/[SEP] included) are skipped and counted
    punct_upos: tuple[str, ...] = ("PUNCT",)  # left out of UUAS and root accuracy
    punctuation: str = "upos"  # upos: punct_upos; hewitt2019: XPOS in HEWITT_PUNCT_XPOS (the probe_punctuation convention)
    init_scale: float = 0.05  # initial weights ~ U(-init_scale, init_scale), as Hewitt & Manning
    feature_dtype: str = "float32"  # how word features are held (FEATURE_DTYPES); probes train in float32 either way

    def __post_init__(self) -> None:
        self.probes = tuple(self.probes)
        bad = [k for k in self.probes if k not in KINDS]
        if bad or not self.probes:
            raise BertologyError(f"Unknown probe kind(s) {bad or '(none)'}; choose from {', '.join(KINDS)}.")
        if self.rank is not None and self.rank < 1:
            raise BertologyError(f"rank must be at least 1, not {self.rank}.")
        for name in ("epochs", "batch_size", "extract_batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise BertologyError(f"{name} must be at least 1, not {getattr(self, name)}.")
        if self.patience < 1 or self.lr_patience < 0:
            raise BertologyError("patience must be >= 1 and lr_patience >= 0.")
        if self.punctuation not in PUNCTUATION_RULES:
            raise BertologyError(f"Unknown probe punctuation {self.punctuation!r}; choose from: {', '.join(PUNCTUATION_RULES)}.")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise BertologyError(f"Unknown feature dtype {self.feature_dtype!r}; choose from: {', '.join(FEATURE_DTYPES)}.")
        if not 0 < self.dev_fraction < 1:
            raise BertologyError(f"dev_fraction must be in (0, 1), not {self.dev_fraction}.")
        if self.layers is not None:
            self.layers = tuple(sorted({int(x) for x in self.layers}))

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------------
# gold trees


@dataclass
class TreeSet:
    """One split's sentences with gold trees: words, heads, punctuation mask, distances, depths."""

    words: list[tuple[str, ...]]
    heads: list[np.ndarray]
    keep: list[np.ndarray]  # True for words scored by UUAS / root accuracy (not punctuation)
    distances: list[np.ndarray]
    depths: list[np.ndarray]
    name: str = "split"
    stats: dict = field(default_factory=dict)
    texts: list[str] | None = None  # each sentence as written (CoNLL-U "# text"), where known

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

    def subset(self, idx: Sequence[int]) -> "TreeSet":
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return TreeSet(pick(self.words), pick(self.heads), pick(self.keep), pick(self.distances),
                       pick(self.depths), self.name, dict(self.stats), None if self.texts is None else pick(self.texts))

    def corpus(self) -> Corpus:
        """The sentences with their words (what the encoders read): the text as written where known, so the
        model sees the sentence's own tokens ("don't", not "do n't"); the words are located in it."""
        texts = self.texts or [" ".join(w) for w in self.words]
        return Corpus([Example(text=t, words=w) for t, w in zip(texts, self.words)], name=self.name)

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


def _model_fingerprint(encoder: torch.nn.Module, desc: dict) -> str:
    """The weights' identity for the feature cache; a model run in bfloat16/float16 has other features."""
    dtype = next(encoder.parameters()).dtype
    suffix = "" if dtype == torch.float32 else f":{str(dtype).removeprefix('torch.')}"
    if desc.get("weights_sha256"):
        return str(desc["weights_sha256"]) + suffix
    d = hashlib.sha256()
    for name, p in sorted(encoder.state_dict().items()):
        d.update(name.encode())
        d.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype
    return d.hexdigest() + suffix


def _aligned(word_ids: np.ndarray, n_words: int) -> bool:
    ids = word_ids[word_ids >= 0]
    return n_words > 0 and np.array_equal(np.unique(ids), np.arange(n_words))


def position_limit(max_length: int, encoders: Sequence[torch.nn.Module]) -> int:
    """``max_length`` or, when lower, the longest input every encoder's position encoding takes
    (its family adapter's ``max_tokens``: RoBERTa reserves the rows up to its pad id)."""
    from bertology.models.adapters import adapter_for

    limits = [adapter_for(enc.config).max_tokens(enc.config) for enc in encoders]
    return min([max_length, *(int(n) for n in limits if n)])


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


# --------------------------------------------------------------------------------------------------
# training all probes in one pass


@dataclass
class ProbeStack:
    """Trained probes: one row of ``weights`` per (model, layer, kind) in ``keys``."""

    keys: list[tuple[str, int, str]]  # (model, layer number, kind)
    weights: torch.Tensor  # [P, rank, hidden], each probe's best-dev weights
    best_dev_loss: np.ndarray
    best_epoch: np.ndarray  # 1-based epoch of the best dev loss (0: never improved on the initial weights)
    epochs: np.ndarray  # epochs each probe trained
    history: list[list[float]]  # dev loss per epoch, per probe
    seconds: dict = field(default_factory=dict)


def _probe_seed(seed: int, key: tuple[str, int, str]) -> int:
    digest = hashlib.sha256(json.dumps([seed, *key]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_probe(key: tuple[str, int, str], rank: int, hidden: int, seed: int, scale: float = 0.05) -> torch.Tensor:
    """Initial weights of one probe, independent of which other probes train beside it."""
    g = torch.Generator().manual_seed(_probe_seed(seed, key))
    return (torch.rand((rank, hidden), generator=g, dtype=torch.float64) * 2 - 1).mul_(scale).float()


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled sentence order of one epoch (seeded by ``seed`` and ``epoch``)."""
    g = torch.Generator().manual_seed(_probe_seed(seed, ("epoch", epoch, "order")))
    return torch.randperm(n, generator=g).tolist()


def _batch_tensors(trees: TreeSet, idx: Sequence[int], device) -> dict:
    """Gold trees of a batch padded to its longest sentence, and where its words sit.

    ``words``: the batch's words as indices into the split's word axis (sentence after sentence);
    ``flat``: the same words' positions in the flattened ``[B, T]`` grid.
    """
    lengths = [len(trees.words[i]) for i in idx]
    T = max(lengths)
    B = len(idx)
    offsets = trees.offsets
    mask = np.zeros((B, T), dtype=bool)
    dist = np.zeros((B, T, T), dtype=np.float32)
    words, flat = [], []
    for b, i in enumerate(idx):
        n = lengths[b]
        words.append(np.arange(offsets[i], offsets[i] + n))
        flat.append(b * T + np.arange(n))
        mask[b, :n] = True
        dist[b, :n, :n] = trees.distances[i]
    return {
        "words": torch.from_numpy(np.concatenate(words)),
        "flat": torch.from_numpy(np.concatenate(flat)).to(device),
        "shape": (B, T),
        "mask": torch.from_numpy(mask).to(device),
        "dist": torch.from_numpy(dist).to(device),
        "depth_flat": torch.from_numpy(np.concatenate([trees.depths[i] for i in idx]).astype(np.float32)).to(device),
        "sentence": torch.from_numpy(np.repeat(np.arange(B), lengths)).to(device),
        "n": torch.tensor(lengths, dtype=torch.float32, device=device),
    }


def _gather(feats: Mapping[str, torch.Tensor], slots: Sequence[tuple[str, int]], words: torch.Tensor, device) -> torch.Tensor:
    """Features of the batch's words for the given (model, layer index) slots: ``[S, N, H]``, float32.

    Features may be held in float16 (and memory-mapped); only this batch is copied, moved to the device
    in the stored dtype and widened there, so the probes always train and score in float32.
    """
    parts = []
    for m, li in slots:
        parts.append(feats[m][li].index_select(0, words))
    return torch.stack(parts).to(device).float()


class _Layout:
    """Where each probe's weights and features sit in the batched computation.

    Probes that read the same (model, layer) features (a distance and a depth probe) share one
    feature slot: their weights are concatenated along the rank, so each slot's features are read
    once and multiplied once (``[slots, words, hidden] @ [slots, hidden, kinds * rank]``).
    """

    def __init__(self, keys: Sequence[tuple[str, int, str]], layer_index: Mapping[tuple[str, int], int]):
        slots = [(m, layer_index[(m, layer)]) for m, layer, _ in keys]
        self.slots = list(dict.fromkeys(slots))
        where = {s: u for u, s in enumerate(self.slots)}
        u_of = [where[s] for s in slots]
        k_of, counts = [], {}
        for u in u_of:
            k_of.append(counts.get(u, 0))
            counts[u] = counts.get(u, 0) + 1
        self.K = max(counts.values())
        P, U = len(keys), len(self.slots)
        group = np.full(U * self.K, P, dtype=np.int64)  # P = an all-zero filler row
        for p, (u, k) in enumerate(zip(u_of, k_of)):
            group[u * self.K + k] = p
        self.group = torch.from_numpy(group)
        self.position = torch.tensor([u * self.K + k for u, k in zip(u_of, k_of)], dtype=torch.int64)
        self.kinds = [k for _, _, k in keys]
        self.is_dist = torch.tensor([k == "distance" for k in self.kinds])

    def project(self, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``B h`` of every probe and word: ``[P, N, rank]``.

        ``x`` is ``[slots, N, H]``: the batch's real words only, so nothing is spent on padding.
        """
        P, r, H = weights.shape
        U, N, _ = x.shape
        dev = weights.device
        w = torch.cat([weights, weights.new_zeros((1, r, H))]).index_select(0, self.group.to(dev))
        y = torch.bmm(x, w.view(U, self.K * r, H).transpose(1, 2)).view(U, N, self.K, r)
        u, k = self.position // self.K, self.position % self.K
        return y[u.to(dev), :, k.to(dev)]  # [P, N, r]


def _grid(v: torch.Tensor, batch: dict) -> torch.Tensor:
    """Per-word values ``[P, N, ...]`` laid out on the padded batch grid ``[P, B, T, ...]`` (padding = 0)."""
    B, T = batch["shape"]
    grid = v.new_zeros((v.shape[0], B * T) + tuple(v.shape[2:])).index_copy(1, batch["flat"], v)
    return grid.view((v.shape[0], B, T) + tuple(v.shape[2:]))


def _distances(y: torch.Tensor, sq: torch.Tensor, batch: dict) -> torch.Tensor:
    """Squared distances ``[P, B, T, T]`` from ``y`` ``[P, N, r]`` and ``sq = |y|²`` ``[P, N]``:
    ``|y_i|² + |y_j|² - 2 y_i·y_j``, clamped at 0."""
    yg, sqg = _grid(y, batch), _grid(sq, batch)
    return (sqg[..., :, None] + sqg[..., None, :] - 2 * yg @ yg.transpose(-1, -2)).clamp_min(0)


def probe_losses(y: torch.Tensor, kinds: Sequence[str], batch: dict) -> torch.Tensor:
    """Mean per-sentence loss of each probe on one batch: ``[P]``.

    ``y`` is ``B h`` of the batch's words ``[P, N, rank]`` (:meth:`_Layout.project`); ``kinds[p]`` is
    ``distance`` (``Σ_ij |d̂ - d| / n²`` over the sentence's word pairs) or ``depth``
    (``Σ_i ||y_i|² - depth_i| / n``).
    """
    sq = (y * y).sum(-1)  # [P, N]
    n = batch["n"].to(y.dtype)
    out = torch.zeros(len(kinds), dtype=y.dtype, device=y.device)
    is_dist = torch.tensor([k == "distance" for k in kinds], device=y.device)
    if is_dist.any():
        pred = _distances(y[is_dist], sq[is_dist], batch)
        mask = batch["mask"].to(y.dtype)
        pair_mask = mask[:, :, None] * mask[:, None, :]
        per_sent = ((pred - batch["dist"]).abs() * pair_mask).sum((-1, -2)) / n**2  # [Pd, B]
        out = out.index_put((is_dist.nonzero().squeeze(1),), per_sent.mean(-1))
    if (~is_dist).any():
        err = (sq[~is_dist] - batch["depth_flat"]).abs()  # [Pp, N]
        per_sent = err.new_zeros((err.shape[0], len(n))).index_add(1, batch["sentence"], err) / n  # [Pp, B]
        out = out.index_put(((~is_dist).nonzero().squeeze(1),), per_sent.mean(-1))
    return out


def predict(y: torch.Tensor, kinds: Sequence[str], batch: dict) -> torch.Tensor:
    """Predicted squared distances ``[P, B, T, T]`` (distance probes) or depths in ``[..., 0, :]`` (depth)."""
    sq = (y * y).sum(-1)
    pred = _distances(y, sq, batch)
    sqg = _grid(sq, batch)
    for p, k in enumerate(kinds):
        if k == "depth":
            pred[p, :, 0, :] = sqg[p]
    return pred


class _StackTrainer:
    """The optimiser and per-probe schedules of :func:`fit_probes` (state saved for resuming)."""

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, weights: torch.Tensor, settings: ProbeSettings):
        P = weights.shape[0]
        self.s = settings
        self.w = weights
        self.m = torch.zeros_like(weights)
        self.v = torch.zeros_like(weights)
        self.step = np.zeros(P, dtype=np.int64)
        self.lr = np.full(P, settings.lr, dtype=np.float64)
        self.sched_best = np.full(P, np.inf)
        self.sched_bad = np.zeros(P, dtype=np.int64)
        self.best = np.full(P, np.inf)
        self.best_epoch = np.zeros(P, dtype=np.int64)
        self.best_w = weights.detach().clone()
        self.active = np.ones(P, dtype=bool)
        self.epochs = np.zeros(P, dtype=np.int64)
        self.history: list[list[float]] = [[] for _ in range(P)]
        self.epoch = 0

    @torch.no_grad()
    def adam(self, grad: torch.Tensor) -> None:
        """One Adam step (torch.optim.Adam's arithmetic) on the active probes, each with its own learning rate.

        Moments of stopped probes keep moving on zero gradients; their weights do not (step size 0),
        and they never train again.
        """
        b1, b2 = self.betas
        a = self.active
        self.step[a] += 1
        self.m.lerp_(grad, 1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        steps = np.maximum(self.step, 1).astype(np.float64)
        step_size = np.where(a, self.lr / (1 - b1**steps), 0.0)
        bc2_sqrt = np.sqrt(1 - b2**steps)
        shape = (-1,) + (1,) * (grad.dim() - 1)
        as_t = lambda v: torch.tensor(v, dtype=grad.dtype, device=grad.device).reshape(shape)  # noqa: E731
        denom = (self.v.sqrt() / as_t(bc2_sqrt)).add_(self.eps)
        self.w.add_(self.m / denom * as_t(-step_size))

    def end_epoch(self, dev_loss: np.ndarray) -> None:
        """Per probe: plateau LR decay, best-state bookkeeping, early stopping (only active probes)."""
        self.epoch += 1
        s = self.s
        for p in np.nonzero(self.active)[0]:
            loss = float(dev_loss[p])
            self.history[p].append(loss)
            self.epochs[p] = self.epoch
            # ReduceLROnPlateau(mode="min", factor, patience, threshold=1e-4 relative)
            if loss < self.sched_best[p] * (1 - 1e-4):
                self.sched_best[p], self.sched_bad[p] = loss, 0
            else:
                self.sched_bad[p] += 1
            if self.sched_bad[p] > s.lr_patience:
                new = self.lr[p] * s.lr_factor
                if self.lr[p] - new > 1e-8:
                    self.lr[p] = new
                self.sched_bad[p] = 0
            # best weights and early stopping (Hewitt & Manning: improvement must exceed min_delta)
            if loss < self.best[p] - s.min_delta:
                self.best[p], self.best_epoch[p] = loss, self.epoch
                self.best_w[p] = self.w[p].detach()
            elif self.epoch - self.best_epoch[p] >= s.patience:
                self.active[p] = False

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("w", "m", "v", "step", "lr", "sched_best", "sched_bad", "best",
                                               "best_epoch", "best_w", "active", "epochs", "history", "epoch")}

    @torch.no_grad()
    def load(self, state: dict) -> None:
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and isinstance(getattr(self, k), torch.Tensor):
                getattr(self, k).copy_(v)
            else:
                setattr(self, k, v)


def _projected_batches(
    weights: torch.Tensor, layout: _Layout, feats: Mapping[str, torch.Tensor], trees: TreeSet, batch_size: int, device
) -> Iterator[tuple[list[int], dict, torch.Tensor]]:
    """A split in batches of similar length: each batch's sentence ids, its tensors and every probe's output.

    The one pass that the dev loss and the test scores share (the caller decides about gradients).
    """
    order = np.argsort(trees.lengths, kind="stable")
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size].tolist()
        batch = _batch_tensors(trees, idx, device)
        x = _gather(feats, layout.slots, batch["words"], device)
        yield idx, batch, layout.project(weights, x)


def _dataset_loss(weights, layout: _Layout, feats, trees, batch_size, device) -> np.ndarray:
    """Mean per-sentence loss of every probe over a split (batch-independent), ``[P]``."""
    total = torch.zeros(len(layout.kinds), dtype=torch.float64)
    with torch.inference_mode():
        for idx, batch, y in _projected_batches(weights, layout, feats, trees, batch_size, device):
            total += probe_losses(y, layout.kinds, batch).double().cpu() * len(idx)
    return (total / len(trees)).numpy()


def fit_probes(
    keys: Sequence[tuple[str, int, str]],
    layer_index: Mapping[tuple[str, int], int],
    train_feats: Mapping[str, torch.Tensor],
    train: TreeSet,
    dev_feats: Mapping[str, torch.Tensor],
    dev: TreeSet,
    settings: ProbeSettings,
    *,
    checkpoint: Path | None = None,
    on_epoch: Callable[[int, int], None] | None = None,
) -> ProbeStack:
    """Train every probe in ``keys`` ((model, layer, kind)) together; see the module docstring.

    ``train_feats[model]`` is ``[n_layers, n_words, hidden]``; ``layer_index[(model, layer)]`` is the
    row of a layer in it. With ``checkpoint`` the full training state is saved after every epoch
    and a matching earlier state is resumed.
    """
    device = torch.device(settings.device)
    hidden = next(iter(train_feats.values())).shape[-1]
    rank = min(settings.rank or hidden, hidden)
    layout = _Layout(keys, layer_index)
    w0 = torch.stack([init_probe(k, rank, hidden, settings.seed, settings.init_scale) for k in keys]).to(device)
    tr = _StackTrainer(w0.requires_grad_(True), settings)
    tag = hashlib.sha256(json.dumps([list(map(list, keys)), settings.to_dict(), train.fingerprint(), dev.fingerprint()],
                                    default=str).encode()).hexdigest()
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device, weights_only=False)
        if saved.get("tag") == tag:
            tr.load(saved["state"])
            logger.info("resuming probe training after epoch %d", tr.epoch)
    t0 = time.perf_counter()
    epoch_seconds = []
    while tr.epoch < settings.epochs and tr.active.any():
        te = time.perf_counter()
        order = epoch_order(len(train), settings.seed, tr.epoch)
        # only the probes still training are computed (their rows of the stack); the others get no gradient
        act = np.nonzero(tr.active)[0]
        act_t = torch.as_tensor(act, device=device)
        sub = layout if len(act) == len(keys) else _Layout([keys[i] for i in act], layer_index)
        for s in range(0, len(order), settings.batch_size):
            idx = order[s : s + settings.batch_size]
            batch = _batch_tensors(train, idx, device)
            x = _gather(train_feats, sub.slots, batch["words"], device)
            w = tr.w if sub is layout else tr.w.index_select(0, act_t)
            loss = probe_losses(sub.project(w, x), sub.kinds, batch).sum()
            tr.w.grad = None
            loss.backward()
            tr.adam(tr.w.grad)
        dev_loss = np.full(len(keys), np.nan)
        dev_loss[act] = _dataset_loss(tr.w.detach()[act_t], sub, dev_feats, dev, settings.batch_size, device)
        tr.end_epoch(dev_loss)
        epoch_seconds.append(time.perf_counter() - te)
        if checkpoint is not None:
            atomic_write(checkpoint, lambda p: torch.save({"tag": tag, "state": tr.state()}, p))
        if on_epoch is not None:
            on_epoch(tr.epoch, int(tr.active.sum()))
    return ProbeStack(
        keys=list(keys), weights=tr.best_w.detach().cpu(), best_dev_loss=tr.best.copy(),
        best_epoch=tr.best_epoch.copy(), epochs=tr.epochs.copy(), history=[list(h) for h in tr.history],
        seconds={"training": time.perf_counter() - t0, "epochs_run_now": len(epoch_seconds),
                 "per_epoch": epoch_seconds, "n_probes": len(keys), "rank": rank},
    )


def evaluate_probes(
    stack: ProbeStack,
    layer_index: Mapping[tuple[str, int], int],
    feats: Mapping[str, torch.Tensor],
    trees: TreeSet,
    *,
    batch_size: int = 32,
    device: str = "cpu",
) -> list[dict]:
    """Scores of every probe on one split: one dict per probe (see :data:`COLUMNS`)."""
    dev = torch.device(device)
    keys = stack.keys
    layout = _Layout(keys, layer_index)
    kinds = layout.kinds
    w = stack.weights.to(dev)
    preds: list[list[np.ndarray]] = [[None] * len(trees) for _ in keys]  # type: ignore[list-item]
    with torch.inference_mode():
        for idx, batch, y in _projected_batches(w, layout, feats, trees, batch_size, dev):
            pred = predict(y, kinds, batch).cpu().numpy()
            for b, i in enumerate(idx):
                n = len(trees.words[i])
                for p, kind in enumerate(kinds):
                    preds[p][i] = pred[p, b, :n, :n] if kind == "distance" else pred[p, b, 0, :n]
    loss = _dataset_loss(w, layout, feats, trees, batch_size, dev)
    rows = []
    for p, (model, layer, kind) in enumerate(keys):
        row = {"model": model, "layer": layer, "probe": kind, "split": trees.name,
               "uuas": np.nan, "dspr": np.nan, "root_acc": np.nan, "nspr": np.nan}
        if kind == "distance":
            sc = score_distances(preds[p], trees.heads, trees.keep, golds=trees.distances)
            row.update(uuas=sc["uuas"], dspr=sc["dspr"])
        else:
            sc = score_depths(preds[p], trees.heads, trees.keep, golds=trees.depths)
            row.update(root_acc=sc["root_acc"], nspr=sc["nspr"])
        row.update(loss=float(loss[p]), n_sentences=len(trees), rank=int(stack.weights.shape[1]),
                   epochs=int(stack.epochs[p]), best_epoch=int(stack.best_epoch[p]),
                   best_dev_loss=float(stack.best_dev_loss[p]))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------
# the whole analysis


def run_probes(
    models: Mapping[str, object],
    train: Corpus,
    dev: Corpus | None,
    test: Corpus,
    settings: ProbeSettings | None = None,
    on_progress: ProgressFn | None = None,
    *,
    work_dir: str | os.PathLike | None = None,
    spacy_model: str | None = None,
) -> Result:
    """Train and score distance and depth probes on every layer of every model.

    ``models`` maps a name (``base``, ``tuned``, ``random`` ...) to a
    :class:`~bertology.models.loading.LoadedModel` or a ``(model, tokenizer)`` tuple; all must share
    the hidden size. Corpora come from CoNLL-U (gold trees) or plain text (parsed with spaCy,
    ``spacy_model``). ``dev=None`` holds out a seeded ``dev_fraction`` of train. ``on_progress(stage,
    done, total)`` reports ``features <split> <model>`` (sentences), ``training`` (epochs) and
    ``scoring`` (splits). With ``work_dir``, word features are cached in ``work_dir/features`` and the
    training state in ``work_dir/probe-training.pt``, so an interrupted run resumes; the features are then
    served from the memory-mapped cache files (see :func:`_cached_features`).

    Returns the ``probe`` table: one row per (model, layer, probe, split) for the dev and test splits.
    """
    from bertology.results import Result

    settings = settings or ProbeSettings()
    if not models:
        raise BertologyError("run_probes needs at least one model.")
    progress = on_progress or (lambda *_: None)
    work = Path(work_dir) if work_dir is not None else None
    unpacked = {name: _unpack(m) for name, m in models.items()}
    hidden = {name: enc.config.hidden_size for name, (enc, _, _) in unpacked.items()}
    if len(set(hidden.values())) > 1:
        raise BertologyError(f"All models must share the hidden size to train in one stack; got {hidden}.")

    # data
    punct = settings.punct_upos
    rule = settings.punctuation
    train_t = tree_set(ensure_trees(train, spacy_model=spacy_model), punct_upos=punct, name="train", punctuation=rule)
    test_t = tree_set(ensure_trees(test, spacy_model=spacy_model), punct_upos=punct, name="test", punctuation=rule)
    if dev is None:
        train_t, dev_t = split_dev(train_t, settings.dev_fraction, settings.seed)
    else:
        dev_t = tree_set(ensure_trees(dev, spacy_model=spacy_model), punct_upos=punct, name="dev", punctuation=rule)
    toks = []
    for _, tok, _ in unpacked.values():
        if all(tok is not t for t in toks):
            toks.append(tok)
    max_length = position_limit(settings.max_length, [enc for enc, _, _ in unpacked.values()])
    splits: dict[str, TreeSet] = {}
    for name, ts in (("train", train_t), ("dev", dev_t), ("test", test_t)):
        if len(ts) == 0:
            raise BertologyError(f"The {name} split has no sentence with a single dependency tree.")
        splits[name], _ = encodable(ts, toks, max_length)
        splits[name].name = name
    if len(splits["train"]) < 2:
        raise BertologyError("Probes need at least 2 training sentences.")

    # layers
    layer_numbers: dict[str, tuple[int, ...]] = {}
    for name, (enc, _, _) in unpacked.items():
        n_layers = enc.config.num_hidden_layers
        if settings.layers is None:
            layer_numbers[name] = tuple(range(n_layers + 1))
        else:
            bad = [x for x in settings.layers if not 0 <= x <= n_layers]
            if bad:
                raise BertologyError(f"Layer(s) {bad} out of range for {name!r} (layers 0..{n_layers}; 0 = embeddings).")
            layer_numbers[name] = settings.layers
    layer_index = {(m, layer): i for m, ls in layer_numbers.items() for i, layer in enumerate(ls)}

    # features: each model runs once per split
    feats: dict[str, dict[str, torch.Tensor]] = {s: {} for s in splits}
    seconds: dict[str, dict[str, float]] = {s: {} for s in splits}
    cached: dict[str, dict[str, bool]] = {s: {} for s in splits}
    fps = {name: _model_fingerprint(enc, desc) for name, (enc, _, desc) in unpacked.items()}
    for split, ts in splits.items():
        for name, model in models.items():
            stage = f"features {split} {name}"
            done = [0]

            def on_batch(k, stage=stage, done=done, total=len(ts)):
                done[0] += k
                progress(stage, done[0], total)

            key = hashlib.sha256(json.dumps([fps[name], ts.fingerprint(), layer_numbers[name], "mean",
                                             settings.feature_dtype]).encode()).hexdigest()
            path = None if work is None else work / "features" / f"{split}-{name}.safetensors"
            t0 = time.perf_counter()
            progress(stage, 0, len(ts))
            feats[split][name], cached[split][name] = _cached_features(
                path, key,
                lambda out, model=model, ts=ts, name=name, cb=on_batch: extract_word_features(
                    model, ts, layer_numbers[name], batch_size=settings.extract_batch_size,
                    device=settings.device, on_batch=cb, dtype=FEATURE_DTYPES[settings.feature_dtype], out=out),
                shape=(len(layer_numbers[name]), ts.n_words, hidden[name]), dtype=FEATURE_DTYPES[settings.feature_dtype],
            )
            progress(stage, len(ts), len(ts))
            seconds[split][name] = time.perf_counter() - t0

    # train
    keys = [(m, layer, kind) for kind in settings.probes for m in models for layer in layer_numbers[m]]
    progress("training", 0, settings.epochs)
    stack = fit_probes(
        keys, layer_index, feats["train"], splits["train"], feats["dev"], splits["dev"], settings,
        checkpoint=None if work is None else work / "probe-training.pt",
        on_epoch=lambda e, _a: progress("training", e, settings.epochs),
    )
    progress("training", settings.epochs, settings.epochs)

    # score
    t0 = time.perf_counter()
    rows = []
    for k, split in enumerate(("dev", "test")):
        progress("scoring", k, 2)
        rows += evaluate_probes(stack, layer_index, feats[split], splits[split],
                                batch_size=settings.extract_batch_size, device=settings.device)
    progress("scoring", 2, 2)
    table = pd.DataFrame(rows, columns=COLUMNS)
    params = {
        "settings": settings.to_dict(),
        "rank": int(stack.weights.shape[1]),
        "n_probes": len(keys),
        "layers": {m: list(ls) for m, ls in layer_numbers.items()},
        "pooling": "mean of sub-word pieces",
        "features": {"dtype": settings.feature_dtype, "memory_mapped": work is not None,
                     "bytes": {s: {m: int(f.numel() * f.element_size()) for m, f in d.items()} for s, d in feats.items()}},
        "punctuation": (f"XPOS in {list(HEWITT_PUNCT_XPOS)} (Hewitt & Manning's reporter.py)" if rule == "hewitt2019"
                        else f"UPOS in {list(punct)}") + " left out of UUAS and root accuracy; DSpr/NSpr use every word",
        "spearman_lengths": [5, 50],
        "models": {name: desc for name, (_, _, desc) in unpacked.items()},
        "data": {s: {"n_sentences": len(ts), "n_words": ts.n_words, **ts.stats} for s, ts in splits.items()},
        "timings_s": {
            "features": seconds,
            "features_from_cache": cached,
            "training": stack.seconds["training"],
            "training_per_epoch": stack.seconds["per_epoch"],
            "scoring": time.perf_counter() - t0,
        },
        "max_epoch_trained": int(stack.epochs.max()) if len(keys) else 0,
    }
    return Result(TABLE, table, params)



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
        res = run_probes(models, train, dev, test, settings, on_progress, work_dir=work, spacy_model=config.spacy_model)
    shutil.rmtree(work, ignore_errors=True)  # cached word features: the table is done
    keep = ("pooling", "features", "punctuation", "spearman_lengths", "max_epoch_trained")
    data = {split: {k: v for k, v in d.items() if k in ("n_sentences", "n_words")}
            for split, d in (res.params.get("data") or {}).items()}
    return ExperimentOutcome({res.name: res}, jsonable({"settings": settings.to_dict(), "data": data,
                                                        **{k: v for k, v in res.params.items() if k in keep}}))


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """The best UUAS and DSpr layer of each model on the test trees."""
    t = tables[TABLE]
    t = t[t["split"] == "test"]
    lines = []
    for model, part in t.groupby("model", sort=False):
        dist = part[part["probe"] == "distance"].dropna(subset=["uuas"])
        if len(dist):
            best = dist.loc[dist["uuas"].idxmax()]
            lines.append(f"structural probe, {model}: best UUAS {best.uuas:.3f} (layer {int(best.layer)}), "
                         f"best DSpr {dist['dspr'].max():.3f} (layer {int(dist.loc[dist['dspr'].idxmax(), 'layer'])})")
    return "\n".join(lines) or None


SETTINGS = (
    Setting("probe_train", None, "Training trees (CoNLL-U, or text parsed with spaCy).", kind=str,
            paper="Hewitt & Manning 2019"),
    Setting("probe_dev", None, "Dev trees for early stopping (default: 10% of --probe-train).", kind=str),
    Setting("probe_test", None, "Test trees the scores come from.", kind=str),
    Setting("probe_rank", 128, "Rank of the probe matrix (0 = full).", minimum=0, paper="Hewitt & Manning 2019"),
    Setting("probe_epochs", 30, "Most training epochs of each probe (early stopping on dev loss).", minimum=1,
            paper="Hewitt & Manning 2019"),
    Setting("probe_random_control", True, "Also probe a random-init model of the same shape."),
    Setting("probe_max_sentences", None, "Read at most this many sentences of each probe file.", kind=int,
            minimum=1),
    convention("probe_punctuation", paper="Hewitt & Manning 2019"),
)

SPEC = ExperimentSpec("probe", "the structural probes", lambda config: (TABLE,), settings_from, skip_reason, _run,
                      summary=summary, settings=SETTINGS)
