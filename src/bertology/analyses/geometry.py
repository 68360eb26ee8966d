"""Geometry of the representations per layer (Ethayarajh 2019), for the base and the tuned model.

For every layer 0..N (0 = embedding output, HF ``hidden_states[i]``) and both models:

- ``anisotropy``: the baseline, mean cosine of random pairs of *token* representations from
  different sentences. ``n_pairs`` examples are sampled; one token is drawn from each; with
  ``baseline_pairs="chain"`` (default, the paper's design: 1,000 sentences, 1,000 pairs) token ``i``
  is paired with token ``i + 1`` in sample order (``n_pairs`` pairs, every pair across sentences); with
  ``"all"`` every pair of the sampled tokens counts (a lower-variance estimate of the same number).
  (The paper's released code drew its 1,000 pairs with replacement from the 1,000 sampled tokens, so a
  token could be paired with itself; the chain never does.)
- ``mev_baseline``: the MEV (below) of the same sampled tokens: the paper's baseline for MEV, "the
  variance explained by the first principal component of uniformly randomly sampled representations".
- ``self_similarity``: for words seen in at least ``min_contexts`` sentences, the mean cosine between
  the word's representations in different sentences (all pairs of its kept occurrences), averaged
  over words (each word counts once). A word is its lower-cased form (pieces joined by the
  tokenizer); its vector is the mean of its sub-word vectors (:func:`bertology.data.align.pool_words`);
  words containing the unknown token are left out. At most one occurrence per sentence is kept (a
  hashed choice when the word repeats) and at most ``max_contexts`` sentences per word.
- ``intra_similarity``: per sentence, the mean cosine between each token and the sentence's mean
  vector, averaged over sentences (streams exactly; an example that is a sentence pair counts as one
  "sentence").
- ``mev``: maximum explainable variance of a word, the share of the variance of its occurrence matrix
  on the first principal component, averaged over the same words. ``mev_center=True`` (default)
  centres the occurrences first, as Ethayarajh's released code does (sklearn ``PCA``), which is what
  produced the paper's numbers; ``False`` is the paper's written formula sigma_1^2 / sum sigma_i^2 of the
  raw matrix. Note that with ``m`` occurrences a centred MEV cannot fall below ``1 / (m - 1)``, so
  ``max_contexts`` matters. The paper's code measured its MEV baseline with ``TruncatedSVD`` (not
  centred) against the centred total variance; we use the same estimator as for words instead.
- ``*_adjusted``: ``self_similarity`` and ``intra_similarity`` minus ``anisotropy``, and ``mev`` minus
  ``mev_baseline``, of the same model and layer.

Tokens: with ``include_special=False`` (default) [CLS], [SEP] and other special tokens are left out of
the baseline and the intra-sentence similarity (their vectors are outliers that would dominate both);
words never include them. Recorded in ``params()``.

Sampling, all keyed by hashes of ``seed`` and example indices / word forms (as in ``head_map``), so it
does not depend on batching or sharding and ``merge`` of shards equals one run over the whole corpus:
the baseline examples are the ``n_pairs`` with the smallest example keys, the token in each the one
with the smallest position key; the words are the ``max_words`` qualifying words (``>= min_contexts``
sentences) with the smallest word keys, and a word's occurrences those with the smallest occurrence
keys. To bound memory, only the ``max_candidates`` word forms with the smallest keys among all forms
seen are considered at all (a hashed, hence unbiased, subset of the vocabulary): on a small corpus
where fewer than ``max_words`` words qualify, the analysed words are then the qualifying words of that
subset. Shards must hold disjoint examples.

Memory: word occurrences are stored in float16 (``2 (N + 1) hidden`` values per occurrence: 10.8 kB
for MiniLM, 40 kB for BERT-base), at most ``max_contexts`` per word, for the words whose key is below
the current threshold (the smaller of the two rules above). At any time at most ``max_words``
stored words qualify (``<= max_contexts`` occurrences each) and the others have fewer than
``min_contexts``, so at most ``max_words * max_contexts + max_candidates * (min_contexts - 1)``
occurrences are held: 13,000 with the defaults, i.e. <= 140 MB for MiniLM, <= 520 MB for BERT-base
(typically far less: most word forms occur once). The baseline keeps ``n_pairs`` tokens in float32
(19 MB for MiniLM); intra-sentence similarity keeps sums.

Device: with the hidden states on a GPU (:attr:`Geometry.on_device`), the per-batch state stays there:
the baseline's float32 rows, the words' float16 occurrences and the float64 intra-sentence sums are tensors on
that device, gathered and pooled there; every choice (keys, positions, word forms) is made on the host from the
examples' own arrays, so no batch tensor is read back. ``compute`` measures there too
(:mod:`bertology.metrics.geometry_torch`: the baseline's cosines and MEV, the words' self-similarity and MEV, batched
by occurrence count) and copies only the final per-layer and per-word arrays and the intra-sentence sums to the host,
once. On the CPU the NumPy path (views of the tensors, no copy; NumPy fits) is kept: it is faster there, and
``tests/unit/test_geometry_device.py`` pins the device path to it. On MPS (no float64) the state is fitted on the
host with NumPy.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.analyses.device_state import host
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.blas import one_blas_thread
from bertology.config import CompareConfig
from bertology.analyses.head_map import example_keys
from bertology.analyses.representation_similarity import token_keys
from bertology.data.align import global_word_ids, pool_words
from bertology.analyses.geometry_fit import (
    baseline_stats,
    baseline_stats_torch,
    to_host,
    word_stats,
    word_stats_torch,
)
from bertology.analyses.geometry_sample import Word, WordSample, float16, kept, word_hash, word_key
from bertology.metrics.geometry import masked_intra_similarity
from bertology.reach import SeedNoise, Track, changes, views
from bertology.results import Result

MODELS = ("base", "tuned")
RAW_METRICS = ("anisotropy", "mev_baseline", "self_similarity", "intra_similarity", "mev")
ADJUSTED_METRICS = {"self_similarity_adjusted": ("self_similarity", "anisotropy"),
                    "intra_similarity_adjusted": ("intra_similarity", "anisotropy"),
                    "mev_adjusted": ("mev", "mev_baseline")}
METRICS = RAW_METRICS + tuple(ADJUSTED_METRICS)
BaselinePairs = Literal["chain", "all"]

# Salts keep the different hashed choices apart (and apart from other analyses' keys).
_SALT_BASELINE = 0x616E69736F  # "aniso"
_SALT_POSITION = 0x706F73  # "pos"
_SALT_OCCURRENCE = 0x6F6363  # "occ"


class Geometry(Analysis):
    """Anisotropy, self-similarity, intra-sentence similarity and MEV per layer, base and tuned."""

    name = "geometry"
    words_name = "geometry_words"
    requires = frozenset({"hidden_states"})
    #: Where the per-batch state lives, and so where ``compute`` measures it. None: with the hidden states,
    #: unless they are on the CPU, where the NumPy path (views of the tensors, no copy; NumPy fits) is kept; True
    #: forces the device path (tests, benchmarks).
    on_device: bool | None = None

    def __init__(
        self,
        num_layers: int,
        *,
        tokenizer=None,
        n_pairs: int = 1000,
        baseline_pairs: BaselinePairs = "chain",
        word_sample: WordSample = WordSample(),
        include_special: bool = False,
        mev_center: bool = True,
        seed: int = 0,
    ):
        if n_pairs < 2:
            raise ValueError("n_pairs must be at least 2")
        if baseline_pairs not in ("chain", "all"):
            raise ValueError(f"baseline_pairs must be 'chain' or 'all', not {baseline_pairs!r}")
        self.num_layers = num_layers
        self.tokenizer = tokenizer
        self.n_pairs, self.baseline_pairs = n_pairs, baseline_pairs
        self.min_contexts, self.max_contexts = word_sample.min_contexts, word_sample.max_contexts
        self.max_words, self.max_candidates = word_sample.max_words, word_sample.max_candidates
        self.include_special, self.mev_center, self.seed = bool(include_special), bool(mev_center), seed
        self._unk = getattr(tokenizer, "unk_token_id", None) if tokenizer is not None else None
        # Baseline: bottom-n_pairs examples by key, one token each, [k, 2, L + 1, hidden] float32.
        self.base_keys = np.zeros(0, dtype=np.uint64)
        self.base_examples = np.zeros(0, dtype=np.int64)
        self.base_positions = np.zeros(0, dtype=np.int64)
        self.base_vectors: np.ndarray | None = None
        # Intra-sentence similarity: sums over sentences, [2, L + 1].
        self.intra_sum = np.zeros((2, num_layers + 1))
        self.intra_sq = np.zeros((2, num_layers + 1))
        self.n_sentences = 0
        # Words.
        self.words: dict[str, Word] = {}
        self.threshold: np.uint64 | None = None  # words with a larger key can never be selected
        self.n_seen = 0
        self._forms: dict[tuple[int, ...], str | None] = {}
        # compute() and word_table() share the baseline and the per-word statistics (the baseline's MEV is
        # 2 (L + 1) eigensolves of hidden x hidden): made once after the last update or merge.
        self._finished: dict[str, object] = {}

    def params(self) -> dict:
        return {
            "n_pairs": self.n_pairs, "baseline_pairs": self.baseline_pairs,
            "min_contexts": self.min_contexts, "max_contexts": self.max_contexts, "max_words": self.max_words,
            "max_candidates": self.max_candidates,
            "include_special": self.include_special, "mev_center": self.mev_center, "seed": self.seed,
            "tokens": "real tokens incl. [CLS]/[SEP]" if self.include_special else "content tokens (no [CLS]/[SEP], no padding)",
            "word_vector": "mean of sub-word vectors; word = lower-cased form; one occurrence per sentence",
            "sample": "bottom-k of hash(seed, example index / word form)",
            "storage": "word occurrences float16, baseline tokens float32, sums float64",
            "num_layers": self.num_layers,
        }

    # ------------------------------------------------------------------------------ words
    def _form(self, ids: tuple[int, ...]) -> str | None:
        """The lower-cased word form of a piece sequence (None: contains the unknown token)."""
        if ids not in self._forms:
            if self._unk is not None and self._unk in ids:
                form = None
            elif self.tokenizer is not None:
                pieces = self.tokenizer.convert_ids_to_tokens(list(ids))
                form = self.tokenizer.convert_tokens_to_string(pieces).strip().lower()
                form = form or None
            else:
                form = "ids:" + "-".join(map(str, ids))
            self._forms[ids] = form
        return self._forms[ids]

    def _word(self, form: str) -> Word | None:
        """The entry of a word that could still be selected (creating it), None when it cannot."""
        w = self.words.get(form)
        if w is None:
            key = word_key(self.seed, form)
            if self.threshold is not None and key > self.threshold:
                return None
            w = self.words[form] = Word(key, 0, np.zeros(0, np.uint64), np.zeros(0, np.int64), None)
        return w

    def _update_threshold(self) -> None:
        """Lower the word-key threshold and drop the words above it.

        Two rules, each a function of the words seen so far that only decreases as more arrive (so
        batches and shards give the same threshold): the ``max_candidates``-th smallest key among all
        word forms seen, and the ``max_words``-th smallest key among the qualifying words.
        """
        tau = self.threshold
        keys = np.array([w.key for w in self.words.values()], dtype=np.uint64)
        if self.max_candidates is not None and len(keys) > self.max_candidates:
            cap = np.partition(keys, self.max_candidates - 1)[self.max_candidates - 1]
            tau = cap if tau is None else min(tau, cap)
        qual = np.sort(np.array([w.key for w in self.words.values() if w.count >= self.min_contexts
                                 and (tau is None or w.key <= tau)], dtype=np.uint64))
        if len(qual) >= self.max_words:
            tau = qual[self.max_words - 1] if tau is None else min(tau, qual[self.max_words - 1])
        if tau is not None:
            self.threshold = tau
            self.words = {f: w for f, w in self.words.items() if w.key <= tau}

    def _add_words(self, index: int, item, tokens: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keep the candidate words of one example; ``tokens(positions)`` gives those tokens' ``[P, 2, L + 1, D]``
        float32 vectors.

        Only the words that are kept are pooled (:func:`bertology.data.align.pool_words`, from their own tokens):
        most words of a sentence are not candidates, or fall outside their word's bottom ``max_contexts``, and
        pooling every word of every sentence was a quarter of ``update`` at BERT-base. Each kept word's mean is of
        the same pieces in the same order as when the whole sentence was pooled.
        """
        gids = global_word_ids(item.word_ids, item.segment)  # a pair's second text numbered after the first
        if not (gids >= 0).any():
            return
        ids = item.input_ids
        by_form: dict[str, list[int]] = {}
        positions: dict[int, np.ndarray] = {}
        for w in range(int(gids.max()) + 1):
            pos = np.nonzero(gids == w)[0]
            if pos.size == 0:
                continue
            form = self._form(tuple(int(i) for i in ids[pos]))
            if form is None:
                continue
            by_form.setdefault(form, []).append(w)
            positions[w] = pos
        chosen: list[tuple[str, Word, int]] = []  # (form, its entry, the word kept for it) of the candidate words
        for form, ws in by_form.items():
            entry = self._word(form)
            if entry is None:
                continue
            if len(ws) > 1:  # the word repeats in this sentence: keep one occurrence, chosen by hash
                pk = token_keys(self.seed ^ _SALT_POSITION, np.full(len(ws), index),
                                np.array([positions[w][0] for w in ws]))
                ws = [ws[int(np.argmin(pk))]]
            chosen.append((form, entry, ws[0]))
        if not chosen:
            return
        okeys = token_keys(self.seed ^ _SALT_OCCURRENCE, np.full(len(chosen), index),
                           np.array([word_hash(form) for form, _, _ in chosen]))
        kept = []
        for i, (_, entry, w) in enumerate(chosen):
            if entry.rejects(okeys[i], index, self.max_contexts):
                entry.count += 1
            else:
                kept.append((i, entry, w))
        if kept:
            pos = [positions[w] for _, _, w in kept]
            local = np.repeat(np.arange(len(kept)), [len(p) for p in pos])  # kept word j's tokens -> word j
            order = np.argsort(np.concatenate(pos), kind="stable")  # the tokens in sentence order
            pooled = pool_words(tokens(np.concatenate(pos)[order]), local[order], "mean")  # [K, 2, L + 1, D]
            # every kept occurrence of the sentence at once (a tensor where the hidden states are, on the device path)
            stored = pooled.to(torch.float16) if isinstance(pooled, torch.Tensor) else float16(pooled)
            for (i, entry, _), vectors in zip(kept, stored):
                entry.add(okeys[i : i + 1], np.array([index], np.int64), vectors[None], 1, self.max_contexts)

    # ------------------------------------------------------------------------------ streaming
    def _keep_baseline(self, keys, examples, positions, vectors) -> None:
        k = np.concatenate([self.base_keys, keys])
        e = np.concatenate([self.base_examples, examples])
        p = np.concatenate([self.base_positions, positions])
        order = np.lexsort((e, k))[: self.n_pairs]
        self.base_keys, self.base_examples, self.base_positions = k[order], e[order], p[order]
        self.base_vectors = kept(self.base_vectors, vectors, order)

    def update(self, batch: PairBatch) -> None:
        # The words' pooling products are small and alternate with torch's float16 conversions: a threaded BLAS
        # left spinning between them takes the cores torch's threads need (1.7x slower here; bertology.blas).
        with one_blas_thread():
            self._update(batch)

    def _update(self, batch: PairBatch) -> None:
        self._finished.clear()
        on_device = self.on_device
        if on_device is None:
            on_device = batch.base.hidden_states[0].device.type != "cpu"
        if on_device:
            return self._update_on_device(batch)
        n_layers = self.num_layers + 1
        # Per model and layer, [B, T, D] float32 on the CPU (no copy when it already is); only the tokens an
        # example needs (its baseline token, its kept words' pieces) are stacked from these, never the whole batch.
        hs = [[cap.hidden_states[l].float().cpu().numpy() for l in range(n_layers)] for cap in (batch.base, batch.tuned)]
        eligible_t = batch.mask if self.include_special else batch.content
        eligible = eligible_t.cpu().numpy()
        idx = batch.example_indices
        self.n_seen += len(idx)
        # Intra-sentence similarity of every sentence of the batch at once, per model and layer: [2, L + 1, B]
        intra = np.stack([np.stack([masked_intra_similarity(cap.hidden_states[l], eligible_t).cpu().numpy()
                                    for l in range(n_layers)]) for cap in (batch.base, batch.tuned)])
        has = eligible.any(axis=1)
        self.intra_sum += intra[..., has].sum(-1)
        self.intra_sq += (intra[..., has] ** 2).sum(-1)
        self.n_sentences += int(has.sum())
        ekeys = example_keys(self.seed ^ _SALT_BASELINE, idx)
        cand_keys, cand_ex, cand_pos, cand_vec = [], [], [], []
        limit = self.base_keys[-1] if len(self.base_keys) >= self.n_pairs else None
        for row, item in enumerate(batch.items):
            index = int(item.index)

            def tokens(positions: np.ndarray | int, row: int = row) -> np.ndarray:
                """The example's tokens at ``positions``: ``[..., 2, L + 1, D]``, copied from the batch's layers."""
                return np.stack([np.stack([h[row, positions] for h in layers], axis=-2) for layers in hs], axis=-3)

            p = self._baseline_position(index, eligible[row], ekeys[row], limit)
            if p is not None:
                cand_keys.append(ekeys[row])
                cand_ex.append(index)
                cand_pos.append(p)
                cand_vec.append(tokens(p))
            self._add_words(index, item, tokens)
        if cand_keys:
            self._keep_baseline(np.array(cand_keys, np.uint64), np.array(cand_ex, np.int64),
                                np.array(cand_pos, np.int64), np.stack(cand_vec).astype(np.float32))
        self._update_threshold()

    def _baseline_position(self, index: int, eligible: np.ndarray, key: np.uint64, limit: np.uint64 | None) -> int | None:
        """Example ``index``'s baseline token: its eligible position of lowest key, when the example's ``key`` may
        still enter the sample (at most ``limit``, the largest kept key once the sample is full); else None. Both
        update paths choose with it, so they choose alike."""
        pos = np.nonzero(eligible)[0]
        if not pos.size or (limit is not None and key > limit):
            return None
        pk = token_keys(self.seed ^ _SALT_POSITION, np.full(pos.size, index), pos)
        return int(pos[np.argmin(pk)])

    def _update_on_device(self, batch: PairBatch) -> None:
        """:meth:`_update` with the hidden states left where they are: nothing per batch crosses to the host.

        Which tokens count comes from the examples (``special``, their lengths), as ``collate`` builds
        ``batch.mask`` / ``batch.content`` from them, so the choices (keys, positions, words) are made on the host
        exactly as the host path makes them, without reading a tensor. Only the chosen tokens are gathered, on
        the device: the baseline's float32 rows, the kept words' pieces, pooled there
        (:func:`bertology.data.align.pool_words` on tensors) and stored as float16 tensors; the intra-sentence
        sums are float64 tensors there. ``compute`` copies the samples and sums to the host once.
        """
        n_layers = self.num_layers + 1
        hs = [[cap.hidden_states[l] for l in range(n_layers)] for cap in (batch.base, batch.tuned)]
        device = hs[0][0].device
        eligible_t = batch.mask if self.include_special else batch.content
        idx = batch.example_indices
        self.n_seen += len(idx)
        eligible = [np.ones(len(it.input_ids), bool) if self.include_special else ~np.asarray(it.special, bool)
                    for it in batch.items]
        has = np.array([e.any() for e in eligible])
        intra = torch.stack([torch.stack([masked_intra_similarity(h, eligible_t) for h in layers]) for layers in hs])
        keep = transfer.send(has, device)
        intra = torch.where(keep, intra, 0.0)  # [2, L + 1, B] float64: rows without a token count as nothing
        if not isinstance(self.intra_sum, torch.Tensor) or self.intra_sum.device != device:
            with torch.inference_mode(False):
                self.intra_sum, self.intra_sq = (transfer.send(t, device, torch.float64).clone()
                                                 for t in (self.intra_sum, self.intra_sq))
        with torch.inference_mode(False):
            self.intra_sum += intra.sum(-1)
            self.intra_sq += (intra * intra).sum(-1)
        self.n_sentences += int(has.sum())
        ekeys = example_keys(self.seed ^ _SALT_BASELINE, idx)
        cand_keys, cand_ex, cand_pos, cand_rows = [], [], [], []
        limit = self.base_keys[-1] if len(self.base_keys) >= self.n_pairs else None
        for row, item in enumerate(batch.items):
            index = int(item.index)

            def tokens(positions, row: int = row) -> torch.Tensor:
                """The example's tokens at ``positions``: ``[..., 2, L + 1, D]`` float32, gathered on the device."""
                at = transfer.send(positions, device)
                return torch.stack([torch.stack([h[row, at] for h in layers], dim=-2) for layers in hs], dim=-3).float()

            p = self._baseline_position(index, eligible[row], ekeys[row], limit)
            if p is not None:
                cand_keys.append(ekeys[row])
                cand_ex.append(index)
                cand_pos.append(p)
                cand_rows.append(row)
            self._add_words(index, item, tokens)
        if cand_keys:
            rows, at = (transfer.send(np.array(v, np.int64), device) for v in (cand_rows, cand_pos))
            vectors = torch.stack([torch.stack([h[rows, at] for h in layers], dim=-2) for layers in hs], dim=-3).float()
            self._keep_baseline(np.array(cand_keys, np.uint64), np.array(cand_ex, np.int64),
                                np.array(cand_pos, np.int64), vectors)
        self._update_threshold()

    def merge(self, other: "Geometry") -> "Geometry":
        self._check_mergeable(other)
        self._finished.clear()
        if np.intersect1d(self.base_examples, other.base_examples).size:
            raise ValueError("geometry: the shards share examples")
        if other.base_vectors is not None:
            self._keep_baseline(other.base_keys, other.base_examples, other.base_positions, other.base_vectors)
        if isinstance(self.intra_sum, torch.Tensor) or isinstance(other.intra_sum, torch.Tensor):
            ref = self.intra_sum if isinstance(self.intra_sum, torch.Tensor) else other.intra_sum
            with torch.inference_mode(False):
                self.intra_sum, self.intra_sq = (torch.as_tensor(a).to(ref.device) + torch.as_tensor(b).to(ref.device)
                                                 for a, b in ((self.intra_sum, other.intra_sum),
                                                              (self.intra_sq, other.intra_sq)))
        else:
            self.intra_sum += other.intra_sum
            self.intra_sq += other.intra_sq
        self.n_sentences += other.n_sentences
        self.n_seen += other.n_seen
        for form, w in other.words.items():
            if self.threshold is not None and w.key > self.threshold:
                continue
            mine = self.words.get(form)
            if mine is None:
                vectors = w.vectors.clone() if isinstance(w.vectors, torch.Tensor) else w.vectors.copy()
                self.words[form] = Word(w.key, w.count, w.occ_keys.copy(), w.occ_examples.copy(), vectors)
            else:
                mine.add(w.occ_keys, w.occ_examples, w.vectors, w.count, self.max_contexts)
        if other.threshold is not None and (self.threshold is None or other.threshold < self.threshold):
            self.threshold = other.threshold
            self.words = {f: w for f, w in self.words.items() if w.key <= self.threshold}
        self._update_threshold()
        return self

    # ------------------------------------------------------------------------------ results
    def selected_words(self) -> list[str]:
        """The analysed words: qualifying words with the smallest keys (below the threshold), in key order."""
        qual = [(w.key, f) for f, w in self.words.items()
                if w.count >= self.min_contexts and (self.threshold is None or w.key <= self.threshold)]
        qual.sort()
        return [f for _, f in qual[: self.max_words]]

    def _word_stats(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Per selected word: ``(words, self-similarity [n, 2, L + 1], MEV [n, 2, L + 1])``."""
        if "words" not in self._finished:
            device = self._state_device()
            if device is not None:
                self._finished.update(self._compute_on_device(device))
            else:
                self._finished["words"] = self._compute_word_stats()
        return self._finished["words"]

    def _compute_word_stats(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        forms = self.selected_words()
        ss, mev = word_stats([self.words[f].vectors for f in forms], self.num_layers + 1, self.mev_center)
        return forms, ss, mev

    def _baseline(self) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """``anisotropy`` and ``mev_baseline``: (mean [2, L + 1], sd [2, L + 1], n)."""
        if "baseline" not in self._finished:
            device = self._state_device()
            if device is not None:
                self._finished.update(self._compute_on_device(device))
            else:
                self._finished["baseline"] = self._compute_baseline()
        return dict(self._finished["baseline"])  # callers add metrics to their copy

    def _intra(self) -> tuple[np.ndarray, np.ndarray]:
        """The intra-sentence sums ``(sum, sum of squares)`` ``[2, L + 1]`` on the host (the device path's came with
        its one transfer)."""
        if "intra" in self._finished:
            return self._finished["intra"]
        return tuple(np.asarray(host(t), dtype=np.float64) for t in (self.intra_sum, self.intra_sq))

    def _state_device(self) -> torch.device | None:
        """Where the device path's state is (None: NumPy state, fitted with NumPy). MPS state is fitted on the host
        too: MPS has no float64."""
        found = [t for t in (self.base_vectors, self.intra_sum) if isinstance(t, torch.Tensor)]
        found = found or [w.vectors for w in self.words.values() if isinstance(w.vectors, torch.Tensor)][:1]
        return found[0].device if found and found[0].device.type != "mps" else None

    def _compute_on_device(self, device: torch.device) -> dict[str, object]:
        """:meth:`_compute_baseline`, :meth:`_compute_word_stats` and the intra sums where the state is.

        The same formulas in torch (:mod:`bertology.analyses.geometry_fit`); the final arrays cross to the host in
        one transfer.
        """
        n_layers = self.num_layers + 1
        k = len(self.base_keys)
        aniso_mean, aniso_sd, mev_base, n_pairs = baseline_stats_torch(self.base_vectors if k else None, n_layers,
                                                                       self.baseline_pairs, self.mev_center, device)
        forms = self.selected_words()
        ss, mev = word_stats_torch([self.words[f].vectors for f in forms], n_layers, self.mev_center, device)
        intra = [torch.as_tensor(t).to(device, torch.float64) for t in (self.intra_sum, self.intra_sq)]
        am, asd, mb, ss, mev, isum, isq = to_host([aniso_mean, aniso_sd, mev_base, ss, mev, *intra])
        nan = np.full((2, n_layers), np.nan)
        return {"baseline": {"anisotropy": (am, asd, n_pairs), "mev_baseline": (mb, nan, k)},
                "words": (forms, ss, mev), "intra": (isum, isq)}

    def _compute_baseline(self) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        return baseline_stats(self.base_vectors if len(self.base_keys) else None, self.num_layers + 1,
                              self.baseline_pairs, self.mev_center)

    def compute(self) -> Result:
        """The ``geometry`` table: ``model, layer, metric, value, n`` plus ``adjusted, sd, unit, seed``."""
        if self.n_sentences == 0:
            raise ValueError("geometry saw no tokens")
        n_layers = self.num_layers + 1
        stats = self._baseline()
        forms, ss, mev = self._word_stats()
        nw = len(forms)

        def over_words(a: np.ndarray):
            if nw == 0:
                return np.full((2, n_layers), np.nan), np.full((2, n_layers), np.nan)
            return a.mean(0), (a.std(0, ddof=1) if nw > 1 else np.full((2, n_layers), np.nan))

        stats["self_similarity"] = (*over_words(ss), nw)
        stats["mev"] = (*over_words(mev), nw)
        intra_sum, intra_sq = self._intra()
        m = intra_sum / self.n_sentences
        var = (intra_sq - self.n_sentences * m**2) / max(self.n_sentences - 1, 1)
        stats["intra_similarity"] = (m, np.sqrt(np.clip(var, 0, None)) if self.n_sentences > 1 else np.full_like(m, np.nan),
                                     self.n_sentences)
        # Adjusted: per word (self-similarity, MEV) the baseline is a constant, so the sd is unchanged.
        for name, (raw, ref) in ADJUSTED_METRICS.items():
            stats[name] = (stats[raw][0] - stats[ref][0], stats[raw][1], stats[raw][2])
        unit = {"anisotropy": "pairs", "mev_baseline": "tokens", "self_similarity": "words", "mev": "words",
                "intra_similarity": "sentences"}
        records = []
        for mi, model in enumerate(MODELS):
            for layer in range(n_layers):
                for metric in METRICS:
                    mean, sd, n = stats[metric]
                    base_metric = ADJUSTED_METRICS.get(metric, (metric,))[0]
                    records.append((model, layer, metric, float(mean[mi, layer]), int(n), metric in ADJUSTED_METRICS,
                                    float(sd[mi, layer]), unit[base_metric]))
        df = pd.DataFrame.from_records(records, columns=["model", "layer", "metric", "value", "n", "adjusted", "sd", "unit"])
        df["seed"] = self.seed
        df["n_examples_seen"] = self.n_seen
        return Result(self.name, df, self.params())

    def extra_results(self) -> list[Result]:
        return [self.word_table()]

    def word_table(self) -> Result:
        """``geometry_words``: per analysed word, model and layer: ``self_similarity``, ``mev`` (and adjusted)."""
        forms, ss, mev = self._word_stats()
        stats = self._baseline()
        records = []
        for i, f in enumerate(forms):
            w = self.words[f]
            for mi, model in enumerate(MODELS):
                for layer in range(self.num_layers + 1):
                    records.append((model, layer, f, len(w.occ_keys), w.count, ss[i, mi, layer], mev[i, mi, layer],
                                    ss[i, mi, layer] - stats["anisotropy"][0][mi, layer],
                                    mev[i, mi, layer] - stats["mev_baseline"][0][mi, layer]))
        df = pd.DataFrame.from_records(records, columns=["model", "layer", "word", "n_contexts", "n_sentences",
                                                         "self_similarity", "mev", "self_similarity_adjusted",
                                                         "mev_adjusted"])
        return Result(self.words_name, df, self.params())


def by_layer(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric as a ``layer x model`` frame (columns ``base``, ``tuned``)."""
    sub = table[table["metric"] == metric]
    return sub.pivot_table(index="layer", columns="model", values="value").reindex(columns=list(MODELS))


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """Anisotropy and adjusted self-similarity per layer, base and tuned."""
    g = tables["geometry"]
    lines = []
    for metric in ("anisotropy", "self_similarity_adjusted"):
        if (g["metric"] == metric).any():
            w = by_layer(g, metric)
            lines.append(f"geometry, {metric.replace('_', ' ')} by layer 0..N: "
                         + "; ".join(f"{m} " + " ".join(f"{v:.3f}" for v in w[m]) for m in ("base", "tuned") if m in w))
    return "\n".join(lines)


def _build(config: CompareConfig, ctx: BuildContext) -> Geometry:
    words = WordSample(min_contexts=config.geometry_min_contexts, max_contexts=max(10, config.geometry_min_contexts))
    return Geometry(ctx.num_layers, tokenizer=ctx.tokenizer, n_pairs=config.geometry_pairs, word_sample=words,
                    seed=config.seed)


SETTINGS = (
    Setting("geometry_pairs", 1000, "Random token pairs (from different sentences) for the anisotropy baseline.",
            minimum=2, paper="Ethayarajh 2019"),
    Setting("geometry_min_contexts", 5, "Contexts a word needs for its self-similarity and MEV.", minimum=2,
            paper="Ethayarajh 2019"),
)

SPEC = AnalysisSpec("geometry", _build, ("geometry", "geometry_words"), summary=summary, settings=SETTINGS,
                    seed_noise=SeedNoise(pairwise=False, extract=changes.geometry), track=Track(views.geometry_scalars))
