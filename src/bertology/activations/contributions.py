"""Contribution maps: what each attention map would be if it measured what moves, not only the weights.

Every map returned here has the shape of an attention map (``[B, H, T, T]`` per head, ``[B, 1, T, T]``
for a per-layer measure) and query rows that sum to 1 over the real tokens: the share of what token
``i`` receives that comes from token ``j``. Measures (see docs/analyses/contribution_measures.md):

- ``weights``: the attention probabilities themselves;
- ``norm`` (Kobayashi et al. 2020): ``||alpha_ij f(x_j)||`` per head, ``f(x) = (x W_V^h + b_V^h) W_O^h``;
- ``rollout`` (Abnar & Zuidema 2020): head-mean attention mixed 0.5/0.5 with the identity, rows
  renormalised, multiplied up through the layers;
- ``value_zeroing`` (Mohebbi et al. 2023): per layer, the cosine distance between token ``i``'s layer
  output with and without token ``j``'s value vectors (in every head of that layer), rows renormalised.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from bertology.config import ATTENTION_MEASURES
from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.hooks import block_input, capture, on_layers, remove_hooks

#: Measures this module computes (``compare --attention-measures`` offers these); ``weights`` is today's attention
#: probabilities.
MEASURES = ATTENTION_MEASURES
#: Measures that give one map per layer (``[B, 1, T, T]``) rather than one per head.
PER_LAYER = frozenset({"rollout", "value_zeroing"})
_EPS = 1e-12


def check_measures(measures: Sequence[str]) -> tuple[str, ...]:
    """The measures as a tuple, refusing an unknown or repeated one with the list of known ones."""
    bad = [m for m in measures if m not in MEASURES]
    if bad:
        raise BertologyError(f"unknown attention measure {bad[0]!r}; choose from {', '.join(MEASURES)}")
    if len(set(measures)) != len(measures):
        raise BertologyError(f"attention measures repeat one: {list(measures)}")
    return tuple(measures)


def normalise_rows(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``scores`` [..., T, T] zeroed on padded keys (``mask`` [B, T]) and divided by each row's sum."""
    keep = mask[:, None, None, :].to(scores.dtype)
    kept = scores * keep
    return kept / kept.sum(-1, keepdim=True).clamp_min(_EPS)


def head_vectors(x: torch.Tensor, value: tuple[torch.Tensor, torch.Tensor | None], out_weight: torch.Tensor,
                 heads: int) -> torch.Tensor:
    """``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h`` for every head and token: ``[B, H, T, hidden]``.

    ``value`` is the value projection ``(weight [H*d, hidden], bias)``; ``out_weight`` the output
    projection's weight ``[hidden, H*d]`` (head ``h`` reads its columns ``h*d:(h+1)*d``). The output
    projection's bias belongs to no token and is left out, as in Kobayashi et al. 2020.
    """
    weight, bias = value
    v = x @ weight.T.to(x.dtype) + (0 if bias is None else bias.to(x.dtype))        # [B, T, H*d]
    b, t, hd = v.shape
    d = hd // heads
    v = v.view(b, t, heads, d).transpose(1, 2)                                       # [B, H, T, d]
    w_o = out_weight.to(x.dtype).view(out_weight.shape[0], heads, d).permute(1, 2, 0)  # [H, d, hidden]
    return torch.einsum("bhtd,hdo->bhto", v, w_o)


