"""The structural probes themselves and their training: every (model, layer, kind) probe in one stacked
tensor, trained together with per-probe Adam, learning-rate drops and early stopping, then scored.

Part of :mod:`bertology.experiments.probe` (which re-exports these names); see its docstring for the method.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertology.config import DEVICE_HELP
from bertology.errors import BertologyError
from bertology.settings import check_fields, setting_field, seed_field
from bertology.metrics.trees import score_depths, score_distances
from bertology.results import atomic_write
from bertology.state_files import load_state, save_state

from bertology.experiments.probe_features import FEATURE_DTYPES
from bertology.experiments.probe_trees import PUNCTUATION_RULES, TreeSet, _probe_seed

logger = logging.getLogger(__name__)

KINDS = ("distance", "depth")
COLUMNS = ["model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr", "loss", "n_sentences",
           "rank", "epochs", "best_epoch", "best_dev_loss"]

ProgressFn = Callable[[str, int, int], None]


HEWITT = "Hewitt & Manning 2019"
#: What ``bertology probe`` and compare's probe experiment both declare (``--rank`` there, ``--probe-rank`` here).
RANK_HELP = "Rank of the probe matrix (0 = full rank, the hidden size); the paper's probes saturate at 64-128."
EPOCHS_HELP = "Most training epochs of each probe; each stops early on its own dev loss."


def _layers(text: str) -> tuple[int, ...] | None:
    from bertology.progress import parse_layer_list

    return parse_layer_list(text, "layer numbers (0 = embeddings)")


def _kinds(text: str) -> tuple[str, ...]:
    """``distance,depth`` -> the tuple; ``none`` -> () (no structural probe: token probes alone, e.g. on a tag
    file without trees)."""
    kinds = tuple(x.strip() for x in text.split(",") if x.strip())
    return () if kinds == ("none",) else kinds


@dataclass
class ProbeSettings:
    """Every choice that changes the probe numbers (recorded in the manifest); ``bertology probe``'s flags are
    generated from the fields made with :func:`~bertology.settings.setting_field`."""

    rank: int | None = setting_field(128, RANK_HELP, minimum=1, zero_is_none=True, paper=HEWITT)  # capped at the hidden size
    layers: tuple[int, ...] | None = setting_field(  # None: every layer 0..N (0 = embedding output)
        None, "Comma list of layers (0 = embeddings) or 'all' (default).", kind=tuple, parse=_layers, metavar="LAYERS")
    probes: tuple[str, ...] = setting_field(KINDS, "Which structural probes: distance, depth, both, or none (token "
                                            "probes alone, e.g. on a tag file without trees).", choices=KINDS,
                                            parse=_kinds, metavar="distance,depth|none", paper=HEWITT)
    epochs: int = setting_field(30, EPOCHS_HELP, minimum=1)
    batch_size: int = setting_field(20, "Sentences per training step (the paper: 20).", minimum=1, paper=HEWITT)
    extract_batch_size: int = setting_field(32, "Sentences per forward pass.", minimum=1)
    lr: float = setting_field(1e-3, "Adam learning rate (divided by 10 on a dev plateau).", above=0)
    lr_factor: float = 0.1  # learning rate multiplied by this when the dev loss does not improve
    lr_patience: int = 0  # epochs without improvement before the learning rate drops
    patience: int = setting_field(5, "Stop a probe after this many epochs without dev improvement.", minimum=1)
    min_delta: float = 1e-4  # an improvement must beat the best dev loss by this much
    dev_fraction: float = 0.1  # share of train held out as dev when no dev set is given
    seed: int = seed_field("Seed of the dev split, probe initialisation, batch order and the random control.")
    n_bootstrap: int = setting_field(1000, "Bootstrap resamples of the test sentences for the scores' 95% intervals "
                                     "(0 = none).", minimum=0)
    device: str = setting_field("cpu", DEVICE_HELP, changes_numbers=False)  # results agree across devices to rounding
    max_length: int = setting_field(512, "Skip sentences longer than this many tokens (counted).", minimum=1)
    punct_upos: tuple[str, ...] = ("PUNCT",)  # left out of UUAS and root accuracy
    # upos: punct_upos; hewitt2019: XPOS in HEWITT_PUNCT_XPOS (the probe_punctuation convention); None: upos
    punctuation: str = setting_field(
        None, "Words UUAS and root accuracy leave out: upos (UPOS PUNCT, bertology) or hewitt2019 (their PTB XPOS list); "
        "default: the preset's.", kind=str, choices=PUNCTUATION_RULES, flag="--probe-punctuation", paper=HEWITT)
    init_scale: float = 0.05  # initial weights ~ U(-init_scale, init_scale), as Hewitt & Manning
    feature_dtype: str = setting_field(  # probes train in float32 either way
        "float32", "How word features are held (memory-mapped from the run's partial/ folder): float32, or float16 for "
        "half the disk and page cache (each value within 2^-11 relative; probe scores move by about half of what "
        "another seed does). Probes train in float32 either way.", choices=tuple(FEATURE_DTYPES))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.punctuation is None:
            self.punctuation = "upos"
        if self.lr_patience < 0:
            raise BertologyError(f"lr_patience must be >= 0, not {self.lr_patience}.")
        if not 0 < self.dev_fraction < 1:
            raise BertologyError(f"dev_fraction must be in (0, 1), not {self.dev_fraction}.")
        if self.layers is not None:
            self.layers = tuple(sorted({int(x) for x in self.layers}))

    def to_dict(self) -> dict:
        return asdict(self)


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


@dataclass(frozen=True)
class ProbeData:
    """One split as the probes read it: its trees and each model's word features of them (``features[model]``:
    ``[n_layers, n_words, hidden]``)."""

    features: Mapping[str, torch.Tensor]
    trees: TreeSet


def fit_probes(
    keys: Sequence[tuple[str, int, str]],
    layer_index: Mapping[tuple[str, int], int],
    train: ProbeData,
    dev: ProbeData,
    settings: ProbeSettings,
    *,
    checkpoint: Path | None = None,
    on_epoch: Callable[[int, int], None] | None = None,
) -> ProbeStack:
    """Train every probe in ``keys`` ((model, layer, kind)) together on ``train``, stopping each on its ``dev`` loss;
    see the module docstring.

    ``layer_index[(model, layer)]`` is the row of a layer in a split's features (:class:`ProbeData`). With
    ``checkpoint`` the full training state is saved after every epoch and a matching earlier state is resumed.
    """
    train_feats, dev_feats = train.features, dev.features
    train_trees, dev_trees = train.trees, dev.trees
    device = torch.device(settings.device)
    hidden = next(iter(train_feats.values())).shape[-1]
    rank = min(settings.rank or hidden, hidden)
    layout = _Layout(keys, layer_index)
    w0 = torch.stack([init_probe(k, rank, hidden, settings.seed, settings.init_scale) for k in keys]).to(device)
    tr = _StackTrainer(w0.requires_grad_(True), settings)
    tag = hashlib.sha256(json.dumps([list(map(list, keys)), settings.to_dict(), train_trees.fingerprint(), dev_trees.fingerprint()],
                                    default=str).encode()).hexdigest()
    if checkpoint is not None and checkpoint.exists():
        saved = load_state(checkpoint, map_location=device, remedy=f"Delete {checkpoint} to train the probes afresh.")
        if saved.get("tag") == tag:
            tr.load(saved["state"])
            logger.info("resuming probe training after epoch %d", tr.epoch)
    t0 = time.perf_counter()
    epoch_seconds = []
    while tr.epoch < settings.epochs and tr.active.any():
        te = time.perf_counter()
        order = epoch_order(len(train_trees), settings.seed, tr.epoch)
        # only the probes still training are computed (their rows of the stack); the others get no gradient
        act = np.nonzero(tr.active)[0]
        act_t = torch.as_tensor(act, device=device)
        sub = layout if len(act) == len(keys) else _Layout([keys[i] for i in act], layer_index)
        for s in range(0, len(order), settings.batch_size):
            idx = order[s : s + settings.batch_size]
            batch = _batch_tensors(train_trees, idx, device)
            x = _gather(train_feats, sub.slots, batch["words"], device)
            w = tr.w if sub is layout else tr.w.index_select(0, act_t)
            loss = probe_losses(sub.project(w, x), sub.kinds, batch).sum()
            tr.w.grad = None
            loss.backward()
            tr.adam(tr.w.grad)
        dev_loss = np.full(len(keys), np.nan)
        dev_loss[act] = _dataset_loss(tr.w.detach()[act_t], sub, dev_feats, dev_trees, settings.batch_size, device)
        tr.end_epoch(dev_loss)
        epoch_seconds.append(time.perf_counter() - te)
        if checkpoint is not None:
            atomic_write(checkpoint, lambda p: save_state({"tag": tag, "state": tr.state()}, p))
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
    n_bootstrap: int = 0,
    seed: int = 0,
) -> list[dict]:
    """Scores of every probe on one split: one dict per probe (see :data:`COLUMNS`), with 95% percentile intervals
    over ``n_bootstrap`` resamples of the sentences (the same resamples for every probe)."""
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
               **{m: np.nan for m in ("uuas", "dspr", "root_acc", "nspr")}}
        row.update({f"{m}_ci_{end}": np.nan for m in ("uuas", "dspr", "root_acc", "nspr") for end in ("low", "high")})
        if kind == "distance":
            sc = score_distances(preds[p], trees.heads, trees.keep, golds=trees.distances, n_bootstrap=n_bootstrap,
                                 seed=seed)
            metrics = ("uuas", "dspr")
        else:
            sc = score_depths(preds[p], trees.heads, trees.keep, golds=trees.depths, n_bootstrap=n_bootstrap, seed=seed)
            metrics = ("root_acc", "nspr")
        for m in metrics:
            row[m] = sc[m]
            if f"{m}_ci" in sc:
                row[f"{m}_ci_low"], row[f"{m}_ci_high"] = sc[f"{m}_ci"]
        row.update(loss=float(loss[p]), n_sentences=len(trees), rank=int(stack.weights.shape[1]),
                   epochs=int(stack.epochs[p]), best_epoch=int(stack.best_epoch[p]),
                   best_dev_loss=float(stack.best_dev_loss[p]))
        rows.append(row)
    return rows
