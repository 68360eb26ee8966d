"""Contribution maps: what each attention map would be if it measured what moves, not only the weights.

Every map returned here has the shape of an attention map (``[B, H, T, T]`` per head, ``[B, 1, T, T]``
for a per-layer measure) and query rows that sum to 1 over the real tokens: the share of what token
``i`` receives that comes from token ``j``. Measures (see docs/analyses/contribution_measures.md):

- ``weights``: the attention probabilities themselves;
- ``norm`` (Kobayashi et al. 2020): ``||alpha_ij f(x_j)||`` per head, ``f(x) = (x W_V^h + b_V^h) W_O^h``;
- ``rollout`` (Abnar & Zuidema 2020): head-mean attention mixed 0.5/0.5 with the identity, rows
  renormalised, multiplied up through the layers;
- ``value_zeroing`` (Mohebbi et al. 2023): per layer, the cosine distance between token ``i``'s layer
  output with and without token ``j``'s value vectors (in every head of that layer), rows renormalised;
- ``norm_residual`` (Kobayashi et al. 2021): per layer, ``||T_i(x_j)||`` of the attention block's output written as
  one transformed vector per source token (heads summed, the residual added to token ``i``'s own, the LayerNorm
  distributed over the summands), rows renormalised;
- ``alti`` (Ferrando et al. 2022): per layer, ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)`` of the same vectors,
  rows renormalised, then multiplied up through the layers (layer ``l``'s map is the product up to ``l``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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
PER_LAYER = frozenset({"rollout", "value_zeroing", "norm_residual", "alti"})
_EPS = 1e-12
#: At most this many float32 numbers in one chunk of ALTI's ``[B, T, T, hidden]`` transformed vectors (256 MiB).
ALTI_CHUNK = 1 << 26
#: At most this many float32 numbers in one value-zeroing re-run's largest activations (16 MiB): small enough to stay
#: near the caches (at BERT-base size, T=128, on the CPU, 16 zeroed tokens a re-run took 23% less time than all 128).
ZEROING_CHUNK = 1 << 22


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


def _per_head(x: torch.Tensor, value: tuple[torch.Tensor, torch.Tensor | None], out_weight: torch.Tensor,
              heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's values ``x W_V^h + b_V^h`` (``[B, H, T, d]``) and output block ``W_O^h`` (``[H, d, hidden]``):
    what :func:`head_vectors` and :func:`head_norms` both start from."""
    weight, bias = value
    v = x @ weight.T.to(x.dtype) + (0 if bias is None else bias.to(x.dtype))        # [B, T, H*d]
    b, t, hd = v.shape
    d = hd // heads
    v = v.view(b, t, heads, d).transpose(1, 2)                                       # [B, H, T, d]
    w_o = out_weight.to(x.dtype).view(out_weight.shape[0], heads, d).permute(1, 2, 0)  # [H, d, hidden]
    return v, w_o


def head_vectors(x: torch.Tensor, value: tuple[torch.Tensor, torch.Tensor | None], out_weight: torch.Tensor,
                 heads: int) -> torch.Tensor:
    """``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h`` for every head and token: ``[B, H, T, hidden]``.

    ``value`` is the value projection ``(weight [H*d, hidden], bias)``; ``out_weight`` the output
    projection's weight ``[hidden, H*d]`` (head ``h`` reads its columns ``h*d:(h+1)*d``). The output
    projection's bias belongs to no token and is left out, as in Kobayashi et al. 2020.
    """
    v, w_o = _per_head(x, value, out_weight, heads)
    return torch.einsum("bhtd,hdo->bhto", v, w_o)


def head_norms(x: torch.Tensor, value: tuple[torch.Tensor, torch.Tensor | None], out_weight: torch.Tensor,
               heads: int) -> torch.Tensor:
    """``||f_h(x_j)||`` for every head and token (``[B, H, T]``) without building the vectors: with ``v = x W_V^h +
    b_V^h``, ``||v W_O^h||^2 = v G_h v^T`` where ``G_h = W_O^h (W_O^h)^T`` is ``d x d`` (``d`` the head size), so the
    cost is ``T d^2`` per head instead of :func:`head_vectors`' ``T d hidden``."""
    v, w_o = _per_head(x, value, out_weight, heads)
    gram = w_o @ w_o.transpose(1, 2)                                                 # [H, d, d]
    return ((v @ gram) * v).sum(-1).clamp_min(0).sqrt()


