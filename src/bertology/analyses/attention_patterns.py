"""Which of Kovaleva's five attention patterns each head shows, over the examples, base vs tuned.

Kovaleva et al. (2019, §4.1): every map (one head, one example, cropped to the real tokens) is
*vertical*, *diagonal*, *vertical+diagonal*, *block* or *heterogeneous*. Each map is classified by the
rules of :mod:`bertology.metrics.patterns` (transparent features, documented thresholds) or, when a
``classifier`` is given, by a CNN trained on maps a person labelled
(:mod:`bertology.experiments.pattern_cnn`, ``bertology patterns export`` / ``train``).

Table ``attention_patterns`` (long form, one row per model, layer, head and pattern; all five
patterns are always present):

- ``model`` (base/tuned), ``layer`` (1..N), ``head`` (0-based), ``pattern``;
- ``fraction``: share of the examples whose map of this head is of this pattern (sums to 1 over the
  five patterns of a head), ``count`` the number of those examples, ``n_examples`` all examples;
- per head (repeated on its five rows): ``mean_vertical``, ``mean_diagonal``, ``mean_entropy`` (means
  of the features over all examples), ``mean_block`` (over sentence-pair examples only, NaN when there
  are none) and ``n_pairs``; ``classifier`` (``rules`` or ``cnn``).

Punctuation keys are tokens made only of Unicode punctuation (as in ``attention_targets``).
Summaries for the report: :func:`layer_mix` (class mix per layer, mean over heads),
:func:`dominant_patterns` (each head's most frequent class) and :func:`pattern_shift` (per head and
class, base vs tuned fraction). ``merge`` adds counts and feature sums, so shards combine exactly;
shards must share thresholds and classifier (a CNN is identified by its weights' sha256).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.attention_targets import PunctuationLookup
from bertology.analyses.base import Analysis
from bertology.analyses.device_state import moved as _moved, to_device, zeros
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.data.batching import padded_rows
from bertology.config import CompareConfig
from bertology.metrics.patterns import (
    FEATURE_COLUMNS,
    FEATURES,
    PATTERNS,
    SUMS,
    PatternThresholds,
    classify,
    block_sums,
    features_from_sums,
    pattern_sums,
    stacked_pattern_sums,
)
from bertology.reach import SeedNoise, changes
from bertology.results import Result, weights_rows

_BLOCK = FEATURES.index("block")
MODELS = ("base", "tuned")


def vertical_key_mask(
    tokenizer, input_ids: np.ndarray, mask: np.ndarray, content: np.ndarray,
    lookup: PunctuationLookup | None = None, device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[B, T]`` bool on ``device``: real tokens that are special ([CLS], [SEP]...) or made only of punctuation.

    From the batch's host arrays (``[B, T]`` NumPy ids, real-token and content masks: :meth:`PairBatch.host_tokens`),
    so a batch on a GPU is not copied back for the lookup; one small bool tensor goes to ``device``.
    ``lookup`` (a :class:`PunctuationLookup` kept across batches) saves converting the same ids again.
    """
    lookup = PunctuationLookup(tokenizer) if lookup is None else lookup
    real = np.asarray(mask, dtype=bool)
    punct = np.zeros_like(real)
    punct[real] = lookup(np.asarray(input_ids)[real])
    return transfer.send(real & (~np.asarray(content, dtype=bool) | punct), device)


def segment_array(items, width: int) -> np.ndarray:
    """``[B, width]`` int64 on the host: 0/1 for tokens of the first/second text, -1 for special tokens and padding."""
    return padded_rows([it.segment for it in items], width, -1, np.int64)


def segment_ids(items, mask: torch.Tensor) -> torch.Tensor:
    """:func:`segment_array` as a tensor on ``mask``'s device (``mask`` gives the width)."""
    return transfer.send(segment_array(items, mask.shape[1]), mask.device)


