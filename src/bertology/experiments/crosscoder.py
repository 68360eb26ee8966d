"""What fine-tuning added, latent by latent: a BatchTopK crosscoder over base and tuned activations.

At each chosen layer (default: a middle one, ``num_layers // 2``, and the last; ``hidden_states[layer]``, the
output of block ``layer``) one crosscoder (:mod:`bertology.experiments.crosscoder_model`) is trained on both
models' activations of the run's content tokens (padding, ``[CLS]``, ``[SEP]`` and the other special tokens
excluded), streamed through a bounded shuffled buffer (:mod:`bertology.experiments.crosscoder_buffer`) from a
seeded sample of the sentences holding ``crosscoder_tokens`` tokens. Each model's activations are divided by
their root mean squared norm at the layer (recorded), so both enter at norm 1 on average and decoder norms compare.

Tables:

* ``crosscoder``: one row per layer: the fit (``fve_base``, ``fve_tuned``: fraction of variance explained of each
  model's activations, ``dead_share``, ``mean_active`` latents per token at the inference threshold), the number
  of latents of each kind and of confirmed tuned-only ones, the tokens read and the inference threshold;
* ``crosscoder_latents``: one row per layer and latent: ``base_norm``, ``tuned_norm`` (decoder norms),
  ``relative_norm`` = tuned / (base + tuned) (Lindsey et al. 2024), ``decoder_cosine``, ``kind``
  (``tuned_only`` when relative_norm >= ``crosscoder_only_threshold``, ``base_only`` when <= 1 minus it, else
  ``shared``), ``frequency`` (share of tokens it fires on, at the inference threshold), ``dead`` (never fired);
  for tuned_only latents Minder et al. 2025's Latent Scaling betas and ratios ``nu_error``, ``nu_reconstruction``
  and the verdict ``tuned_only_verified``: True only when both ratios are below ``crosscoder_nu_max``
  (:func:`bertology.metrics.crosscoder.tuned_only_verdict`);
* ``crosscoder_examples``: the top contexts of each non-shared live latent: ``layer, latent, rank, example,
  position, token, activation`` and ``context`` (the tokens around it, the token itself in brackets);
* ``crosscoder_directions``: each tuned_only latent's tuned-side decoder direction, unit length (``layer, latent,
  d0..``), which a study matches across seeds (:mod:`bertology.studies.crosscoder_seeds`).

Fit quality (fraction of variance explained per model, the dead-latent share) is also in the manifest section and
the summary line.

Inside a run, training is checkpointed every :data:`CHECKPOINT_EVERY` steps in ``partial/crosscoder/training.pt``:
a run killed mid-training resumes from the last checkpoint (the manifest's ``training.resumed_from_step``), and its
tables equal an uninterrupted run's.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.config import CompareConfig
from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError
from bertology.experiments.crosscoder_buffer import ShuffledBuffer, budgeted, pair_chunks
from bertology.experiments.crosscoder_eval import TARGETS, LayerReadout
from bertology.experiments.crosscoder_model import Crosscoder, Trainer
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.metrics import crosscoder as cc
from bertology.models.pair import ModelPair
from bertology.progress import parse_layer_list
from bertology.results import Result, atomic_write
from bertology.settings import Setting
from bertology.state_files import load_state, save_state

logger = logging.getLogger(__name__)

FIT, LATENTS, EXAMPLES = "crosscoder", "crosscoder_latents", "crosscoder_examples"
DIRECTIONS = "crosscoder_directions"
LINDSEY, MINDER, BUSSMANN = "Lindsey et al. 2024", "Minder et al. 2025", "Bussmann et al. 2024"
#: Tokens on each side of an example's token in its ``context``.
CONTEXT_TOKENS = 6
#: Training steps between checkpoints (inside a run: ``partial/crosscoder/training.pt``).
CHECKPOINT_EVERY = 50


@dataclass(frozen=True)
class CrosscoderSettings:
    """Every choice that changes the crosscoder's numbers (the manifest section records it)."""

    layers: tuple[int, ...] | None = None
    latents: int = 512
    k: int = 16
    tokens: int = 20_000
    steps: int = 400
    lr: float = 1e-3
    batch: int = 256
    buffer: int = 32_768
    examples: int = 8
    only_threshold: float = 0.6
    nu_max: float = 0.5

    def to_dict(self) -> dict:
        return asdict(self)