def norm_map(probs: torch.Tensor, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Kobayashi et al. 2020's ``||alpha_ij f(x_j)||`` per head (``[B, H, T, T]``), rows renormalised."""
    return norm_from_norms(probs, vectors.norm(dim=-1), mask)


def norm_from_norms(probs: torch.Tensor, norms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`norm_map` from the vectors' norms ``[B, H, T]`` (:func:`head_norms`)."""
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


@dataclass(frozen=True)
class BlockTerms:
    """One layer's attention block written as one transformed vector per source token (Kobayashi et al. 2021).

    ``T_i(x_j) = scale_i * (sum_h probs_hij heads_hj + [i = j] residual_i)`` and ``sum_j T_i(x_j)`` is the block's
    ``output`` ``y_i`` less the terms of no token (``N(b_O)`` scaled, and the LayerNorm's ``beta``). In a post-LN block
    ``N`` is the LayerNorm's linear part (centre, then times ``gamma``) and ``scale_i = 1 / sigma_i`` uses the standard
    deviation of the whole sum ``x_i + attention_i``; in a pre-LN block (``N`` applied before the values, inside
    ``f``) there is no LayerNorm after the sum: ``N`` is the identity and ``scale_i = 1``.
    """

    probs: torch.Tensor     # [B, H, T, T] attention probabilities
    heads: torch.Tensor     # [B, H, T, hidden] N(f_h(x_j))
    residual: torch.Tensor  # [B, T, hidden] N(x_i), the residual's share of token i
    scale: torch.Tensor     # [B, T] 1 / sigma_i
    output: torch.Tensor    # [B, T, hidden] y_i, the attention block's output


def block_terms(model: nn.Module, layer: int, probs: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor) -> BlockTerms:
    """:class:`BlockTerms` of ``layer`` from its attention probabilities, the attention module's input ``x`` and the
    residual stream entering the block (the same tensor in a post-LN family), all in float32 or wider."""
    proj = sites.out_proj(model, layer)
    heads = head_vectors(x, _floats(sites.value_projection(model, layer)), _wide(proj.weight), sites.num_heads(model))
    bias = 0 if proj.bias is None else _wide(proj.bias).to(x.dtype)
    summed = torch.einsum("bhij,bhjd->bid", probs, heads) + residual + bias          # x_i + attention_i
    if sites.norm_first(model):
        return BlockTerms(probs, heads, residual, torch.ones(summed.shape[:-1], dtype=x.dtype, device=x.device), summed)
    norm = sites.attention_norm(model, layer)
    if not isinstance(norm, nn.LayerNorm):
        raise BertologyError(f"{sites.adapter(model).family}: the norm after attention is a {type(norm).__name__}, "
                             "not a LayerNorm; norm_residual and alti distribute a LayerNorm only")
    d = summed.shape[-1]
    gamma = torch.ones(d, dtype=x.dtype, device=x.device) if norm.weight is None else _wide(norm.weight).to(x.dtype)
    beta = 0 if norm.bias is None else _wide(norm.bias).to(x.dtype)

    def linear(z: torch.Tensor) -> torch.Tensor:
        return (z - z.mean(-1, keepdim=True)) * gamma

    centred = summed - summed.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1) + norm.eps).rsqrt()
    return BlockTerms(probs, linear(heads), linear(residual), scale, centred * gamma * scale[..., None] + beta)


def norm_residual_map(terms: BlockTerms, mask: torch.Tensor) -> torch.Tensor:
    """Kobayashi et al. 2021's ``||T_i(x_j)||`` per layer (``[B, 1, T, T]``), rows renormalised.

    The squared norms come from each token's Gram matrix of its head vectors (``sum_hk a_hij a_kij <N f_h, N f_k>``
    plus, on the diagonal, the residual's terms), so no ``[B, T, T, hidden]`` tensor is built.
    """
    p, g, r = terms.probs, terms.heads, terms.residual
    gram = torch.einsum("bhjd,bkjd->bjhk", g, g)                                     # [B, T, H, H]
    squared = torch.einsum("bhij,bjhk,bkij->bij", p, gram, p)
    own = 2 * torch.einsum("bhi,bhid,bid->bi", p.diagonal(dim1=-2, dim2=-1), g, r) + r.pow(2).sum(-1)
    norms = (squared + torch.diag_embed(own)).clamp_min(0).sqrt() * terms.scale[..., None]
    return normalise_rows(norms[:, None], mask)