def norm_map(probs: torch.Tensor, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Kobayashi et al. 2020's ``||alpha_ij f(x_j)||`` per head (``[B, H, T, T]``), rows renormalised."""
    norms = vectors.norm(dim=-1)                                                     # [B, H, T]
    return normalise_rows(probs * norms[:, :, None, :], mask)


def rollout_maps(attentions: Sequence[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
    """Abnar & Zuidema 2020's rollout per layer: ``R_l = A~_l R_{l-1}``, ``A~ = rownorm(0.5 mean_h A + 0.5 I)``.

    ``attentions`` are layers 1..N ``[B, H, T, T]``; the result is one ``[B, 1, T, T]`` map per layer,
    whose rows sum to 1 over real tokens (padded keys hold no mass; padded rows are kept finite).
    """
    out: list[torch.Tensor] = []
    rolled = None
    for probs in attentions:
        eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
        mixed = normalise_rows(0.5 * probs.mean(1, keepdim=True) + 0.5 * eye, mask)
        rolled = mixed if rolled is None else mixed @ rolled
        out.append(rolled)
    return out


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the layer it needs has run."""


def _layer_output(model: nn.Module, inputs: dict, layer: int, context_hook=None) -> torch.Tensor:
    """``hidden_states[layer]`` of one forward, cut short after that layer; ``context_hook`` edits its context."""
    kept: list[torch.Tensor] = []

    def keep(_m, _i, out):
        kept.append(out[0] if isinstance(out, tuple) else out)
        raise _Stop

    handles = on_layers(model, sites.hidden_output, {layer: keep})
    if context_hook is not None:
        handles += on_layers(model, sites.out_proj, {layer: context_hook}, pre=True)
    try:
        sites.encoder(model)(**inputs)
    except _Stop:
        pass
    finally:
        remove_hooks(handles)
    return kept[0]


def value_zeroing_layer(model: nn.Module, inputs: dict, layer: int, probs: torch.Tensor, x: torch.Tensor,
                        mask: torch.Tensor) -> torch.Tensor:
    """Mohebbi et al. 2023's value zeroing for one layer: ``[B, 1, T, T]``, rows renormalised.

    All ``T`` zeroings of a batch run as one forward of a ``B*T`` batch: copy ``(b, j)`` has token ``j``'s
    value vectors removed from every head's context (``context_i -= alpha_hij v_hj`` at the output
    projection's input, which is what zeroing ``v_j`` does), and its layer output is compared with the
    original by cosine distance.
    """
    b, heads, t, _ = probs.shape
    weight, bias = sites.value_projection(model, layer)
    v = x @ weight.T.to(x.dtype) + (0 if bias is None else bias.to(x.dtype))
    d = v.shape[-1] // heads
    v = v.view(b, t, heads, d).transpose(1, 2)                                       # [B, H, T, d]
    eye = torch.eye(t, dtype=v.dtype, device=v.device)
    # removed[b, j, i, h, :] = alpha[b, h, i, j] * v[b, h, j, :]
    removed = torch.einsum("bhij,bhjd,jk->bkihd", probs, v, eye).reshape(b * t, t, heads * d)

    def zero_values(_m, args):
        return (args[0] - removed.to(args[0].dtype),) + tuple(args[1:])

    many = {k: val.repeat_interleave(t, dim=0) for k, val in inputs.items()}
    original = _layer_output(model, inputs, layer)                                   # [B, T, hidden]
    zeroed = _layer_output(model, many, layer, zero_values).view(b, t, t, -1)        # [B, j, i, hidden]
    # in float32 at every precision: float16 cannot hold the normalisation's epsilon (a row of zero distances
    # would be 0/0)
    distance = 1 - torch.nn.functional.cosine_similarity(_wide(zeroed), _wide(original)[:, None], dim=-1)  # [B, j, i]
    return normalise_rows(distance.transpose(1, 2).clamp_min(0)[:, None], mask)


def contribution_maps(model: nn.Module, tensors: dict, measures: Sequence[str],
                      device: torch.device | str = "cpu") -> dict[str, list[torch.Tensor | None]]:
    """Every asked measure's maps from one forward (value zeroing adds its batched re-runs).

    Returns ``measure -> [None, layer 1, ..., layer N]`` (index 0 unused, as in ``Captured.attentions``).
    """
    measures = check_measures(measures)
    enc = sites.encoder(model)
    inputs = sites.model_inputs(enc, tensors, device)
    with attention_inputs(enc) as xs, capture(enc, hidden_states=False, attentions=True) as cap:
        enc(**inputs)
    return maps_from_forward(enc, inputs, cap.attentions, xs, measures)


@contextlib.contextmanager
def attention_inputs(model: nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """Keep what each layer's attention module receives (``x`` of ``f(x)``), by layer, during the block.

    Beside :func:`bertology.models.hooks.capture` in one forward pass, it gives :func:`maps_from_forward`
    everything it needs, so a run's capture computes the measures without a forward of its own.
    """
    xs: dict[int, torch.Tensor] = {}

    def keep_x(layer: int):
        return lambda _m, args, kwargs: xs.__setitem__(layer, block_input(args, kwargs))

    handles = on_layers(model, sites.attention, {l: keep_x(l) for l in range(1, sites.num_layers(model) + 1)},
                        pre=True, with_kwargs=True)
    try:
        yield xs
    finally:
        remove_hooks(handles)


def maps_from_forward(model: nn.Module, inputs: dict, attentions: Sequence[torch.Tensor | None],
                      xs: dict[int, torch.Tensor], measures: Sequence[str]) -> dict[str, list[torch.Tensor | None]]:
    """The measures' maps from one forward's attention probabilities (``[None, layer 1..N]``, as captured) and
    attention inputs (:func:`attention_inputs`); ``inputs`` are that forward's (value zeroing re-runs them)."""
    enc = sites.encoder(model)
    n, heads = sites.num_layers(enc), sites.num_heads(enc)
    mask = inputs["attention_mask"]
    probs = [_wide(attentions[l]) for l in range(1, n + 1)]
    out: dict[str, list[torch.Tensor | None]] = {}
    if "weights" in measures:
        out["weights"] = [None, *probs]
    if "norm" in measures:
        out["norm"] = [None] + [norm_map(probs[l - 1], head_vectors(
            _wide(xs[l]), _floats(sites.value_projection(enc, l)), _wide(sites.out_proj(enc, l).weight), heads),
            mask) for l in range(1, n + 1)]
    if "rollout" in measures:
        out["rollout"] = [None, *rollout_maps(probs, mask)]
    if "value_zeroing" in measures:
        out["value_zeroing"] = [None] + [value_zeroing_layer(enc, inputs, l, attentions[l], xs[l], mask)
                                         for l in range(1, n + 1)]
    return out


def _floats(value: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A value projection widened to float32 (norms are computed in float32 at every precision)."""
    weight, bias = value
    return _wide(weight), None if bias is None else _wide(bias)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 as float32; float32 and float64 as they are."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