def settings_from(config: CompareConfig) -> CrosscoderSettings:
    """The crosscoder's settings inside ``compare``."""
    return CrosscoderSettings(config.crosscoder_layers, config.crosscoder_latents, config.crosscoder_k,
                              config.crosscoder_tokens, config.crosscoder_steps, config.crosscoder_lr,
                              config.crosscoder_batch, config.crosscoder_buffer, config.crosscoder_examples,
                              config.crosscoder_only_threshold, config.crosscoder_nu_max)


def default_layers(num_layers: int) -> tuple[int, ...]:
    """A middle layer (``num_layers // 2``, at least 1) and the last one."""
    return tuple(sorted({max(1, num_layers // 2), num_layers}))


# ------------------------------------------------------------------------------------------------ training


def training_tag(settings: CrosscoderSettings, layers: Sequence[int], seed: int, sample: EncodedCorpus) -> str:
    """What a checkpoint must match to be resumed: the settings, layers, seed and the sentences sampled."""
    key = [settings.to_dict(), list(map(int, layers)), int(seed), [int(it.index) for it in sample.items]]
    return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()


def _resume(checkpoint: Path | None, tag: str, trainers: Mapping[int, Trainer]) -> int:
    """The steps a matching checkpoint had taken (its trainers loaded), 0 when there is none to resume."""
    if checkpoint is None or not checkpoint.exists():
        return 0
    saved = load_state(checkpoint, remedy=f"Delete {checkpoint} to train the crosscoder afresh.")
    if saved.get("tag") != tag:
        return 0
    for layer, trainer in trainers.items():
        trainer.load(saved["trainers"][str(layer)])
    logger.info("resuming crosscoder training after step %d", saved["step"])
    return int(saved["step"])


def _save(checkpoint: Path, tag: str, step: int, trainers: Mapping[int, Trainer]) -> None:
    """Write every trainer's state after ``step`` steps (atomically: a kill leaves the previous checkpoint)."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    state = {"tag": tag, "step": int(step), "trainers": {str(layer): t.state() for layer, t in trainers.items()}}
    atomic_write(checkpoint, lambda p: save_state(state, p))


def fit_crosscoders(pair: ModelPair, encoded: EncodedCorpus, settings: CrosscoderSettings, layers: Sequence[int], *,
                    seed: int = 0, batch_size: int = 32, device: str = "cpu",
                    checkpoint: Path | None = None) -> tuple[dict, ShuffledBuffer, dict]:
    """One crosscoder per layer, trained together from one streamed buffer: the models, the buffer (its
    ``scale`` normalises later reads) and the training record (losses, thresholds, tokens, epochs).

    With ``checkpoint`` the trainers' state is saved every :data:`CHECKPOINT_EVERY` steps and a matching one is
    resumed: the buffer replays the batches already trained on (same generators, no training), so the steps
    after it and the finished crosscoders are those of an uninterrupted run."""
    hidden = int(pair.base.model.config.hidden_size)
    n_tokens = sum(len(it) - int(np.sum(it.special)) for it in encoded.items)
    capacity = min(settings.buffer, n_tokens)
    if capacity < settings.batch:
        raise BertologyError(f"The crosscoder needs at least {settings.batch} content tokens (--crosscoder-batch), "
                             f"the sentences sampled hold {n_tokens}.")
    if capacity < n_tokens and capacity < 2 * settings.batch:
        raise BertologyError(f"--crosscoder-buffer ({settings.buffer}) must hold at least two batches "
                             f"(--crosscoder-batch {settings.batch}) when it cannot hold every sampled token.")
    gen = torch.Generator().manual_seed(seed)
    models = {layer: Crosscoder(hidden, settings.latents, settings.k, gen) for layer in layers}
    buffer = ShuffledBuffer(lambda: pair_chunks(pair, encoded, layers, batch_size=batch_size, device=device), layers,
                            capacity, settings.batch, torch.Generator().manual_seed(seed + 1),
                            resident=capacity >= n_tokens)
    trainers = {layer: Trainer(m, settings.steps, settings.lr) for layer, m in models.items()}
    tag = training_tag(settings, layers, seed, encoded)
    start = _resume(checkpoint, tag, trainers)
    t0 = time.perf_counter()
    batches = iter(buffer)
    for step in range(settings.steps):
        x = next(batches)
        if step < start:
            continue  # replayed: trained on before the checkpoint
        for layer, trainer in trainers.items():
            trainer.step(x[layer])
        if checkpoint is not None and (step + 1) % CHECKPOINT_EVERY == 0 and step + 1 < settings.steps:
            _save(checkpoint, tag, step + 1, trainers)
    record = {"n_tokens_sampled": n_tokens, "buffer_tokens": capacity, "resident": capacity >= n_tokens,
              "tokens_drawn": buffer.drawn, "stream_passes": buffer.epochs, "seconds": time.perf_counter() - t0,
              "resumed_from_step": start, "checkpoint_every": CHECKPOINT_EVERY if checkpoint is not None else None,
              "per_layer": {int(layer): {"final_loss": float(np.mean(t.log.loss[-20:])),
                                         "threshold": t.log.threshold,
                                         "scale": buffer.scale[layer].flatten().tolist()}
                            for layer, t in trainers.items()}}
    return models, buffer, record


# ------------------------------------------------------------------------------------------------ reading out


def read_out(pair: ModelPair, encoded: EncodedCorpus, models: Mapping[int, Crosscoder], scale: Mapping,
             candidates: Mapping[int, np.ndarray], settings: CrosscoderSettings, *, batch_size: int = 32,
             device: str = "cpu") -> tuple[dict[int, LayerReadout], dict[str, np.ndarray]]:
    """One more streamed pass: each layer's :class:`LayerReadout`, and where every token read sits."""
    layers = tuple(models)
    outs = {layer: LayerReadout(models[layer], candidates[layer], settings.examples) for layer in layers}
    places: dict[str, list] = {"example": [], "position": [], "token_id": []}
    for chunk in pair_chunks(pair, encoded, layers, batch_size=batch_size, device=device):
        for layer in layers:
            outs[layer].update(chunk.acts[layer] / scale[layer])
        places["example"].append(chunk.example)
        places["position"].append(chunk.position)
        places["token_id"].append(chunk.token_id)
    return outs, {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in places.items()}


def latent_rows(layer: int, model: Crosscoder, readout: LayerReadout, settings: CrosscoderSettings) -> pd.DataFrame:
    """The ``crosscoder_latents`` rows of one layer (Latent Scaling filled in for the tuned_only latents)."""
    with torch.no_grad():
        dec = model.W_dec.double().numpy()
    norms = np.linalg.norm(dec, axis=-1)
    rel = cc.relative_norm(norms)
    kind = cc.latent_kinds(rel, settings.only_threshold)
    fired = readout.fired.numpy()
    d2 = norms[:, 1] ** 2
    betas = {f"beta_{what}_{model_name}": cc.scaling_beta(readout.scaling[t].numpy(), readout.sum_f2.numpy(), d2)
             for t, (model_name, what) in enumerate(TARGETS)}
    nu_err = cc.scaling_ratio(betas["beta_error_base"], betas["beta_error_tuned"])
    nu_rec = cc.scaling_ratio(betas["beta_reconstruction_base"], betas["beta_reconstruction_tuned"])
    tuned = kind == "tuned_only"
    table = pd.DataFrame({
        "layer": layer, "latent": np.arange(len(rel)), "base_norm": norms[:, 0], "tuned_norm": norms[:, 1],
        "relative_norm": rel, "decoder_cosine": cc.decoder_cosine(dec), "kind": kind,
        "frequency": fired / max(readout.n, 1), "dead": fired == 0,
        **{k: np.where(tuned, v, np.nan) for k, v in betas.items()},
        "nu_error": np.where(tuned, nu_err, np.nan), "nu_reconstruction": np.where(tuned, nu_rec, np.nan),
        "tuned_only_verified": cc.tuned_only_verdict(kind, nu_err, nu_rec, settings.nu_max)})
    table["tuned_only_verified"] = table["tuned_only_verified"].astype("boolean")
    return table


def direction_rows(layer: int, model: Crosscoder, kinds: np.ndarray) -> pd.DataFrame:
    """The ``crosscoder_directions`` rows of one layer: each tuned-only latent's tuned-side decoder direction
    (unit length, columns ``d0..d{dim-1}``), which a study matches across seeds (:mod:`bertology.studies.crosscoder_seeds`)."""
    with torch.no_grad():
        dec = model.W_dec[:, 1].double().numpy()
    keep = np.flatnonzero(np.asarray(kinds, dtype=object) == "tuned_only")
    rows = dec[keep]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    table = pd.DataFrame(unit.astype(np.float32), columns=[f"d{i}" for i in range(dec.shape[1])])
    table.insert(0, "latent", keep.astype(np.int64))
    table.insert(0, "layer", int(layer))
    return table


def example_rows(layer: int, readout: LayerReadout, places: Mapping[str, np.ndarray], encoded: EncodedCorpus,
                 tokenizer) -> pd.DataFrame:
    """The ``crosscoder_examples`` rows of one layer: each candidate latent's top contexts (activation > 0)."""
    by_index = {it.index: it for it in encoded.items}
    rows = []
    for c, latent in enumerate(readout.candidates.tolist()):
        for rank, (value, tok) in enumerate(zip(readout.top_values[c].tolist(), readout.top_tokens[c].tolist())):
            if value <= 0:
                break
            ex, pos = int(places["example"][tok]), int(places["position"][tok])
            pieces = tokenizer.convert_ids_to_tokens(list(by_index[ex].input_ids))
            left, right = max(0, pos - CONTEXT_TOKENS), pos + CONTEXT_TOKENS + 1
            context = " ".join(pieces[left:pos] + [f"[[{pieces[pos]}]]"] + pieces[pos + 1:right])
            rows.append({"layer": layer, "latent": latent, "rank": rank, "example": ex, "position": pos,
                         "token": pieces[pos], "activation": float(value), "context": context})
    cols = ["layer", "latent", "rank", "example", "position", "token", "activation", "context"]
    return pd.DataFrame(rows, columns=cols)


def fit_quality(readout: LayerReadout) -> dict:
    """Fraction of variance explained per model and the dead-latent share of one layer."""
    fve = {name: cc.fraction_of_variance_explained(float(readout.sse[i]), float(readout.sum_sq[i]),
                                                   readout.sum_x[i].numpy(), readout.n)
           for i, name in enumerate(("base", "tuned"))}
    return {"fve_base": fve["base"], "fve_tuned": fve["tuned"],
            "dead_share": float((readout.fired == 0).double().mean()),
            "mean_active": float(readout.fired.sum()) / max(readout.n, 1), "n_tokens": readout.n}


def run_crosscoder(pair: ModelPair, encoded: EncodedCorpus, settings: CrosscoderSettings, *, seed: int = 0,
                   batch_size: int = 32, device: str = "cpu",
                   work_dir: Path | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """Both tables and the manifest section for a pair on its encoded sentences (the library entry); with
    ``work_dir``, training checkpoints in ``work_dir/training.pt`` (an interrupted run resumes from them)."""
    layers = tuple(settings.layers) if settings.layers else default_layers(pair.num_layers)
    bad = [layer for layer in layers if not 0 <= layer <= pair.num_layers]
    if bad:
        raise BertologyError(f"--crosscoder-layers {bad} are not layers of this model (0..{pair.num_layers}).")
    sample = budgeted(encoded, settings.tokens, seed)
    models, buffer, record = fit_crosscoders(pair, sample, settings, layers, seed=seed, batch_size=batch_size,
                                             device=device,
                                             checkpoint=None if work_dir is None else Path(work_dir) / "training.pt")
    kinds = {}
    for layer, m in models.items():
        with torch.no_grad():
            kinds[layer] = cc.latent_kinds(cc.relative_norm(m.decoder_norms().double().numpy()),
                                           settings.only_threshold)
    candidates = {layer: np.flatnonzero(k != "shared") for layer, k in kinds.items()}
    t0 = time.perf_counter()
    outs, places = read_out(pair, sample, models, buffer.scale, candidates, settings, batch_size=batch_size,
                            device=device)
    latents = pd.concat([latent_rows(layer, models[layer], outs[layer], settings) for layer in layers],
                        ignore_index=True)
    examples = pd.concat([example_rows(layer, outs[layer], places, sample, pair.tokenizer) for layer in layers],
                         ignore_index=True)
    directions = pd.concat([direction_rows(layer, models[layer], kinds[layer]) for layer in layers], ignore_index=True)
    fit = {int(layer): fit_quality(outs[layer]) for layer in layers}
    counts = {int(layer): {**latents[latents.layer == layer]["kind"].value_counts().to_dict(),
                           "tuned_only_verified": int(latents[latents.layer == layer]["tuned_only_verified"]
                                                      .fillna(False).sum())} for layer in layers}
    section = {"settings": settings.to_dict(), "layers": list(map(int, layers)), "fit": fit, "kinds": counts,
               "training": record, "seconds_readout": time.perf_counter() - t0,
               "tokens": "content tokens only (padding and special tokens such as [CLS] and [SEP] excluded)",
               "normalisation": "each model's activations divided by their root mean squared norm at the layer"}
    fit_table = pd.DataFrame([{"layer": int(layer), **fit[int(layer)], **{f"n_{k}": int(counts[int(layer)].get(k, 0))
                                                                         for k in (*cc.KINDS, "tuned_only_verified")},
                               "threshold": record["per_layer"][int(layer)]["threshold"]} for layer in layers])
    return {FIT: fit_table, LATENTS: latents, EXAMPLES: examples, DIRECTIONS: directions}, jsonable(section)


# ------------------------------------------------------------------------------------------------ inside compare


def skip_reason(ctx: ExperimentContext) -> str | None:
    """The crosscoder trains a dictionary (a minute or more), so it runs only when named."""
    if "crosscoder" not in ctx.config.analyses:
        return "it runs only when named (--analyses crosscoder)"
    return None


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """The crosscoder on the run's sentences, as ``compare`` encodes them."""
    from bertology.data.encode import encode_corpus

    config = ctx.config
    settings = settings_from(config)
    encoded = encode_corpus(ctx.corpus, ctx.pair.tokenizer, config.data.max_length, config.data.overlong)
    tables, section = run_crosscoder(ctx.pair, encoded, settings, seed=config.seed, batch_size=config.batch_size,
                                     device=config.device, work_dir=ctx.work_dir / "crosscoder")
    return ExperimentOutcome({n: Result(n, t, settings.to_dict()) for n, t in tables.items()}, section)


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """Per layer: latents by kind, how many tuned-only ones Latent Scaling confirms, and the dead share."""
    t = tables.get(LATENTS)
    if t is None or t.empty:
        return None
    parts = []
    for layer, part in t.groupby("layer"):
        n = part["kind"].value_counts()
        verified = int(part["tuned_only_verified"].fillna(False).sum())
        parts.append(f"L{layer}: {n.get('tuned_only', 0)} tuned-only ({verified} confirmed by Latent Scaling), "
                     f"{n.get('base_only', 0)} base-only, {n.get('shared', 0)} shared, "
                     f"{part['dead'].mean():.0%} dead")
    return "crosscoder: " + "; ".join(parts)


def _layers(text: str) -> tuple[int, ...] | None:
    """``"3,6"`` -> ``(3, 6)``; empty or ``all`` -> None (the default: a middle layer and the last)."""
    try:
        return parse_layer_list(text, "layer numbers (0 = embeddings)")
    except BertologyError:
        raise BertologyError(f"--crosscoder-layers takes a comma list of layer numbers (0 = embeddings), "
                             f"not {text!r}.") from None


SETTINGS = (
    Setting("crosscoder_layers", None, "Comma list of layers for the crosscoder (0 = embeddings); default a middle "
            "one and the last.", kind=tuple, parse=_layers, metavar="LAYERS", paper=LINDSEY),
    Setting("crosscoder_latents", 512, "Crosscoder dictionary size (latents per layer).", minimum=2, paper=LINDSEY),
    Setting("crosscoder_k", 16, "BatchTopK: latents kept per token on average (k * batch per batch).", minimum=1,
            paper=BUSSMANN),
    Setting("crosscoder_tokens", 20_000, "Token budget: the crosscoder reads a seeded sample of sentences holding "
            "this many content tokens.", minimum=1),
    Setting("crosscoder_steps", 400, "Crosscoder training steps (one batch each).", minimum=1),
    Setting("crosscoder_lr", 1e-3, "Crosscoder learning rate (Adam; linear decay over the last fifth).", above=0.0),
    Setting("crosscoder_batch", 256, "Tokens per crosscoder training step.", minimum=2),
    Setting("crosscoder_buffer", 32_768, "Tokens held in the shuffled activation buffer (at least twice the batch).",
            minimum=4),
    Setting("crosscoder_examples", 8, "Top contexts listed per non-shared latent.", minimum=0),
    Setting("crosscoder_only_threshold", 0.6, "A latent is tuned-only when its relative decoder norm is at least "
            "this, base-only when at most 1 minus it.", above=0.5, maximum=1.0, paper=LINDSEY),
    Setting("crosscoder_nu_max", 0.5, "Latent Scaling: a tuned-only latent is confirmed only when both ratios "
            "nu_error and nu_reconstruction (base / tuned) are below this.", above=0.0, paper=MINDER),
)

SPEC = ExperimentSpec("crosscoder", "the crosscoder", lambda config: (FIT, LATENTS, EXAMPLES, DIRECTIONS), settings_from, skip_reason,
                      _run, summary=summary, settings=SETTINGS)
