"""Attention views: run one model (or two) on one sentence or pair and keep what the viewer draws.

:func:`compute_view` returns the JSON-ready *view* dict (tokens, sentence segments, special-token
flags and every layer's and head's attention per model) whose contract is in
:mod:`bertology.view_format`; :class:`bertology.viz.viewer.AttentionView` draws it. This is the part of
the viewer that loads and runs models, so ``viz/`` never has to.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.adapters import adapter_for
from bertology.models.hooks import capture
from bertology.models.loading import LoadedModel, load_model
from bertology.view_format import DECIMALS, FORMAT, VERSION


def _encode(tokenizer, text: str, text_pair: str | None) -> dict[str, list[int]]:
    """The tokenizer's ids (untruncated) with its special-tokens mask, as plain lists."""
    enc = tokenizer(text, text_pair, truncation=False, return_special_tokens_mask=True)
    return {k: list(v) for k, v in enc.items()}


def _segments(enc: dict[str, list[int]], paired: bool) -> list[int]:
    """Sentence A (0) or B (1) of each token.

    ``token_type_ids`` when the tokenizer marks the pair with them (BERT); otherwise (RoBERTa has none)
    sentence B starts at the first ordinary token after a special token that follows sentence A, and
    special tokens belong to the sentence before them.
    """
    n = len(enc["input_ids"])
    if not paired:
        return [0] * n
    types = enc.get("token_type_ids")
    if types and any(types):
        return [int(t) for t in types]
    special = enc.get("special_tokens_mask") or [0] * n
    out, seg, seen_a, crossed = [], 0, False, False
    for s in special:
        if s:
            crossed = crossed or seen_a
        else:
            seen_a = True
            if crossed:
                seg = 1
        out.append(seg)
    return out


def _attention(loaded: LoadedModel, enc: dict[str, list[int]], measure: str = "weights") -> np.ndarray:
    """Attention probabilities of one forward pass, ``[layers, heads, seq, seq]`` in float64; or the maps of a
    contribution ``measure`` (:mod:`bertology.activations.contributions`; a per-layer one has one head)."""
    encoder = loaded.encoder
    device = next(encoder.parameters()).device
    tensors = {k: torch.tensor([v]) for k, v in enc.items() if k in ("input_ids", "token_type_ids", "attention_mask")}
    tensors.setdefault("token_type_ids", torch.zeros_like(tensors["input_ids"]))
    tensors.setdefault("attention_mask", torch.ones_like(tensors["input_ids"]))
    if measure != "weights":
        from bertology.activations.contributions import contribution_maps

        with torch.inference_mode():
            measured = contribution_maps(encoder, tensors, (measure,), device)[measure]
        return torch.stack([a[0].float().cpu() for a in measured[1:]]).double().numpy()
    inputs = sites.model_inputs(encoder, tensors, device)
    with torch.inference_mode(), capture(encoder, hidden_states=False) as captured:
        encoder(**inputs)
    maps = [a[0].float().cpu() for a in captured.attentions[1:]]
    return torch.stack(maps).double().numpy()