def alti_layer(terms: BlockTerms, mask: torch.Tensor) -> torch.Tensor:
    """Ferrando et al. 2022's per-layer contributions ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``, rows renormalised
    (``[B, 1, T, T]``). The transformed vectors are built a chunk of query rows at a time (:data:`ALTI_CHUNK`)."""
    p, g = terms.probs, terms.heads
    b, _, t, d = g.shape
    y = terms.output
    rows = max(1, ALTI_CHUNK // max(1, b * t * d))
    parts = []
    for start in range(0, t, rows):
        sl = slice(start, min(t, start + rows))
        vectors = torch.einsum("bhij,bhjd->bijd", p[:, :, sl], g)                    # [B, c, T, hidden]
        own = torch.arange(sl.start, sl.stop, device=g.device)
        vectors[:, own - sl.start, own] += terms.residual[:, sl]
        vectors *= terms.scale[:, sl, None, None]
        distance = (y[:, sl, None] - vectors).abs().sum(-1)                          # [B, c, T]
        parts.append((y[:, sl].abs().sum(-1)[..., None] - distance).clamp_min(0))
    return normalise_rows(torch.cat(parts, 1)[:, None], mask)


def aggregate(maps: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-layer maps multiplied up through the layers, ``R_l = C_l R_{l-1}`` (ALTI's aggregation)."""
    out: list[torch.Tensor] = []
    for m in maps:
        out.append(m if not out else m @ out[-1])
    return out


def residual_maps(model: nn.Module, probs: Sequence[torch.Tensor], xs: dict[int, torch.Tensor], mask: torch.Tensor,
                  measures: Sequence[str]) -> dict[str, list[torch.Tensor | None]]:
    """``norm_residual`` and/or ``alti`` (as asked in ``measures``) of every layer, one layer's terms at a time."""
    wanted = [m for m in ("norm_residual", "alti") if m in measures]
    per: dict[str, list[torch.Tensor]] = {m: [] for m in wanted}
    for layer in range(1, sites.num_layers(model) + 1):
        terms = block_terms(model, layer, probs[layer - 1], _wide(xs[layer]), _wide(_residual(model, xs, layer)))
        if "norm_residual" in per:
            per["norm_residual"].append(norm_residual_map(terms, mask))
        if "alti" in per:
            per["alti"].append(alti_layer(terms, mask))
    if "alti" in per:
        per["alti"] = aggregate(per["alti"])
    return {m: [None, *maps] for m, maps in per.items()}


def _residual(model: nn.Module, xs: dict[int, torch.Tensor], layer: int) -> torch.Tensor:
    """The residual stream entering block ``layer``: the attention module's input, or the block's in a pre-LN family."""
    residuals = getattr(xs, "residuals", {})
    if sites.norm_first(model) and layer not in residuals:
        raise BertologyError(f"{sites.adapter(model).family} normalises before attention: norm_residual and alti need "
                             "the blocks' inputs, which attention_inputs() keeps")
    return residuals.get(layer, xs[layer])


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the layer it needs has run."""


def _repeat(value, times: int, batch: int):
    """``value`` (a tensor or a tuple/list of them, as a block returns) with each batch-first tensor repeated
    ``times`` times per example (``repeat_interleave`` on dim 0); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.repeat_interleave(times, dim=0) if value.dim() and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(_repeat(v, times, batch) for v in value)
    return value


@contextlib.contextmanager
def _blocks_below_return(model: nn.Module, layer: int, cached) -> Iterator[None]:
    """While inside, the blocks below ``layer`` do not run: each returns ``cached`` (block ``layer - 1``'s output of
    the batch being run), so a forward computes only the embeddings and the blocks from ``layer`` up.

    A module that serves several depths (ALBERT's shared layer) counts its calls; the count restarts at every call of
    the encoder. The blocks' own hooks still fire, so hooks that count calls stay in step.
    """
    blocks = sites.blocks(model)
    depths: dict[int, list[int]] = {}
    for depth, module in enumerate(blocks, start=1):
        depths.setdefault(id(module), []).append(depth)
    calls = {key: 0 for key in depths}
    patched: list[tuple[nn.Module, object]] = []

    def skipping(module: nn.Module, key: int, original):
        def forward(*args, **kwargs):
            depth = depths[key][min(calls[key], len(depths[key]) - 1)]
            calls[key] += 1
            return cached if depth < layer else original(*args, **kwargs)
        return forward

    def restart(_m, _a):
        for key in calls:
            calls[key] = 0

    seen = set()
    for module in blocks:
        if id(module) in seen or min(depths[id(module)]) >= layer:
            continue
        seen.add(id(module))
        patched.append((module, module.__dict__.get("forward")))
        module.forward = skipping(module, id(module), module.forward)
    handle = sites.encoder(model).register_forward_pre_hook(restart)
    try:
        yield
    finally:
        handle.remove()
        for module, before in patched:
            if before is None:
                del module.forward
            else:
                module.forward = before


def _run_to(model: nn.Module, inputs: dict, layer: int, context_hook=None) -> torch.Tensor:
    """``hidden_states[layer]`` of one forward, cut short after that layer; ``context_hook`` (a forward pre-hook)
    edits the input of ``layer``'s output projection: the first call of that module in a forward whose lower blocks
    are skipped (:func:`_blocks_below_return`)."""
    kept: list[torch.Tensor] = []

    def keep(_m, _i, out):
        kept.append(out[0] if isinstance(out, tuple) else out)
        raise _Stop

    handles = on_layers(model, sites.hidden_output, {layer: keep})
    if context_hook is not None:
        handles.append(sites.out_proj(model, layer).register_forward_pre_hook(context_hook))
    try:
        sites.encoder(model)(**inputs)
    except _Stop:
        pass
    finally:
        remove_hooks(handles)
    return kept[0]


def _block_outputs(model: nn.Module, inputs: dict) -> tuple[dict[int, object], dict[int, torch.Tensor]]:
    """One forward's output of every block as the block returns it, and ``hidden_states[1..N]``, by layer."""
    n = sites.num_layers(model)
    blocks: dict[int, object] = {}
    hidden: dict[int, torch.Tensor] = {}

    def into(store: dict, layer: int, first: bool):
        def hook(_m, _i, out):
            store[layer] = out[0] if first and isinstance(out, tuple) else out
        return hook

    handles = on_layers(model, sites.block, {l: into(blocks, l, False) for l in range(1, n)})
    handles += on_layers(model, sites.hidden_output, {l: into(hidden, l, True) for l in range(1, n + 1)})
    try:
        sites.encoder(model)(**inputs)
    finally:
        remove_hooks(handles)
    return blocks, hidden


def zeroing_chunk(batch: int, tokens: int, heads: int, hidden: int) -> int:
    """How many zeroed tokens one re-run holds: its ``[B*c, H, T, T]`` scores and ``[B*c, T, 4*hidden]`` FFN
    activations stay within :data:`ZEROING_CHUNK` floats each."""
    return max(1, min(tokens, ZEROING_CHUNK // max(1, batch * tokens * max(heads * tokens, 4 * hidden))))


def value_zeroing_layer(model: nn.Module, inputs: dict, layer: int, probs: torch.Tensor, x: torch.Tensor,
                        mask: torch.Tensor, below: tuple[dict[int, object], dict[int, torch.Tensor]]) -> torch.Tensor:
    """Mohebbi et al. 2023's value zeroing for one layer: ``[B, 1, T, T]``, rows renormalised.

    The zeroings of a batch run as forwards of ``B*c`` batches (``c`` zeroed tokens at a time,
    :func:`zeroing_chunk`): copy ``(b, j)`` has token ``j``'s value vectors removed from every head's context
    (``context_i -= alpha_hij v_hj`` at the output projection's input, which is what zeroing ``v_j`` does), and its
    layer output is compared with the original by cosine distance. The blocks below ``layer`` are not re-run: they
    return their output of the original forward (``below``: :func:`_block_outputs`), repeated to the copies.
    """
    b, heads, t, _ = probs.shape
    weight, bias = sites.value_projection(model, layer)
    v = x @ weight.T.to(x.dtype) + (0 if bias is None else bias.to(x.dtype))
    d = v.shape[-1] // heads
    v = v.view(b, t, heads, d).transpose(1, 2)                                       # [B, H, T, d]
    blocks, hidden = below
    original = _wide(hidden[layer])                                                   # [B, T, hidden]
    c = zeroing_chunk(b, t, heads, original.shape[-1])
    parts = []
    for start in range(0, t, c):
        js = torch.arange(start, min(t, start + c), device=v.device)
        # removed[b, k, i, h, :] = alpha[b, h, i, j_k] * v[b, h, j_k, :]
        removed = torch.einsum("bhik,bhkd->bkihd", probs[..., js], v[:, :, js]).reshape(b * len(js), t, heads * d)

        def zero_values(_m, args, removed=removed):
            return (args[0] - removed.to(args[0].dtype),) + tuple(args[1:])

        many = {k: val.repeat_interleave(len(js), dim=0) for k, val in inputs.items()}
        cached = _repeat(blocks.get(layer - 1), len(js), b)
        with _blocks_below_return(model, layer, cached):
            zeroed = _run_to(model, many, layer, zero_values).view(b, len(js), t, -1)  # [B, j, i, hidden]
        # in float32 at every precision: float16 cannot hold the normalisation's epsilon (a row of zero distances
        # would be 0/0)
        parts.append(1 - torch.nn.functional.cosine_similarity(_wide(zeroed), original[:, None], dim=-1))
    distance = torch.cat(parts, 1)                                                    # [B, j, i]
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


class AttentionInputs(dict):
    """layer -> what the attention module receives (``x`` of ``f(x)``); ``residuals``: layer -> the block's own input,
    kept only where the two differ (a pre-LN family's attention reads ``LN(x)``, its residual adds ``x``)."""

    def __init__(self) -> None:
        super().__init__()
        self.residuals: dict[int, torch.Tensor] = {}

    def clear(self) -> None:
        super().clear()
        self.residuals.clear()


@contextlib.contextmanager
def attention_inputs(model: nn.Module) -> Iterator[AttentionInputs]:
    """Keep what each layer's attention module receives (``x`` of ``f(x)``), by layer, during the block (and each
    block's input in a pre-LN family: the residual of ``norm_residual`` and ``alti``).

    Beside :func:`bertology.models.hooks.capture` in one forward pass, it gives :func:`maps_from_forward`
    everything it needs, so a run's capture computes the measures without a forward of its own.
    """
    xs = AttentionInputs()
    layers = range(1, sites.num_layers(model) + 1)

    def keep(into: dict[int, torch.Tensor], layer: int):
        return lambda _m, args, kwargs: into.__setitem__(layer, block_input(args, kwargs))

    handles = on_layers(model, sites.attention, {l: keep(xs, l) for l in layers}, pre=True, with_kwargs=True)
    if sites.norm_first(model):
        handles += on_layers(model, sites.block, {l: keep(xs.residuals, l) for l in layers}, pre=True, with_kwargs=True)
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
        out["norm"] = [None] + [norm_from_norms(probs[l - 1], head_norms(
            _wide(xs[l]), _floats(sites.value_projection(enc, l)), _wide(sites.out_proj(enc, l).weight), heads),
            mask) for l in range(1, n + 1)]
    if "rollout" in measures:
        out["rollout"] = [None, *rollout_maps(probs, mask)]
    if "value_zeroing" in measures:
        below = _block_outputs(enc, inputs)
        out["value_zeroing"] = [None] + [value_zeroing_layer(enc, inputs, l, attentions[l], xs[l], mask, below)
                                         for l in range(1, n + 1)]
    if "norm_residual" in measures or "alti" in measures:
        out.update(residual_maps(enc, probs, xs, mask, measures))
    return out


def _floats(value: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A value projection widened to float32 (norms are computed in float32 at every precision)."""
    weight, bias = value
    return _wide(weight), None if bias is None else _wide(bias)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 as float32; float32 and float64 as they are."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