class AttentionPatterns(Analysis):
    """Per head and model: the mix of Kovaleva's pattern classes over examples, and mean features.

    The class counts (int64) and feature sums (float64; float32 on MPS, which has no float64) live where the maps
    are: each batch adds to them on the maps' device and they cross to the host once, in ``compute``.
    The vertical keys and which examples are pairs come from the host-side items, so nothing is copied back per
    batch (the CNN classifier, when used, may copy its own inputs).

    The feature sums over a batch's examples are taken by NumPy on the CPU (a view, no copy: the tables of
    before, bit for bit) and by torch where the maps are elsewhere (another summation order: the same sums to
    ``B eps`` relative per batch of ``B``); ``on_device`` forces one (tests pin them together).
    """

    name = "attention_patterns"
    requires = frozenset({"attentions"})
    #: Where a batch's feature sums are taken: None (default) by torch when the maps are not on the CPU, else by
    #: NumPy; True or False forces one (on the class or an instance).
    on_device: bool | None = None

    def __init__(
        self,
        tokenizer,
        num_layers: int,
        num_heads: int,
        thresholds: PatternThresholds = PatternThresholds(),
        classifier=None,
    ):
        self.tokenizer = tokenizer
        self.num_layers, self.num_heads = num_layers, num_heads
        self.thresholds = thresholds
        self.classifier = classifier
        shape = (2, num_layers, num_heads)
        self.counts = zeros(shape + (len(PATTERNS),), torch.int64)
        self.feature_sums = zeros(shape + (len(FEATURES),), torch.float64)
        self.n_examples = 0
        self.n_pairs = 0
        self._punct = PunctuationLookup(tokenizer)

    def params(self) -> dict:
        clf = {"kind": "rules"} if self.classifier is None else self.classifier.identity()
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "thresholds": self.thresholds.to_dict(),
            "classifier": clf,
            "patterns": list(PATTERNS),
            "map": "one head, one example, cropped to real tokens ([CLS]/[SEP] included)",
            "vertical_keys": "[CLS], [SEP] (all special tokens) and tokens made only of Unicode punctuation",
            "block": "sentence pairs only; mean_block averages over pair examples",
        }

    def _vertical_keys(self, batch: PairBatch) -> torch.Tensor:
        return vertical_key_mask(self.tokenizer, *batch.host_tokens(), self._punct, device=batch.mask.device)

    def _to(self, device: torch.device) -> None:
        """Move the accumulators to ``device`` (the first batch's, or a shard's when merging into an empty one)."""
        self.counts = to_device(self.counts, device, torch.int64)
        self.feature_sums = to_device(self.feature_sums, device, torch.float64)

    def update(self, batch: PairBatch) -> None:
        self._to(batch.mask.device)
        vk = self._vertical_keys(batch)
        seg_host = segment_array(batch.items, batch.mask.shape[1])
        is_pair = (seg_host == 1).any(-1)  # sentence pairs, known on the host
        seg = transfer.send(seg_host, batch.mask.device)
        P = len(PATTERNS)
        L = self.num_layers
        band = self.thresholds.band
        # Column sums, near diagonals and row entropies come from the statistics shared with the other
        # analyses (one pass over the maps per layer); features and classes once for all models and layers.
        layers = [(m, layer) for m in range(2) for layer in range(1, L + 1)]
        if band <= 1:
            sums = stacked_pattern_sums(
                torch.stack([batch.received(m, layer) for m, layer in layers]),
                torch.stack([batch.layer_stats(layer).diagonals[m] for m, layer in layers]),
                torch.stack([batch.layer_stats(layer).entropy_sum[m] for m, layer in layers]),
                batch.mask, vk, band,
            )
            if is_pair.any():
                sums["block"] = torch.stack([block_sums(batch.captured(m).attentions[layer], batch.mask, seg, is_pair)
                                             for m, layer in layers])
            else:
                sums["block"] = torch.full_like(sums["band"], float("nan"))
        else:
            per_layer = [pattern_sums(batch.captured(m).attentions[layer], batch.mask, vk, seg, batch.row_entropy(m, layer),
                                      band=band, received=batch.received(m, layer), pairs=is_pair)
                         for m, layer in layers]
            sums = {k: torch.stack([x[k] for x in per_layer]) for k in SUMS}
        feats = features_from_sums(sums, batch.mask, vk, seg, band, pairs=is_pair)
        if self.classifier is None:
            codes = classify(feats, self.thresholds)  # [2 L, B, H]
        else:
            codes = torch.stack([self.classifier.predict_batch(cap.attentions[layer], batch.lengths)
                                 for cap in (batch.base, batch.tuned) for layer in range(1, L + 1)])
        onehot = torch.nn.functional.one_hot(codes.to(self.counts.device), P)  # [2 L, B, H, P]
        self.counts += onehot.sum(1).reshape(2, L, self.num_heads, P)
        f = feats[..., : len(FEATURES)]  # [2 L, B, H, F] float64
        f = torch.where(torch.isnan(f), torch.zeros((), dtype=f.dtype, device=f.device), f)  # block of single texts: not summed
        on_device = self.on_device if self.on_device is not None else f.device.type != "cpu"
        f_sum = f.sum(1) if on_device else torch.from_numpy(f.numpy().sum(1))  # over the batch's examples
        self.feature_sums += _moved(f_sum.reshape(2, L, self.num_heads, len(FEATURES)), self.feature_sums)
        self.n_examples += batch.size
        self.n_pairs += int(is_pair.sum())

    def _merge_key(self) -> dict:
        params = self.params()
        params["classifier"] = {k: v for k, v in params["classifier"].items() if k != "path"}
        return params

    def merge(self, other: "AttentionPatterns") -> "AttentionPatterns":
        # The same CNN (same sha256) may sit at different paths on different workers.
        if type(other) is not type(self) or other._merge_key() != self._merge_key():
            raise ValueError(f"cannot merge {type(other).__name__}{other.params()} into {type(self).__name__}{self.params()}")
        if other.n_examples:
            if not self.n_examples:
                self._to(other.counts.device)
            with torch.inference_mode(False):
                self.counts += _moved(other.counts, self.counts)
                self.feature_sums += _moved(other.feature_sums, self.feature_sums)
        self.n_examples += other.n_examples
        self.n_pairs += other.n_pairs
        return self

    def compute(self) -> Result:
        if self.n_examples == 0:
            raise ValueError("attention_patterns saw no examples")
        L, H, P = self.num_layers, self.num_heads, len(PATTERNS)
        feature_sums = self.feature_sums.cpu().numpy().astype(np.float64)  # the one copy to the host
        means = feature_sums / self.n_examples
        means[..., _BLOCK] = feature_sums[..., _BLOCK] / self.n_pairs if self.n_pairs else np.nan
        m_idx, l_idx, h_idx, p_idx = np.meshgrid(np.arange(2), np.arange(L), np.arange(H), np.arange(P), indexing="ij")
        counts = self.counts.cpu().numpy().ravel()
        table = pd.DataFrame(
            {
                "model": np.array(MODELS)[m_idx.ravel()],
                "layer": l_idx.ravel() + 1,
                "head": h_idx.ravel(),
                "pattern": np.array(PATTERNS)[p_idx.ravel()],
                "fraction": counts / self.n_examples,
                "count": counts,
                "n_examples": self.n_examples,
            }
        )
        for j, feat in enumerate(FEATURES):
            table[f"mean_{feat}"] = np.repeat(means[..., j].ravel(), P)
        table["n_pairs"] = self.n_pairs
        table["classifier"] = "rules" if self.classifier is None else "cnn"
        params = dict(self.params())
        params.update(n_examples=self.n_examples, n_pairs=self.n_pairs, feature_columns=list(FEATURE_COLUMNS))
        return Result(self.name, table, params)


