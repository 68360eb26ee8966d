"""The ablation sweep: disable each head and each layer of a fine-tuned model and score the task.

For a labelled corpus, :func:`run_ablation` scores the intact model, then every single head disabled
(``target="head"``) and every layer disabled (``target="layer"``), each in its own forward pass over
all examples, and keeps per-example predictions and losses. :func:`score_units` turns them into the
``ablation`` table: accuracy, macro-F1 and mean cross-entropy, their deltas (ablated − intact) and
paired bootstrap 95% confidence intervals of the deltas (the same seeded resamples of examples for
every ablation).

Conventions (table ``ablation``, DESIGN §3):

* ``target`` is ``intact``, ``head`` or ``layer``; ``layer`` is 1-based and ``head`` 0-based; ``head``
  is -1 on layer and intact rows, ``layer`` is -1 on intact rows.
* ``mode`` is the head ablation mode (``uniform`` 1/L attention, Kovaleva et al. 2019; ``zero``;
  ``mean``; see :mod:`bertology.models.ablate`), or ``revert`` (the base model's weights put back into the
  unit: :mod:`bertology.experiments.revert_sweep`), and ``exclude_special`` whether [CLS]/[SEP] were left
  out of the uniform average. ``layer_mode`` on layer rows is ``skip`` (the block returns its input)
  or ``{mode}_heads`` (every head of the layer ablated with ``mode``); in revert mode it is
  ``revert_attention``, ``revert_ffn``, ``revert_layer``, or ``revert_embeddings`` (on layer 0, the
  embeddings); it is empty on other rows.
* ``n_predicted`` is how many distinct classes the unit predicts over the examples and ``chance`` the
  majority-class rate of the labels (the same on every row): with the intact row they say whether the
  classifier is degenerate (:func:`bertology.experiments.degenerate.table_degeneracy`), in which case no head or layer can be called needed.
* ``helps`` means the removal improves the metric beyond the 95% interval: ``ci_low > 0`` for
  accuracy and macro-F1, ``ci_high < 0`` for loss (lower is better); ``hurts`` is the opposite.

Speed (DESIGN §6): the ``cached`` method runs the layers below an ablated layer once. Layer by layer,
it keeps the hidden states entering block ``l`` for every batch, runs each ablation at layer ``l``
from there (the blocks below are bypassed and block 1 receives the cached states), and
advances the cache through the intact block ``l``. Skipping block ``l`` is starting at ``l + 1`` from
the same cache. The ablated layer's own attention is replayed from the intact pass (only the
ablated heads' outputs are recomputed). Every matrix product has the shape it has in the ``naive``
method (a full forward per ablation with the same hooks), so the results equal it bit for bit.
``first_token_shortcut=True`` lets the last block's feed-forward run on the first token only (see
:func:`run_ablation`), equal to the naive re-run to float rounding.

Batched (``SweepPlan.units_per_forward`` = K > 1; auto: up to 8 on CUDA, 1 on the CPU): the head units of one layer
(single heads and the ``heads`` layer unit) run K at a time, in one forward over the batch's rows repeated K times
(the cached hidden states, the inputs and the replayed attention output alike), unit k's heads ablated in rows
``[k*B, (k+1)*B)`` (:func:`~bertology.models.ablate.ablate_head_groups`); the logits are split back per unit, so
every unit is still recorded and reported on its own. Both methods batch; ``skip`` units, and the revert and
transplant sweeps, run one unit per forward. Larger products round differently, so a batched sweep equals the
one-unit sweep to float rounding only (a few ulp of the logits; tests/unit/test_ablation_batched.py).

Resuming: with ``progress_dir``, every finished ablation is written there atomically as
``units/<key>.npz`` (per-example predictions and losses) next to ``progress.json`` (a fingerprint of
the model weights, the tokenised data, the labels and the settings, K among them when above 1). A later call with
the same fingerprint skips the finished ablations; with another fingerprint the old files are discarded.

The units and their plan are in :mod:`bertology.experiments.ablation_units`, the table they score into in
:mod:`bertology.experiments.ablation_table`; the settings of a whole study, its headlines and the experiment inside
``compare`` are in :mod:`bertology.experiments.ablation`, which re-exports the public names of all three.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import torch

from bertology.data.encode import EncodedCorpus
from bertology.models import sites
from bertology.models.ablate import (
    ablate_head_groups,
    keep_first_token,
    needs_means,
    replay_output,
    skip_layers,
)
from bertology.experiments.ablation_table import AblationResult, Bootstrap, degeneracy_record, score_units
from bertology.experiments.ablation_units import SweepPlan, Unit, plan_units
from bertology.experiments.layer_cache import embedded, run_from
from bertology.experiments.scoring import (
    Batches,
    HeadScoring,
    ProgressStore,
    _logits,
    _MeanAccumulator,
    _record,
    classifier_batches,
    fingerprint_of,
    head_means,
    split_rows,
    tile_rows,
)

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------------


class _Sweep:
    """Runs the units of one sweep with the naive or the cached method."""

    def __init__(
        self,
        model: torch.nn.Module,
        batches: Batches,
        store: ProgressStore,
        scoring: HeadScoring,
        planned: Sequence[Unit],
        *,
        on_unit: Callable[[Unit, int, int], None] | None,
        first_token_shortcut: bool = False,
        units_per_forward: int = 1,
    ) -> None:
        """``planned``: every unit of the sweep, finished (in ``store``) or not; ``on_unit(unit, done, total)`` after
        each finished one."""
        self.model, self.batches, self.store = model, batches, store
        self.mode, self.exclude_special, self.special_ids = scoring.mode, scoring.exclude_special, scoring.special_ids
        self.means = scoring.means
        self.on_unit = on_unit
        self.total = len(planned)
        self.done = 0 if store is None else sum(u.key in store for u in planned)
        self.n_layers = sites.num_layers(model)
        self.n_heads = sites.num_heads(model)
        self.allow_first_token_shortcut = first_token_shortcut
        self.units_per_forward = units_per_forward
        self.planned = planned  # the groups are cut from it
        # (batches whose last block ran on [CLS] only, batches) in the cached sweep; None when it did not run
        self.first_token_shortcut: tuple[int, int] | None = None

    # ------------------------------------------------------------------ shared
    def _heads_of(self, unit: Unit) -> list[tuple[int, int]]:
        if unit.target == "head":
            return [(unit.layer, unit.head)]
        if unit.target == "layer" and unit.layer_mode == "heads":
            return [(unit.layer, h) for h in range(self.n_heads)]
        return []

    def _ablation(self, group: Sequence[Unit], means: torch.Tensor | None):
        """The hooks of a group of units scored by one forward: unit ``k``'s heads in row group ``k``."""
        return ablate_head_groups(
            self.model, [self._heads_of(u) for u in group], self.mode, exclude_special=self.exclude_special,
            special_ids=self.special_ids, means=means,
        )

    def _groups(self, pending: Sequence[Unit]) -> list[list[Unit]]:
        """The units that share a forward, in the order they run: the head units of one layer (single heads and the
        ``heads`` layer unit) ``units_per_forward`` at a time, every other unit (intact, ``skip``) alone.

        The groups are cut from the sweep's planned units, finished or not, so a resumed sweep runs the groups an
        uninterrupted one runs (the same matrix shapes, hence the same bits); a group's finished units are run
        again and not recorded. With one unit per forward every pending unit is its own group, in plan order.
        """
        k, todo = self.units_per_forward, {u.key for u in pending}
        plan = list(self.planned)
        together: dict[int, list[Unit]] = {}
        for u in plan:
            if k > 1 and self._heads_of(u):
                together.setdefault(u.layer, []).append(u)
        first: dict[str, list[Unit]] = {}  # a group by the key of its first unit
        for units in together.values():
            for i in range(0, len(units), k):
                group = units[i:i + k]
                if any(u.key in todo for u in group):
                    first[group[0].key] = group
        return [first[u.key] if u.key in first else [u] for u in plan
                if u.key in first or (u.key in todo and not (k > 1 and self._heads_of(u)))]

    def _finish_group(self, group: Sequence[Unit], logits: list[list[torch.Tensor]], pending: Collection[str]) -> None:
        """Record the pending units of a group from their row group's logits (``logits[k]``: unit ``k``'s batches)."""
        for unit, lg in zip(group, logits, strict=True):
            if unit.key in pending:
                self._finish(unit, lg)

    def _finish(self, unit: Unit, logits: list[torch.Tensor]) -> None:
        self.store.save(unit.key, **_record(self.batches, logits, unit.key))
        self.done += 1
        if self.on_unit is not None:
            self.on_unit(unit, self.done, self.total)

    def _need_means(self, units: Sequence[Unit]) -> bool:
        return needs_means(self.mode) and self.means is None and any(self._heads_of(u) for u in units)

    # ------------------------------------------------------------------ naive
    def naive(self, units: Sequence[Unit]) -> None:
        """A full forward of every batch per group of units (:meth:`_groups`), with the group's hooks."""
        means = self.means
        if self._need_means(units):
            means = head_means(self.model, self.batches)
        pending = {u.key for u in units}
        with torch.inference_mode():
            for group in self._groups(units):
                k = len(group)
                skip = group[0].layer_mode == "skip"
                with skip_layers(self.model, [group[0].layer]) if skip else self._ablation(group, means):
                    logits = [_logits(self.model, tile_rows(inp, k)) for inp in self.batches.inputs]
                self._finish_group(group, split_rows(logits, k), pending)

    # ------------------------------------------------------------------ cached
    def _first_token_shortcut_ok(self) -> list[bool]:
        """With ``first_token_shortcut=True``: per batch, whether the last block may run its feed-forward on
        the first token only (never for a token-level head). The batch's intact logits and last-block
        first-token output must be bit-identical with and without the shortcut.

        The shortcut changes the shape of the feed-forward's matrix products, and BLAS builds (MKL, cuBLAS)
        pick kernels, so summation orders, by shape (on our development CPU a batch of 3 x 7 tokens rounds
        differently, larger ones do not); a batch where the intact model shows that runs the full last block.
        Passing is not proof for the ablated units (on tiny RoBERTa models a passing batch still gave 6e-10
        loss differences), so this path equals the naive re-run to float rounding; the default sweep never
        takes the shortcut. The check costs two forwards of the corpus.
        """
        n = len(self.batches.inputs)
        if self.batches.task.token_level:
            return [False] * n
        last = sites.block(self.model, self.n_layers)
        ok, rounds = [], 0.0
        for inp in self.batches.inputs:
            first: list[torch.Tensor] = []
            handle = last.register_forward_hook(
                lambda _m, _i, out: first.append((out[0] if isinstance(out, tuple) else out)[:, 0]))
            try:
                full = _logits(self.model, inp)
                with keep_first_token(self.model):
                    short = _logits(self.model, inp)
            finally:
                handle.remove()
            if full.shape != short.shape or not torch.allclose(full, short, rtol=1e-4, atol=1e-5):
                logger.info("the classifier reads more than the first token; the last block runs on every token")
                return [False] * n
            same = torch.equal(full, short) and torch.equal(first[0], first[1])
            if not same:
                rounds = max(rounds, float((first[0] - first[1]).abs().max()), float((full - short).abs().max()))
            ok.append(same)
        if rounds > 0.0:
            logger.info("on %d of %d batches this machine's matrix kernels round the one-token feed-forward "
                        "differently (up to %.2g): those run the full last block", n - sum(ok), n, rounds)
        return ok

    def _run_from(self, start: int, cache: list[torch.Tensor], *, shortcut: Sequence[bool] | None = None,
                  stop: int | None = None, extra=None, repeat: int = 1) -> list[torch.Tensor]:
        """Logits of every batch entering block ``start`` with the cached hidden states (:func:`layer_cache.run_from`)."""
        return run_from(self.model, self.batches, start, cache, stop=stop, shortcut=shortcut, extra=extra, repeat=repeat)

    def cached(self, units: Sequence[Unit]) -> None:
        """Layer by layer from cached hidden states; see the module docstring."""
        model, n = self.model, self.n_layers
        pending = {u.key for u in units}
        by_layer: dict[int, list[list[Unit]]] = {}  # the groups of units (:meth:`_groups`) at each layer
        intact = [u for u in units if u.target == "intact"]
        for group in self._groups(units):
            if group[0].target != "intact":
                by_layer.setdefault(group[0].layer, []).append(group)
        tops = ([n] if intact else []) + list(by_layer)
        if not tops:
            return
        top = max(tops)
        n_heads, head_size = sites.num_heads(model), sites.head_size(model)
        with torch.inference_mode():
            shortcut = (self._first_token_shortcut_ok() if self.allow_first_token_shortcut
                        else [False] * len(self.batches.inputs))
            self.first_token_shortcut = (sum(shortcut), len(shortcut))
            cache = embedded(model, self.batches)  # hidden states entering block 1 (hidden state 0)
            for layer in range(1, top + 1):
                todo = by_layer.get(layer, [])
                need_means = self._need_means([u for group in todo for u in group])
                acc = _MeanAccumulator(n, n_heads, head_size) if need_means else None
                nxt: list[torch.Tensor] = []
                contexts: list[tuple] = []  # the intact attention.self outputs of this layer, replayed for head ablations
                replay = any(self._heads_of(u) for group in todo for u in group)
                advance = layer < top or need_means or replay or (layer == n and intact)
                if advance:
                    handles = [sites.block(model, layer).register_forward_hook(
                        lambda _m, _i, out: nxt.append(out[0] if isinstance(out, tuple) else out)
                    )]
                    if replay:
                        handles.append(sites.attention(model, layer).register_forward_hook(
                            lambda _m, _i, out: contexts.append((out[0], None, *out[2:]))
                        ))
                    if acc is not None:
                        handles.append(sites.out_proj(model, layer).register_forward_pre_hook(acc.hook(layer)))

                    def set_mask(b: int) -> None:
                        if acc is not None:
                            acc.mask = self.batches.mask[b]

                    try:
                        logits = self._run_from(layer, cache, stop=layer, extra=set_mask)
                    finally:
                        for h in handles:
                            h.remove()
                    if layer == n and intact:
                        self._finish(intact[0], logits)
                means = self.means if acc is None else acc.means()
                for group in todo:
                    k = len(group)
                    if group[0].layer_mode == "skip":
                        logits = self._run_from(layer + 1, cache, shortcut=shortcut)
                    else:  # k units at once: the batch's rows k times over, unit j's heads ablated in row group j
                        with replay_output(sites.attention(model, layer)) as rp, self._ablation(group, means):
                            logits = self._run_from(layer, cache, shortcut=shortcut, repeat=k,
                                                    extra=lambda b: rp.set(tile_rows(contexts[b], k)))
                    self._finish_group(group, split_rows(logits, k), pending)
                cache = nxt