def compute_view(
    models: LoadedModel | Sequence[LoadedModel],
    text: str,
    text_pair: str | None = None,
    *,
    names: Sequence[str] = ("base", "tuned"),
    max_length: int = 128,
    measure: str = "weights",
) -> dict[str, Any]:
    """Attention of one or two models on one sentence (or pair), as a JSON-ready *view* dict.

    ``measure``: the attention probabilities (``weights``) or a contribution measure's maps, recorded in the view's
    ``measure`` (absent for ``weights``, so a default view is what it always was).

    With two models the second is compared with the first (diff = second − first); they must tokenise
    the text identically and have the same number of layers and heads. Texts longer than
    ``max_length`` tokens ([CLS]/[SEP] included) are refused rather than truncated.
    """
    loaded = [models] if isinstance(models, LoadedModel) else list(models)
    if not 1 <= len(loaded) <= 2:
        raise BertologyError(f"The viewer shows one model or compares two; got {len(loaded)}.")
    names = tuple(str(n) for n in names)[: len(loaded)]
    if len(names) != len(loaded) or len(set(names)) != len(names) or "diff" in names or "" in names:
        raise BertologyError(f"Give one distinct, non-empty name per model (not 'diff'); got {names!r}.")
    if not isinstance(text, str) or not text.strip():
        raise BertologyError("The text to view is empty.")
    if text_pair is not None and not text_pair.strip():
        raise BertologyError("The second text of the pair is empty.")

    encs = [_encode(m.tokenizer, text, text_pair) for m in loaded]
    tokens = [m.tokenizer.convert_ids_to_tokens(e["input_ids"]) for m, e in zip(loaded, encs)]
    if len(loaded) == 2 and tokens[0] != tokens[1]:
        raise BertologyError(
            f"The models tokenise the text differently ({names[0]}: {len(tokens[0])} tokens, "
            f"{names[1]}: {len(tokens[1])} tokens, first difference at "
            f"{_first_difference(tokens[0], tokens[1])}); compare models that share a tokenizer."
        )
    n = len(tokens[0])
    for m in loaded:  # the position encoding's limit (RoBERTa's rows up to its pad id are not usable)
        limit = adapter_for(m.model.config).max_tokens(m.model.config)
        if limit is not None and n > limit:
            raise BertologyError(
                f"The text is {n} tokens long ([CLS]/[SEP] included); model {m.name} accepts at most {limit} "
                "(its position limit); shorten the text."
            )
    if n > max_length:
        raise BertologyError(
            f"The text is {n} tokens long ([CLS]/[SEP] included), more than the maximum of {max_length}; "
            "shorten it or raise --max-length."
        )

    maps = [_attention(m, e, measure) for m, e in zip(loaded, encs)]
    if len(maps) == 2 and maps[0].shape != maps[1].shape:
        (l0, h0), (l1, h1) = maps[0].shape[:2], maps[1].shape[:2]
        raise BertologyError(
            f"The models differ in shape ({names[0]}: {l0} layers x {h0} heads, {names[1]}: {l1} x {h1}); "
            "the viewer compares models with the same architecture."
        )
    if not all(np.isfinite(a).all() for a in maps):
        raise BertologyError("A model produced non-finite attention weights (NaN/inf); check its weights.")
    n_layers, n_heads = maps[0].shape[:2]
    enc0 = encs[0]
    view = {
        "format": FORMAT,
        "version": VERSION,
        "text": text,
        "text_pair": text_pair,
        "tokens": [str(t) for t in tokens[0]],
        "segments": _segments(enc0, text_pair is not None),
        "special": [bool(s) for s in enc0.get("special_tokens_mask", [0] * n)],
        "n_layers": int(n_layers),
        "n_heads": int(n_heads),
        "layers": list(range(1, n_layers + 1)),
        "models": [{"name": name, "model": m.name} for name, m in zip(names, loaded)],
        "attention": {name: np.round(a, DECIMALS).tolist() for name, a in zip(names, maps)},
        "decimals": DECIMALS,
    }
    if measure != "weights":
        view["measure"] = measure
    return view


def _first_difference(a: list[str], b: list[str]) -> str:
    """Where two token lists first disagree, for the error message."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"position {i}: {x!r} vs {y!r}"
    return f"position {min(len(a), len(b))} (one is longer)"


def view_data(
    model: str | os.PathLike | LoadedModel,
    text: str,
    text_pair: str | None = None,
    compare: str | os.PathLike | LoadedModel | None = None,
    *,
    max_length: int = 128,
    measure: str = "weights",
) -> dict[str, Any]:
    """Load ``model`` (and ``compare``) by hub id, folder or ``minilm`` and compute their view (of ``measure``'s maps).

    With ``compare`` the first model is named "base", the second "tuned" (diff mode shows tuned − base).
    ``bertology.viz.viewer.AttentionView(view_data(...))`` renders it.
    """
    def get(m: str | os.PathLike | LoadedModel) -> LoadedModel:
        return m if isinstance(m, LoadedModel) else load_model(m)

    models = [get(model)] + ([get(compare)] if compare is not None else [])
    return compute_view(models, text, text_pair, max_length=max_length, measure=measure)
