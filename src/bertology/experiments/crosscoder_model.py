"""A BatchTopK crosscoder over the paired activations of two encoders, in plain torch.

Lindsey et al. 2024 ("Sparse Crosscoders for Cross-Layer Features and Model Diffing"): one encoder reads the
concatenated ``[base; tuned]`` activations of a token at one layer, one decoder per model writes each model's
activation back from the same sparse latents. Sparsity is Bussmann et al. 2024's BatchTopK, as Minder et al.
2025 ("Robustly identifying concepts introduced during chat fine-tuning using crosscoders") train it to avoid
the L1 loss's artefacts: in training, the ``k * B`` largest latent scores of a batch of ``B`` tokens are kept
(a latent's score is its activation times the sum of its two decoder norms, so a latent cannot win by a small
decoder); at inference a latent fires when its score exceeds a threshold estimated in training (a running mean
of the smallest score kept per batch). Dead latents get Gao et al. 2024's auxiliary loss: the ``k_aux``
largest dead latents reconstruct what the live ones missed.

Why not a library: ``dictionary-learning`` (saprmarks; its crosscoder fork by Minder et al.) and ``sae-lens``
both train from activations they collect themselves from decoder LMs (nnsight / TransformerLens hook points,
caches on disk); sae-lens has no crosscoder, and dictionary-learning's ``BatchTopKCrossCoder`` pulls in nnsight
and its trainer loop. What we need is ~150 lines over our own streamed buffer, deterministic for a seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

#: Gao et al. 2024's weight of the auxiliary (dead-latent) loss.
AUX_WEIGHT = 1.0 / 32.0
#: A latent that has not fired in this many training tokens counts as dead for the auxiliary loss.
DEAD_AFTER_TOKENS = 20_000
#: Exponential moving average of the per-batch inference threshold.
THRESHOLD_MOMENTUM = 0.99


class Crosscoder(nn.Module):
    """Encoder ``[2, d, m]`` (base and tuned halves of one matrix over the concatenation), decoders ``[m, 2, d]``.

    ``x`` is always ``[n, 2, d]``: row 0 the base model's activation of a token, row 1 the tuned model's.
    """

    def __init__(self, hidden: int, latents: int, k: int, generator: torch.Generator) -> None:
        super().__init__()
        self.k = int(k)
        dec = torch.randn(latents, 2, hidden, generator=generator)
        dec = dec / dec.norm(dim=-1, keepdim=True) * 0.1  # each model's decoder row of norm 0.1
        self.W_dec = nn.Parameter(dec)
        self.W_enc = nn.Parameter(dec.permute(1, 2, 0).clone())  # encoder starts as the decoder's transpose
        self.b_enc = nn.Parameter(torch.zeros(latents))
        self.b_dec = nn.Parameter(torch.zeros(2, hidden))
        self.register_buffer("threshold", torch.tensor(-1.0))  # < 0: not estimated yet

    @property
    def latents(self) -> int:
        return self.W_dec.shape[0]

    def decoder_norms(self) -> torch.Tensor:
        """``[m, 2]``: each latent's decoder norm in the base (0) and the tuned (1) model."""
        return self.W_dec.norm(dim=-1)

    def preactivations(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(W_enc . [x_base; x_tuned] + b_enc)``, ``[n, m]``."""
        return torch.relu(torch.einsum("nsd,sdm->nm", x, self.W_enc) + self.b_enc)

    def scores(self, pre: torch.Tensor) -> torch.Tensor:
        """Activation times the latent's summed decoder norms: what BatchTopK ranks and the threshold cuts."""
        return pre * self.decoder_norms().sum(dim=1)

    def encode_batch_topk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training encoding: the ``k * n`` largest scores of the batch kept; ``(latents [n, m], pre [n, m])``."""
        pre = self.preactivations(x)
        s = self.scores(pre).flatten()
        keep = min(self.k * x.shape[0], s.numel())
        top = torch.topk(s, keep, sorted=False)
        mask = torch.zeros_like(s, dtype=torch.bool)
        mask[top.indices] = True
        mask &= s > 0
        return pre * mask.view_as(pre), pre

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Inference encoding: a latent fires when its score exceeds the threshold estimated in training."""
        pre = self.preactivations(x)
        return pre * (self.scores(pre) > self.threshold.clamp(min=0.0))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """``[n, m]`` latents -> ``[n, 2, d]`` reconstructions of both models."""
        return torch.einsum("nm,msd->nsd", f, self.W_dec) + self.b_dec


@dataclass
class TrainLog:
    """What training measured: the loss per step, the auxiliary loss's share, the threshold reached."""

    loss: list[float] = field(default_factory=list)
    aux: list[float] = field(default_factory=list)
    threshold: float = float("nan")
    tokens: int = 0


def _aux_loss(model: Crosscoder, x: torch.Tensor, xhat: torch.Tensor, pre: torch.Tensor, dead: torch.Tensor,
              k_aux: int) -> torch.Tensor:
    """Gao et al.'s auxiliary loss: the top ``k_aux`` dead latents of each token reconstruct the residual."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return x.new_zeros(())
    masked = torch.where(dead, model.scores(pre), torch.zeros_like(pre))
    top = torch.topk(masked, min(k_aux, n_dead), dim=1)
    f = torch.zeros_like(pre).scatter(1, top.indices, pre.gather(1, top.indices))
    residual = (x - xhat).detach()
    recon = torch.einsum("nm,msd->nsd", f, model.W_dec)
    return ((recon - residual) ** 2).sum(dim=(1, 2)).mean() / residual.pow(2).sum(dim=(1, 2)).mean().clamp(min=1e-12)


class Trainer:
    """Adam on the summed squared reconstruction error of both models (+ the auxiliary loss), one batch a step.

    The decoder bias starts at the first batch's mean; the learning rate decays linearly to 0 over the last
    fifth of ``steps``; the inference threshold is the moving average of each batch's smallest kept score."""

    def __init__(self, model: Crosscoder, steps: int, lr: float) -> None:
        self.model, self.steps = model, int(steps)
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999))
        decay_from = int(self.steps * 0.8)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: 1.0 if s < decay_from else max(0.0, (self.steps - s) / max(1, self.steps - decay_from)))
        self.since_fired = torch.zeros(model.latents)
        self.k_aux = max(1, 2 * model.k)
        self.log = TrainLog()

    def step(self, x: torch.Tensor) -> float:
        """One optimiser step on ``x`` ``[n, 2, d]``; the reconstruction loss before the step."""
        model = self.model
        if self.log.tokens == 0:
            with torch.no_grad():
                model.b_dec.copy_(x.mean(dim=0))
        f, pre = model.encode_batch_topk(x)
        xhat = model.decode(f)
        loss = ((xhat - x) ** 2).sum(dim=(1, 2)).mean()
        fired = (f > 0).any(dim=0)
        self.since_fired = torch.where(fired, torch.zeros_like(self.since_fired), self.since_fired + x.shape[0])
        aux = _aux_loss(model, x, xhat, pre, self.since_fired >= DEAD_AFTER_TOKENS, self.k_aux)
        self.opt.zero_grad(set_to_none=True)
        (loss + AUX_WEIGHT * aux).backward()
        self.opt.step()
        self.sched.step()
        with torch.no_grad():
            _update_threshold(model, f, pre)
        self.log.loss.append(float(loss.detach()))
        self.log.aux.append(float(aux.detach()))
        self.log.tokens += int(x.shape[0])
        self.log.threshold = float(model.threshold)
        return self.log.loss[-1]

    def state(self) -> dict:
        """Everything the next step depends on (model, Adam, schedule, dead-latent clocks, log): a checkpoint."""
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                "since_fired": self.since_fired.clone(), "loss": list(self.log.loss), "aux": list(self.log.aux),
                "threshold": self.log.threshold, "tokens": self.log.tokens}

    def load(self, state: dict) -> None:
        """Continue from :meth:`state`: the following steps are those an uninterrupted trainer would take."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.since_fired = state["since_fired"].clone()
        self.log = TrainLog(list(state["loss"]), list(state["aux"]), float(state["threshold"]), int(state["tokens"]))


def _update_threshold(model: Crosscoder, f: torch.Tensor, pre: torch.Tensor) -> None:
    """Move the inference threshold toward this batch's smallest kept score (Bussmann et al.'s estimate)."""
    kept = model.scores(pre)[f > 0]
    if kept.numel() == 0:
        return
    low = kept.min()
    t = model.threshold
    model.threshold.copy_(low if t < 0 else THRESHOLD_MOMENTUM * t + (1 - THRESHOLD_MOMENTUM) * low)