#: The most units one forward scores on CUDA when ``units_per_forward`` is not given (fewer when memory is short).
AUTO_UNITS_ON_CUDA = 8


def _method_for(model: torch.nn.Module, method: str) -> str:
    """The sweep's method: ``cached`` unless the family's blocks cannot be bypassed or replayed (then ``naive``)."""
    if method not in ("cached", "naive"):
        raise ValueError(f"method must be 'cached' or 'naive', not {method!r}")
    if method == "cached" and not sites.adapter(model).cached_sweep:
        logger.info("ablation: %s blocks cannot be bypassed or replayed; using the plain sweep", sites.adapter(model).family)
        return "naive"
    return method


def _fingerprint_settings(scoring: HeadScoring, first_token_shortcut: bool, units_per_forward: int) -> dict:
    """What of the sweep's settings enters the unit store's fingerprint (finished units resume under an equal one)."""
    means = scoring.means
    fp_settings = {
        "mode": scoring.mode, "exclude_special": scoring.exclude_special, "special_ids": sorted(scoring.special_ids),
        "batch_size": scoring.batch_size,
        "means": None if means is None else hashlib.sha256(means.detach().cpu().numpy().tobytes()).hexdigest(),
    }
    if first_token_shortcut:  # other rounding (cached sweep only): not resumed into an exact sweep, nor back
        fp_settings["first_token_shortcut"] = True
    if units_per_forward > 1:  # other shapes, other rounding; a one-unit sweep keeps the fingerprint it always had
        fp_settings["units_per_forward"] = units_per_forward
    return fp_settings


