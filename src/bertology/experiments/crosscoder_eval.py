"""A trained crosscoder read over the tokens once more, streamed: frequency, fit, Latent Scaling sums, top contexts.

Everything is a sum over tokens (or a running top-n), so nothing per token is kept but its place in the corpus:
per latent the number of tokens it fires on, per model the squared error and the variance of the activations
(fraction of variance explained), the Latent Scaling numerators of :mod:`bertology.metrics.crosscoder` and the
``n_top`` largest activations of each candidate latent (the non-shared ones) with the token they fired on.
"""
from __future__ import annotations

import numpy as np
import torch

from bertology.experiments.crosscoder_model import Crosscoder

#: Latent Scaling targets: (model row, kind of target) in the order of the sums below.
TARGETS = (("base", "reconstruction"), ("tuned", "reconstruction"), ("base", "error"), ("tuned", "error"))


class LayerReadout:
    """The streamed read-out of one layer's crosscoder (``update`` per chunk, then the arrays it summed)."""

    def __init__(self, model: Crosscoder, candidates: np.ndarray, n_top: int) -> None:
        self.model, self.n_top = model, int(n_top)
        self.candidates = torch.as_tensor(np.asarray(candidates, dtype=np.int64))
        m, d = model.latents, model.W_dec.shape[-1]
        self.fired = torch.zeros(m, dtype=torch.float64)
        self.sum_f2 = torch.zeros(m, dtype=torch.float64)
        self.scaling = torch.zeros(len(TARGETS), m, dtype=torch.float64)
        self.sse = torch.zeros(2, dtype=torch.float64)
        self.sum_sq = torch.zeros(2, dtype=torch.float64)
        self.sum_x = torch.zeros(2, d, dtype=torch.float64)
        self.n = 0
        self.top_values = torch.full((len(self.candidates), 0), -1.0)
        self.top_tokens = torch.zeros((len(self.candidates), 0), dtype=torch.int64)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """One chunk of normalised activations ``[n, 2, d]`` (tokens numbered on from the previous chunks)."""
        f = self.model.encode(x)
        xhat = self.model.decode(f)
        dec = self.model.W_dec  # [m, 2, d]
        d_tuned = dec[:, 1]
        f64 = f.double()
        self.fired += (f > 0).sum(dim=0).double()
        f2 = f64.pow(2).sum(dim=0)
        self.sum_f2 += f2
        err = x - xhat
        self.sse += err.double().pow(2).sum(dim=(0, 2))
        self.sum_sq += x.double().pow(2).sum(dim=(0, 2))
        self.sum_x += x.double().sum(dim=0)
        own = (dec * d_tuned[:, None]).sum(dim=-1).double()  # [m, 2]: <d_tuned_j, d_model_j>
        for t, (model, target) in enumerate(TARGETS):
            row = 0 if model == "base" else 1
            y = xhat[:, row] if target == "reconstruction" else err[:, row]
            num = (f64 * (y @ d_tuned.T).double()).sum(dim=0)
            if target == "error":  # the latent's own part put back: y = x - (x_hat - f_j d_model_j)
                num = num + f2 * own[:, row]
            self.scaling[t] += num
        self._top(f, x.shape[0])
        self.n += int(x.shape[0])

    def _top(self, f: torch.Tensor, n: int) -> None:
        """Keep each candidate latent's ``n_top`` largest activations (ties: the earlier token)."""
        if not len(self.candidates) or self.n_top == 0:
            return
        vals = torch.cat([self.top_values, f[:, self.candidates].T], dim=1)
        toks = torch.cat([self.top_tokens, torch.arange(self.n, self.n + n).expand(len(self.candidates), n)], dim=1)
        order = torch.sort(-vals, dim=1, stable=True).indices[:, : self.n_top]
        self.top_values, self.top_tokens = vals.gather(1, order), toks.gather(1, order)
