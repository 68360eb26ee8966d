"""Kovaleva et al. (2019, §4.1) attention pattern classes from transparent features of a map.

Kovaleva's five classes are *vertical* (attention to [CLS]/[SEP]/punctuation columns), *diagonal*
(attention to the token itself or its neighbours), *vertical+diagonal*, *block* (intra-sentence
attention in a sentence pair) and *heterogeneous*. Their CNN and hand labels were never released, so
this module classifies a map by rules on features that a person can check by looking at the map.

One map is one head's ``[n, n]`` attention of one example, cropped to its ``n`` real tokens (rows
attend; [CLS] and [SEP] count as queries and keys). The features (torch, over padded ``[B, H, T, T]``
maps with masks; padding keys hold exactly zero attention and padding query rows are ignored) are
fractions of the map's mass, averaged over query rows:

- ``diagonal``: mass on the band ``|q - k| <= band`` (``band = 1``: the token and its neighbours).
- ``vertical``: mass on *vertical keys* ([CLS], [SEP] and tokens made only of punctuation) **outside
  the band**. The band is counted first so that the two are disjoint (``vertical + diagonal <= 1``):
  otherwise an identity map of "[CLS] a film . [SEP]" would put 3/5 of its mass on vertical keys.
- ``block`` (sentence pairs only, NaN for one text): mass of content queries (tokens of either
  text, specials excluded) on keys of their own text. Kovaleva's block pattern is intra-sentence
  attention in a pair; in a single sentence the "block" is the whole map and cannot be told from
  heterogeneous attention, so block is never assigned to a single text.
- ``entropy``: the row's Shannon entropy divided by ``ln n`` (0 = one key, 1 = uniform).

With each come ``*_uniform``: the same feature of the uniform map of the same example (every row
``1/n``). The rules compare the **excess over uniform** ``(f - u) / (1 - u)`` (1 = all the mass
follows the pattern, 0 = no more than chance), so one threshold works for 10 and 100 tokens: the raw
band share of a uniform map is ``(3n - 2) / n^2``, 0.21 at 14 tokens and 0.05 at 60.

Rules (:class:`PatternThresholds`, the first that holds wins): vertical, diagonal,
vertical+diagonal, block, heterogeneous.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from bertology import transfer
from bertology.metrics.attention import DIAGONAL_OFFSETS, column_sums

#: The five classes, in the order of their integer codes.
PATTERNS: tuple[str, ...] = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
#: The four features of a map (fractions of its attention mass; entropy normalised to [0, 1]).
FEATURES: tuple[str, ...] = ("vertical", "diagonal", "block", "entropy")
#: What a uniform map of the same example gives for vertical, diagonal and block.
BASELINES: tuple[str, ...] = ("vertical_uniform", "diagonal_uniform", "block_uniform")
#: Columns of :func:`pattern_features`, in order.
FEATURE_COLUMNS: tuple[str, ...] = FEATURES + BASELINES
_V, _D, _B, _E, _VU, _DU, _BU = range(7)
VERTICAL, DIAGONAL, VERTICAL_DIAGONAL, BLOCK, HETEROGENEOUS = range(5)


@dataclass(frozen=True)
class PatternThresholds:
    """Thresholds of the rule classifier, on the excess over a uniform map (see :func:`excess`).

    With ``v``, ``d``, ``b`` the excess vertical, diagonal and block mass, the first rule that holds:

    - vertical: ``v >= vertical_min`` and ``d < other_max``;
    - diagonal: ``d >= diagonal_min`` and ``v < other_max``;
    - vertical+diagonal: ``v >= mixed_each_min``, ``d >= mixed_each_min`` and ``v + d >= mixed_sum_min``;
    - block (pairs only): ``b >= block_min``;
    - heterogeneous: everything else.

    ``band`` is the half-width of the diagonal band (1 = the token and its neighbours, Kovaleva's
    "previous/next token"). The defaults were set by looking at thumbnails of all-MiniLM-L6-v2 maps
    (400 maps of 20 SST-2 dev sentences, plus MRPC pairs): a [CLS]/[SEP]/punctuation stripe that a
    person calls vertical has ``v`` from about 0.3 (stripe plus scattered mass) to 0.8; a clean
    +-1 diagonal has ``d`` from 0.25 (broadened) to 1; a visible but faint diagonal next to a stripe
    has ``d`` of 0.12-0.3; maps that look unstructured stay below about 0.1 on both. A pair whose
    content tokens attend only inside their own sentence has ``b`` near 1; MiniLM, which was not
    trained on pairs, stays below 0.5 (so it shows no block maps).
    """

    vertical_min: float = 0.3
    diagonal_min: float = 0.25
    other_max: float = 0.12
    mixed_each_min: float = 0.12
    mixed_sum_min: float = 0.35
    block_min: float = 0.5
    band: int = 1

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"PatternThresholds.{name} must be a finite number, not {value!r}")
        if not isinstance(self.band, int) or self.band < 0:
            raise ValueError(f"PatternThresholds.band must be an integer >= 0, not {self.band!r}")

    def to_dict(self) -> dict[str, float | int]:
        return {k: (v if k == "band" else float(v)) for k, v in asdict(self).items()}


def pattern_features(
    attn: torch.Tensor,
    mask: torch.Tensor,
    vertical_keys: torch.Tensor,
    segment: torch.Tensor,
    row_entropy: torch.Tensor | None = None,
    band: int = 1,
    received: torch.Tensor | None = None,
) -> torch.Tensor:
    """Features ``[B, H, 7]`` (float64, columns :data:`FEATURE_COLUMNS`) of every map in a padded batch.

    ``attn`` is ``[B, H, T, T]`` (rows attend, padding keys exactly 0); ``mask`` ``[B, T]`` bool marks
    real tokens; ``vertical_keys`` ``[B, T]`` bool marks [CLS]/[SEP]/punctuation; ``segment`` ``[B, T]``
    int is 0/1 for the tokens of the first/second text and -1 for special tokens and padding.
    ``row_entropy`` (``[B, H, T]``, nats) and ``received`` (``[B, H, T]``, attention each key receives
    summed over real query rows) may be passed when already computed. ``band`` is the
    half-width of the diagonal band (1: keys q-1, q, q+1). ``block`` and ``block_uniform`` are NaN for
    examples without a second text.
    """
    sums = pattern_sums(attn, mask, vertical_keys, segment, row_entropy, band, received)
    return features_from_sums({k: v[None] for k, v in sums.items()}, mask, vertical_keys, segment, band)[0]


#: What :func:`pattern_sums` returns, per map (``[B, H]``), in float64.
SUMS: tuple[str, ...] = ("on_vertical", "band_v", "band", "entropy", "block")


def pattern_sums(
    attn: torch.Tensor,
    mask: torch.Tensor,
    vertical_keys: torch.Tensor,
    segment: torch.Tensor,
    row_entropy: torch.Tensor | None = None,
    band: int = 1,
    received: torch.Tensor | None = None,
    pairs: np.ndarray | None = None,
) -> dict[str, torch.Tensor]:
    """The sums over one layer's maps that :func:`pattern_features` divides (``[B, H]`` float64 each).

    The only part that reads the ``[B, H, T, T]`` maps; :func:`features_from_sums` turns the sums of
    many layers and models (stacked on a leading axis) into features at once. ``block`` is NaN for
    examples without a second text; ``pairs`` (host bool ``[B]``) says which rows are pairs (:func:`pair_rows`).
    """
    if band < 0:
        raise ValueError(f"band must be >= 0, not {band}")
    B, H, T, _ = attn.shape
    dt = attn.dtype
    f64 = torch.float64
    mask = mask.bool()
    real = mask.to(dt)  # [B, T]
    vkb = vertical_keys.bool() & mask
    vk = vkb.to(dt)
    # Band: diagonals -band..band of real query rows (a padding row holds whatever the model put
    # there, so rows are weighted by ``real``); the same restricted to vertical keys.
    band_sum = attn.new_zeros(B, H)
    band_v = attn.new_zeros(B, H)
    for o in range(-min(band, T - 1), min(band, T - 1) + 1):
        diag = attn.diagonal(o, -2, -1)  # [B, H, T-|o|]: A[q, q+o]
        rows = real[:, -o:] if o < 0 else real[:, : T - o]  # q
        keys = vk[:, : T + o] if o < 0 else vk[:, o:]  # q + o
        band_sum += (diag * rows[:, None]).sum(-1)
        band_v += (diag * (rows * keys)[:, None]).sum(-1)
    if received is None:
        received = column_sums(attn, real)  # [B, H, T]: attention each key receives
    on_vertical = torch.einsum("bhk,bk->bh", received, vk)
    block = block_sums(attn, mask, segment, pairs)
    if row_entropy is None:
        row_entropy = -torch.linalg.vecdot(attn, torch.log(attn.clamp_min(torch.finfo(dt).tiny)))
    ent = (row_entropy.to(f64) * mask.to(f64)[:, None]).sum(-1)
    return {"on_vertical": on_vertical.to(f64), "band_v": band_v.to(f64), "band": band_sum.to(f64),
            "entropy": ent, "block": block}


def pair_rows(segment: torch.Tensor, mask: torch.Tensor, pairs: np.ndarray | None = None) -> torch.Tensor | None:
    """Positions ``[b]`` (int64, on ``segment``'s device) of the batch's sentence pairs, or None when there are none.

    ``pairs`` (``[B]`` bool, on the host: e.g. from the items' segments) says which rows are pairs without
    reading the device; without it the rows are found from ``segment`` and ``mask`` (on a GPU a device sync:
    the number of pairs sizes the result).
    """
    if pairs is None:
        pairs = ((segment == 1) & mask.bool()).any(-1).cpu().numpy()
    rows = np.flatnonzero(np.asarray(pairs, dtype=bool))
    return transfer.send(rows, segment.device, torch.long) if len(rows) else None


def block_sums(attn: torch.Tensor, mask: torch.Tensor, segment: torch.Tensor, pairs: np.ndarray | None = None) -> torch.Tensor:
    """``[B, H]`` float64: the mass of content queries on their own segment (NaN for single texts).

    ``pairs``: which rows are sentence pairs, as a host array (:func:`pair_rows`; saves a device sync).
    """
    B, H = attn.shape[:2]
    mask = mask.bool()
    block = torch.full((B, H), float("nan"), dtype=torch.float64, device=attn.device)
    idx = pair_rows(segment, mask, pairs)
    if idx is not None:
        seg = segment[idx]
        content = (seg >= 0) & mask[idx]  # [b, T]; specials are in no segment
        same = (seg[:, :, None] == seg[:, None, :]) & content[:, :, None]  # [b, q, k]
        block[idx] = torch.einsum("bhqk,bqk->bhq", attn[idx], same.to(attn.dtype)).to(torch.float64).sum(-1)
    return block


def stacked_pattern_sums(
    received: torch.Tensor,
    diagonals: torch.Tensor,
    entropy_sum: torch.Tensor,
    mask: torch.Tensor,
    vertical_keys: torch.Tensor,
    band: int = 1,
) -> dict[str, torch.Tensor]:
    """:func:`pattern_sums` (without ``block``) for many maps at once, from the shared layer statistics.

    ``received`` ``[S, B, H, T]``, ``diagonals`` ``[S, B, H, T, 3]`` (``A[q, q + o]`` for ``o = -1, 0, 1``,
    zero on padding rows and outside the map) and ``entropy_sum`` ``[S, B, H]`` (row entropies summed
    over the real rows), as :func:`bertology.metrics.attention.layer_statistics` gives them, stacked
    over models and layers.
    A handful of operations per batch instead of a dozen per layer; ``band`` must be 0 or 1.
    """
    if band not in (0, 1):
        raise ValueError(f"stacked_pattern_sums needs band 0 or 1, not {band}")
    f64 = torch.float64
    mask = mask.bool()
    T = mask.shape[1]
    vk = (vertical_keys.bool() & mask).to(f64)  # [B, T]
    q = torch.arange(T, device=mask.device)
    keep = slice(1 - band, 2 + band)  # band 1: all of DIAGONAL_OFFSETS; band 0: the diagonal itself
    offsets = DIAGONAL_OFFSETS[keep]
    # vk of key q + o for each offset (0 outside the map)
    shifted = torch.stack([torch.where((q + o >= 0) & (q + o < T), vk[:, (q + o).clamp(0, T - 1)], 0.0) for o in offsets], -1)
    diag = diagonals[..., keep].to(f64)
    return {
        "on_vertical": (received.to(f64) * vk[:, None]).sum(-1),
        "band_v": (diag * shifted[:, None]).sum((-1, -2)),
        "band": diag.sum((-1, -2)),
        "entropy": entropy_sum.to(f64),
    }


def features_from_sums(
    sums: dict[str, torch.Tensor], mask: torch.Tensor, vertical_keys: torch.Tensor, segment: torch.Tensor, band: int = 1,
    pairs: np.ndarray | None = None,
) -> torch.Tensor:
    """Features ``[S, B, H, 7]`` (:data:`FEATURE_COLUMNS`) from :func:`pattern_sums` stacked to ``[S, B, H]``.

    ``pairs``: which rows are sentence pairs, as a host array (:func:`pair_rows`; saves a device sync).
    """
    mask = mask.bool()
    B, T = mask.shape
    first = sums["band"]
    S, dev, f64 = first.shape[0], first.device, torch.float64
    H = first.shape[-1]
    n = mask.sum(-1).to(f64)  # [B]
    nn_ = n[:, None]
    vkb = vertical_keys.bool() & mask
    out = torch.empty(S, B, H, len(FEATURE_COLUMNS), dtype=f64, device=dev)
    out[..., _V] = (sums["on_vertical"] - sums["band_v"]) / nn_
    out[..., _D] = sums["band"] / nn_
    # Uniform baselines: the same features of the map that spreads every row evenly over the n keys.
    # Real rows within the band of key k: min(k + band, n - 1) - max(k - band, 0) + 1.
    pos = torch.arange(T, device=dev, dtype=f64)
    near = torch.minimum(pos + band, n[:, None] - 1) - (pos - band).clamp_min(0) + 1  # [B, T]
    near = near.clamp_min(0) * mask
    out[..., _DU] = (near.sum(-1) / n**2)[:, None]
    out[..., _VU] = (((n[:, None] - near) * vkb).sum(-1) / n**2)[:, None]
    # Block: mass of content queries on their own segment (specials are in no segment).
    out[..., _B] = float("nan")
    out[..., _BU] = float("nan")
    idx = pair_rows(segment, mask, pairs)
    if idx is not None:
        seg = segment[idx]
        content = (seg >= 0) & mask[idx]  # [b, T]
        same = (seg[:, :, None] == seg[:, None, :]) & content[:, :, None]  # [b, q, k]
        nc = content.sum(-1).to(f64)  # [b]
        out[:, idx, :, _B] = sums["block"][:, idx] / nc[:, None]
        out[:, idx, :, _BU] = (same.sum((-2, -1)).to(f64) / n[idx] / nc)[:, None]
    # Entropy, normalised by ln n (a one-token map has entropy 0).
    out[..., _E] = sums["entropy"] / nn_ / torch.log(n.clamp_min(2.0))[:, None]
    return out


def excess(features: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``[..., 3]`` excess over a uniform map of vertical, diagonal and block: ``(f - u) / (1 - u)``.

    1 means all the mass follows the pattern, 0 no more than a uniform map; NaN block stays NaN.
    """
    f = torch.as_tensor(features, dtype=torch.float64)
    raw = f[..., [_V, _D, _B]]
    uni = f[..., [_VU, _DU, _BU]]
    return (raw - uni) / (1.0 - uni).clamp_min(1e-12)


def classify(features: torch.Tensor | np.ndarray, thresholds: PatternThresholds = PatternThresholds()) -> torch.Tensor:
    """Class codes (indices into :data:`PATTERNS`) of features ``[..., 7]`` by the rules of ``thresholds``."""
    ex = excess(features)
    v, d, blk = ex[..., 0], ex[..., 1], ex[..., 2]
    t = thresholds
    out = torch.full(v.shape, HETEROGENEOUS, dtype=torch.long, device=ex.device)
    # Applied in reverse priority so that the earlier rules overwrite the later ones; torch.where, not boolean-mask
    # assignment (which on a GPU reads the number of hits back to the host).
    rules = (
        (blk >= t.block_min, BLOCK),  # NaN (single text) compares False
        ((v >= t.mixed_each_min) & (d >= t.mixed_each_min) & (v + d >= t.mixed_sum_min), VERTICAL_DIAGONAL),
        ((d >= t.diagonal_min) & (v < t.other_max), DIAGONAL),
        ((v >= t.vertical_min) & (d < t.other_max), VERTICAL),
    )
    for hit, code in rules:
        out = torch.where(hit, code, out)
    return out


def features_one_map(a: np.ndarray, vertical_keys: np.ndarray, segment: np.ndarray, band: int = 1) -> np.ndarray:
    """Reference features of one cropped ``[n, n]`` map with plain loops (for tests and single maps).

    The uniform baselines are the same loops run on the uniform map.
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    vertical_keys = np.asarray(vertical_keys, dtype=bool)
    segment = np.asarray(segment)

    def raw(m: np.ndarray) -> tuple[float, float, float]:
        vertical = diagonal = 0.0
        for q in range(n):
            for k in range(n):
                if abs(q - k) <= band:
                    diagonal += m[q, k]
                elif vertical_keys[k]:
                    vertical += m[q, k]
        block = float("nan")
        if (segment == 1).any():
            total, nc = 0.0, 0
            for q in range(n):
                if segment[q] < 0:
                    continue
                nc += 1
                total += sum(m[q, k] for k in range(n) if segment[k] == segment[q])
            block = total / nc
        return vertical / n, diagonal / n, block

    entropy = 0.0
    for q in range(n):
        p = a[q][a[q] > 0]
        entropy += float(-(p * np.log(p)).sum())
    v, d, b = raw(a)
    vu, du, bu = raw(np.full((n, n), 1.0 / n))
    return np.array([v, d, b, entropy / n / math.log(max(n, 2)), vu, du, bu])