def units_per_forward_for(setting: int | None, model: torch.nn.Module, batches: Batches, *,
                          device: torch.device | None = None, memory_bytes: int | None = None) -> int:
    """The K a sweep runs: ``setting`` when given; else 1 off CUDA (a CPU gains nothing from larger products, and
    one unit per forward keeps the cached sweep equal to the naive one bit for bit), and on CUDA
    :data:`AUTO_UNITS_ON_CUDA`, fewer when a quarter of the device's memory (``memory_bytes``, default its total)
    holds fewer copies of one forward's largest activations (:func:`forward_bytes`). The device's total, not what
    is free now: free memory moves with other processes, and a K that moved between runs would change the unit
    store's fingerprint, so an interrupted sweep would start over instead of resuming. ``device``: where the
    batches are (default: read from them)."""
    if setting is not None:
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ValueError(f"units_per_forward must be a whole number >= 1 or None (auto), not {setting!r}")
        return setting
    if device is None:
        device = batches.inputs[0]["input_ids"].device if batches.inputs else torch.device("cpu")
    if device.type != "cuda":
        return 1
    total = torch.cuda.get_device_properties(device).total_memory if memory_bytes is None else memory_bytes
    return int(max(1, min(AUTO_UNITS_ON_CUDA, total // (4 * max(1, forward_bytes(model, batches))))))


def forward_bytes(model: torch.nn.Module, batches: Batches) -> int:
    """Bytes of the activations one block holds at once for the largest batch, one unit per forward: the hidden
    states and the attention output (4 x hidden), the feed-forward's intermediate, the scores and probabilities
    (2 x heads x T x T per row). An estimate for :func:`units_per_forward_for`, not a measurement."""
    cfg = model.config
    hidden = int(getattr(cfg, "hidden_size"))
    inner = int(getattr(cfg, "intermediate_size", 4 * hidden) or 4 * hidden)
    heads = sites.num_heads(model)
    size = next(model.parameters()).element_size()
    most = 0
    for inp in batches.inputs:
        rows, t = inp["input_ids"].shape[:2]
        most = max(most, rows * t * (4 * hidden + inner) + 2 * rows * heads * t * t)
    return most * size


def run_ablation(
    model: torch.nn.Module,
    encoded: EncodedCorpus,
    label_ids: np.ndarray | Sequence[int],
    scoring: HeadScoring = HeadScoring(),
    *,
    sweep: SweepPlan = SweepPlan(),
    n_bootstrap: int = 1000,
    seed: int = 0,
    progress_dir: str | Path | None = None,
    on_unit: Callable[[Unit, int, int], None] | None = None,
) -> AblationResult:
    """Score the intact model and every ablation ``sweep`` plans (:class:`SweepPlan`); return the ``ablation`` table.

    ``label_ids`` are in corpus order (indexed by ``EncodedExample.index``; see :func:`label_ids_for`);
    ``scoring`` says how heads are disabled and the model is run (:class:`HeadScoring`).
    ``on_unit(unit, done, total)`` is called after every finished ablation (progress bars; raising in
    it interrupts the sweep, which ``progress_dir`` lets a later call resume).
    """
    layers, heads, layer_modes = sweep.layers, sweep.heads, sweep.layer_modes
    first_token_shortcut = sweep.first_token_shortcut
    t0 = time.perf_counter()
    mode, exclude_special = scoring.mode, scoring.exclude_special
    batches = classifier_batches(model, encoded, label_ids, scoring)
    n_layers, n_heads = sites.num_layers(model), sites.num_heads(model)
    method = _method_for(model, sweep.method)
    units = plan_units(n_layers, n_heads, layers=layers, heads=heads, layer_modes=layer_modes)
    units_per_forward = units_per_forward_for(sweep.units_per_forward, model, batches)
    fp_settings = _fingerprint_settings(scoring, first_token_shortcut and method == "cached", units_per_forward)
    store = ProgressStore(progress_dir, fingerprint_of(model, batches, fp_settings))
    pending = [u for u in units if u.key not in store]
    logger.info("ablation: %d of %d units to run (%s method)", len(pending), len(units), method)
    runner = _Sweep(model, batches, store, scoring, units, on_unit=on_unit, first_token_shortcut=first_token_shortcut,
                    units_per_forward=units_per_forward)
    t1 = time.perf_counter()
    if pending:
        (runner.cached if method == "cached" else runner.naive)(pending)
    t2 = time.perf_counter()
    per_example = {u.key: store.get(u.key) for u in units}
    params = {
        "mode": mode,
        "exclude_special": exclude_special,
        "layers": None if layers is None else sorted(int(x) for x in layers),
        "heads": heads,
        "layer_modes": list(layer_modes),
        "layer_mode_names": {"skip": "skip", "heads": f"{mode}_heads"},
        "batch_size": scoring.batch_size,
        "n_bootstrap": n_bootstrap,
        "seed": seed,
        "method": method,
        # whether the cached sweep ran the last block's feed-forward on the first token only, and on how many
        # batches (first_token_shortcut=True: where a batch's intact outputs were bit-identical with it); None
        # when the cached sweep did not run
        "first_token_shortcut": None if runner.first_token_shortcut is None else runner.first_token_shortcut[0] > 0,
        "first_token_shortcut_batches": None if runner.first_token_shortcut is None else list(runner.first_token_shortcut),
        # how many head units one forward scored (SweepPlan.units_per_forward: given, or chosen for the device)
        "units_per_forward": units_per_forward,
        "n_examples": len(batches.y_examples),
        "n_layers": n_layers,
        "n_heads": n_heads,
        "fingerprint": store.fingerprint,
        "resumed_units": len(units) - len(pending),
        "delta": "ablated minus intact; helps = ci_low > 0 where higher is better, ci_high < 0 where lower is",
    }
    table = score_units(
        units, per_example, batches.y_examples, task=batches.task, mode=mode,
        exclude_special=exclude_special, bootstrap=Bootstrap(n_bootstrap, seed),
    )
    params["task"] = batches.task.name
    params["main_metric"] = batches.task.primary
    params["degenerate"] = degeneracy_record(table, per_example["intact"]["pred"], model.config)
    if params["degenerate"]["flagged"]:
        logger.warning("ablation: %s", params["degenerate"]["note"])
    t3 = time.perf_counter()
    timing = {"setup_s": t1 - t0, "sweep_s": t2 - t1, "scoring_s": t3 - t2}
    return AblationResult(table, units, per_example, batches.y_examples, params, timing)