def layer_mix(table: pd.DataFrame) -> pd.DataFrame:
    """``model, layer, pattern, fraction``: the class mix of each layer, averaged over its heads."""
    out = table.groupby(["model", "layer", "pattern"], as_index=False, sort=False)["fraction"].mean()
    order = {p: i for i, p in enumerate(PATTERNS)}
    key = out["pattern"].map(order).fillna(len(order))
    return (
        out.assign(_m=out["model"].map({m: i for i, m in enumerate(MODELS)}).fillna(len(MODELS)), _p=key)
        .sort_values(["_m", "model", "layer", "_p"])
        .drop(columns=["_m", "_p"])
        .reset_index(drop=True)
    )


def dominant_patterns(table: pd.DataFrame) -> pd.DataFrame:
    """``model, layer, head, pattern, fraction``: each head's most frequent pattern (ties: class order)."""
    order = {p: i for i, p in enumerate(PATTERNS)}
    t = table.assign(_p=table["pattern"].map(order)).sort_values(["model", "layer", "head", "fraction", "_p"],
                                                                 ascending=[True, True, True, False, True])
    return t.groupby(["model", "layer", "head"], as_index=False).first()[["model", "layer", "head", "pattern", "fraction"]]


def pattern_shift(table: pd.DataFrame) -> pd.DataFrame:
    """``layer, head, pattern, base, tuned, change``: per head and pattern, the fraction before and after."""
    wide = table.pivot_table(index=["layer", "head", "pattern"], columns="model", values="fraction").reset_index()
    for m in MODELS:
        if m not in wide.columns:
            wide[m] = np.nan
    wide["change"] = wide["tuned"] - wide["base"]
    wide.columns.name = None
    return wide[["layer", "head", "pattern", "base", "tuned", "change"]]


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """The share of maps of each pattern, base -> tuned."""
    share = weights_rows(tables["attention_patterns"]).groupby(["model", "pattern"])["fraction"].mean()
    return "attention patterns, share of maps base->tuned: " + " ".join(
        f"{p} {share.get(('base', p), float('nan')):.2f}->{share.get(('tuned', p), float('nan')):.2f}"
        for p in ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous"))


def _build(config: CompareConfig, ctx: BuildContext) -> AttentionPatterns:
    classifier = None
    if config.patterns_cnn:  # a CNN from `bertology patterns train` replaces the feature rules
        from bertology.analyses.pattern_classifier import PatternClassifier

        classifier = PatternClassifier.load(config.patterns_cnn)
    return AttentionPatterns(ctx.tokenizer, ctx.num_layers, ctx.num_heads, classifier=classifier)


SETTINGS = (
    Setting("patterns_cnn", None, "Pattern classifier from 'bertology patterns train' (default: the feature rules).",
            kind=str, paper="Kovaleva et al. 2019"),
)

SPEC = AnalysisSpec("attention_patterns", _build, ("attention_patterns",), summary=summary, settings=SETTINGS,
                    per_measure=True, seed_noise=SeedNoise(pairwise=False, extract=changes.attention_patterns))
