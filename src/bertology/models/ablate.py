"""Temporary hooks that disable attention heads and whole layers, gate heads, or start a forward mid-model.

transformers v5 has no ``head_mask``: every intervention here is a hook on the real Hugging Face modules
(DESIGN §2), registered on entry and removed in ``finally`` even when the body raises. Layers are 1-based
(attention layers 1..N), heads 0-based.

Head ablation modes (recorded as ``mode`` in every output):

Every head intervention rewrites the head's slice of the per-head context at the input of the family's
output projection (the adapter's ``out_proj``: ``attention.output.dense`` in BERT, ``out_lin`` in
DistilBERT, ``attention.dense`` in ALBERT, ``attn.Wo`` in ModernBERT), so it works for every family;
ALBERT's shared layer is hooked by call order, so ablating a head of layer 3 leaves the other depths alone.

* ``uniform`` (Kovaleva et al. 2019 §4.6): the head's attention is set to 1/L over the L non-padding
  tokens, [CLS]/[SEP] included, so its context vector is the mean of its value vectors over those
  tokens. With ``exclude_special`` the mean runs over the non-special real tokens instead (falling back
  to all real tokens for an input that has nothing else). The value vectors are recomputed from the
  attention module's input with the adapter's value projection; the captured attention maps show 1/L.
* ``zero``: the head's context slice is zeroed before the output projection (the old ``head_mask``).
* ``mean``: the head's context slice is replaced by its mean over a reference corpus
  (:func:`bertology.experiments.ablation.head_means`).

:func:`ablate_head_groups` applies several such ablations in one forward, each to its own block of rows (the
batched ablation sweep); :func:`ablate_heads` is its one-group case, so each mode's arithmetic is written once.

Whole layers: :func:`skip_layers` makes hidden state ``l`` equal to block ``l``'s input; "all heads of a
layer" is :func:`ablate_heads` with every head of that layer. :func:`bypass_blocks`,
:func:`replay_output` and :func:`keep_first_token` serve the cached ablation sweep, which only families
with ``adapter.cached_sweep`` (the BERT layout) use.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from bertology.config import MODES, Mode
from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.adapters import get_path
from bertology.models.hooks import block_input, on_layers, remove_hooks


__all__ = [
    "MODES",
    "HeadGates",
    "Mode",
    "ablate_head_groups",
    "ablate_heads",
    "bypass_blocks",
    "check_mode",
    "head_gates",
    "keep_first_token",
    "needs_means",
    "replace_embeddings",
    "replay_output",
    "skip_layers",
]


def check_mode(mode: str, name: str = "The ablation mode") -> Mode:
    """``mode`` when it is one of :data:`MODES`, else a user error naming the choices.

    The one check of an ablation mode, used by the CLI flags (``name`` = the flag), the settings of
    the ablation experiments and :func:`ablate_heads` alike, so they accept and refuse the same values.
    """
    if mode not in MODES:
        raise BertologyError(f"{name} must be one of {', '.join(MODES)}, not {mode!r}.")
    return mode  # type: ignore[return-value]


def needs_means(mode: str) -> bool:
    """Whether head mode ``mode`` replaces a head's output by its mean (the sweep must estimate the means first)."""
    return mode == "mean"


def _group(heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> dict[int, list[int]]:
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in heads:
        layer, head = int(layer), int(head)
        if not (1 <= layer <= n_layers) or not (0 <= head < n_heads):
            raise ValueError(f"no head L{layer}H{head} in a model with {n_layers} layers x {n_heads} heads")
        if head not in by_layer[layer]:
            by_layer[layer].append(head)
    return dict(by_layer)


def _real_keys(attention_mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool, True for keys the model may attend to (non-padding), from the mask attention receives."""
    b, t = hidden.shape[:2]
    if attention_mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=hidden.device)
    m = attention_mask
    if m.dim() == 4:  # [B, 1, Q, K] additive (eager) or boolean
        m = m[:, 0]
        if m.dtype == torch.bool:
            return m.any(dim=1)
        return (m > torch.finfo(m.dtype).min / 2).any(dim=1)
    if m.dim() == 2:
        return m.bool()
    raise ValueError(f"unexpected attention mask of shape {tuple(attention_mask.shape)}")


def _head_slices(head_size: int, heads: Iterable[int]) -> list[slice]:
    return [slice(h * head_size, (h + 1) * head_size) for h in heads]


def ablate_heads(
    model: nn.Module,
    heads: Iterable[tuple[int, int]],
    mode: Mode = "uniform",
    *,
    exclude_special: bool = False,
    special_ids: Collection[int] | None = None,
    means: Mapping[tuple[int, int], torch.Tensor] | torch.Tensor | None = None,
) -> AbstractContextManager[None]:
    """Disable the given ``(layer, head)`` pairs for every forward pass inside the block.

    ``exclude_special`` (uniform mode) leaves the tokens whose ids are in ``special_ids`` ([CLS] and
    [SEP]; the ids are read from the ``input_ids`` the embeddings receive) out of the 1/L average.
    ``means`` (mean mode) maps ``(layer, head)`` to that head's mean context vector, or is a
    ``[layers, heads, head_size]`` tensor indexed ``[layer - 1, head]``. One row group of
    :func:`ablate_head_groups` (every row of every forward).
    """
    return ablate_head_groups(model, [heads], mode, exclude_special=exclude_special, special_ids=special_ids,
                              means=means)


@contextmanager
def ablate_head_groups(
    model: nn.Module,
    groups: Sequence[Iterable[tuple[int, int]]],
    mode: Mode = "uniform",
    *,
    exclude_special: bool = False,
    special_ids: Collection[int] | None = None,
    means: Mapping[tuple[int, int], torch.Tensor] | torch.Tensor | None = None,
) -> Iterator[None]:
    """Disable ``groups[k]``'s ``(layer, head)`` pairs in the ``k``-th of ``len(groups)`` equal blocks of rows.

    Every forward's batch is read as ``len(groups)`` copies of ``B`` rows (``B`` = rows / ``len(groups)``):
    rows ``[k*B, (k+1)*B)`` get group ``k``'s heads, so one forward scores several ablations (the batched
    ablation sweep, :mod:`bertology.experiments.ablation_sweep`). The other arguments are as in
    :func:`ablate_heads` (one group); each mode's arithmetic is written once, per row group, and with one
    group it is the whole batch (the same products as before groups existed).
    """
    check_mode(mode)
    n_layers, n_heads, size = sites.num_layers(model), sites.num_heads(model), sites.head_size(model)
    by_layer: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for k, heads in enumerate(groups):
        for layer, hs in _group(heads, n_layers, n_heads).items():
            by_layer[layer].append((k, hs))
    n_groups = len(groups)
    if exclude_special and mode == "uniform" and not special_ids:
        raise ValueError("exclude_special needs the special token ids ([CLS], [SEP]) in special_ids")
    if mode == "mean" and means is None:
        raise ValueError("mode='mean' needs the heads' mean context vectors (means=...)")
    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        if mode == "uniform":
            handles.extend(_uniform_hooks(model, by_layer, n_groups, size, special_ids if exclude_special else None))
        else:
            replace = {
                layer: _replace_slices_hook(
                    [(k, hs, None if mode == "zero" else torch.stack([_mean_of(means, layer, h) for h in hs]))
                     for k, hs in entries], n_groups, size)
                for layer, entries in by_layer.items()
            }
            handles.extend(on_layers(model, sites.out_proj, replace, pre=True))
        yield
    finally:
        for h in handles:
            h.remove()


def _group_rows(k: int, n_groups: int, n_rows: int) -> slice:
    """The rows of row group ``k`` of ``n_groups`` equal groups (all rows when there is one group)."""
    if n_rows % n_groups:
        raise RuntimeError(f"a batch of {n_rows} rows cannot hold {n_groups} equal row groups")
    b = n_rows // n_groups
    return slice(k * b, (k + 1) * b)


def _mean_of(means, layer: int, head: int) -> torch.Tensor:
    if isinstance(means, torch.Tensor):
        return means[layer - 1, head]
    try:
        return torch.as_tensor(means[(layer, head)])
    except KeyError:
        raise ValueError(f"no mean context vector for L{layer}H{head}") from None


#: The row groups' heads at one layer: ``(k, heads)`` per group that ablates a head there.
_Entries = Sequence[tuple[int, list[int]]]


def _replace_slices_hook(entries: Sequence[tuple[int, list[int], torch.Tensor | None]], n_groups: int, size: int):
    """Pre-hook on the output projection: per row group ``(k, heads, values)``, zero (values None) or overwrite the
    heads' context slices in that group's rows."""

    def hook(_m, args):
        x = args[0].clone()
        for k, heads, values in entries:
            rows = _group_rows(k, n_groups, x.shape[0])
            for i, sl in enumerate(_head_slices(size, heads)):
                if values is None:
                    x[rows, ..., sl] = 0
                else:
                    x[rows, ..., sl] = values[i].to(dtype=x.dtype, device=x.device)
        return (x, *args[1:])

    return hook


def _uniform_hooks(
    model: nn.Module, by_layer: Mapping[int, _Entries], n_groups: int, size: int, special_ids: Collection[int] | None
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks that replace the heads' context by the mean of their value vectors over the real keys.

    A pre-hook on the encoder reads which keys are real (``attention_mask``) and, with ``special_ids``,
    which are special; a pre-hook on each attention module keeps its input (the value projection's
    input); a pre-hook on the output projection writes ``value(mean of inputs)`` (the projection is
    affine, so this is the mean of the value vectors) into the heads' slices; a forward hook on the
    attention module sets the heads' returned probabilities to those weights. The attention module's
    own computation may be replayed from a cache (:func:`replay_output`): its pre-hooks still run.
    ``by_layer[layer]`` holds ``(k, heads)`` per row group (:func:`ablate_head_groups`); each group's mean is
    taken over its own rows, so a group's products have the shapes they have in a forward of that group alone.
    """
    state: dict = {}  # the forward's key mask and special tokens, and per layer (its input, its uniform weights)
    ids = None if special_ids is None else torch.tensor(sorted(int(i) for i in special_ids), dtype=torch.long)

    def read_inputs(_m, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        state["mask"] = kwargs.get("attention_mask")
        state["special"] = None if ids is None or input_ids is None else torch.isin(input_ids, ids.to(input_ids.device))

    probs_index = sites.adapter(model).probs_index
    keep_input = {l: _keep_input_hook(state, l, ids is not None) for l in by_layer}
    show_uniform = {l: _show_uniform_hook(state, l, e, n_groups, probs_index) for l, e in by_layer.items()}
    write_means = {l: _write_means_hook(model, state, l, e, n_groups, size) for l, e in by_layer.items()}
    handles = [sites.encoder(model).register_forward_pre_hook(read_inputs, with_kwargs=True)]
    try:
        handles += on_layers(model, sites.attention, keep_input, pre=True, with_kwargs=True)
        handles += on_layers(model, sites.attention, show_uniform)
        handles += on_layers(model, sites.out_proj, write_means, pre=True)
    except BaseException:
        remove_hooks(handles)
        raise
    return handles


def _uniform_weights(state: dict, hidden: torch.Tensor, exclude_special: bool) -> torch.Tensor:
    """``[B, T]``: 1/L on the real keys of this forward (its content keys with ``exclude_special``, where it has
    any), for the uniform heads' mean."""
    keys = _real_keys(state.get("mask"), hidden)
    if exclude_special:
        special = state.get("special")
        if special is None or special.shape != keys.shape:
            raise RuntimeError("exclude_special: the input ids of this forward pass were not seen")
        content = keys & ~special
        keys = torch.where(content.any(dim=1, keepdim=True), content, keys)
    w = keys.to(hidden.dtype)
    return w / w.sum(dim=1, keepdim=True).clamp_min(1)  # [B, T]: 1/L on the kept keys


def _keep_input_hook(state: dict, layer: int, exclude_special: bool):
    """A pre-hook on attention module ``layer`` that keeps its input and the uniform weights over its keys."""
    def hook(_m, args, kwargs):
        hidden = block_input(args, kwargs)
        state[layer] = (hidden, _uniform_weights(state, hidden, exclude_special))

    return hook


def _write_means_hook(model: nn.Module, state: dict, layer: int, entries: _Entries, n_groups: int, size: int):
    """A pre-hook on layer ``layer``'s output projection that writes ``value(mean of inputs)`` into the heads' slices
    (the value projection is affine, so this is the mean of the value vectors), each row group's own heads."""
    weight, bias = sites.value_projection(model, layer)

    def hook(_m, args):
        hidden, w = state[layer]  # kept: the probabilities hook may run after this one (out_proj inside attention)
        x = args[0].clone()
        for k, heads in entries:
            rows = _group_rows(k, n_groups, x.shape[0])
            pooled = torch.einsum("bt,bth->bh", w[rows], hidden[rows])  # mean of the inputs, then the (affine) projection
            for sl in _head_slices(size, heads):
                mean = nn.functional.linear(pooled, weight[sl], None if bias is None else bias[sl])
                x[rows, ..., sl] = mean[:, None, :].to(x.dtype)
        return (x, *args[1:])

    return hook


def _show_uniform_hook(state: dict, layer: int, entries: _Entries, n_groups: int, probs_index: int):
    """A forward hook on attention module ``layer`` that sets the heads' returned probabilities to the uniform
    weights (what a reader of the maps then sees)."""
    def hook(_m, _args, output):
        if not isinstance(output, tuple) or len(output) <= probs_index or output[probs_index] is None:
            return None
        w = state[layer][1] if layer in state else None
        if w is None:
            return None
        probs = output[probs_index].clone()
        for k, heads in entries:
            rows = _group_rows(k, n_groups, probs.shape[0])
            for h in heads:
                probs[rows, h] = w[rows, None, :].to(probs.dtype)
        return (*output[:probs_index], probs, *output[probs_index + 1:])

    return hook


@contextmanager
def skip_layers(model: nn.Module, layers: Iterable[int]) -> Iterator[None]:
    """Disable whole layers: hidden state ``l`` becomes block ``l``'s input (the block still runs).

    The replacement is made at :func:`sites.hidden_output` (the block, or the module the family runs
    after it, e.g. DeBERTa-v2's convolution after block 1), keyed by call order for shared blocks.
    """
    n = sites.num_layers(model)
    chosen = sorted(set(int(x) for x in layers))
    for layer in chosen:
        if not 1 <= layer <= n:
            raise ValueError(f"no layer {layer} in a model with {n} layers")
    inputs: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def hook(_m, args, kwargs):
            inputs[layer] = block_input(args, kwargs)

        return hook

    def restore(layer: int):
        def hook(_m, _args, output):
            hidden = inputs.pop(layer)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    handles = on_layers(model, sites.block, {l: keep(l) for l in chosen}, pre=True, with_kwargs=True)
    try:
        handles += on_layers(model, sites.hidden_output, {l: restore(l) for l in chosen})
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def bypass_blocks(model: nn.Module, layers: Iterable[int]) -> Iterator[None]:
    """Make the given blocks cost nothing: their ``forward`` temporarily returns its input.

    Used with :func:`replace_embeddings` to start a forward pass at a later block from cached hidden
    states (exact: the blocks above see the same input and the same attention mask). Hooks registered
    on a bypassed block still fire. The instance attribute is restored (or removed) in ``finally``.
    """
    _needs_cached_layout(model, "bypass_blocks")
    blocks = sites.blocks(model)
    saved: list[tuple[nn.Module, object]] = []
    marker = object()

    def identity(hidden_states, *args, **kwargs):
        return hidden_states

    try:
        for layer in sorted(set(int(x) for x in layers)):
            block = blocks[layer - 1]
            saved.append((block, block.__dict__.get("forward", marker)))
            block.forward = identity
        yield
    finally:
        for block, old in reversed(saved):
            if old is marker:
                del block.forward
            else:
                block.forward = old


def _needs_cached_layout(model: nn.Module, what: str) -> None:
    ad = sites.adapter(model)
    if not ad.cached_sweep:
        raise ValueError(f"{what} needs the BERT block layout; {ad.family} runs the plain ablation sweep")


class _Replacement:
    """The hidden states the embeddings module returns while :func:`replace_embeddings` is active."""

    def __init__(self) -> None:
        self.hidden: torch.Tensor | None = None

    def set(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


@contextmanager
def replace_embeddings(model: nn.Module) -> Iterator[_Replacement]:
    """Make block 1 receive ``r.hidden`` (set it before each forward) instead of hidden state 0.

    Hidden state 0 is the first block's input, so this also covers families that project their
    embeddings to the hidden size (ELECTRA, ALBERT).
    """
    repl = _Replacement()

    def hook(_m, args, kwargs):
        hidden = block_input(args, kwargs)
        if repl.hidden is None:
            raise RuntimeError("replace_embeddings: set() the hidden states before the forward pass")
        if repl.hidden.shape != hidden.shape:
            raise RuntimeError(f"replacement hidden states {tuple(repl.hidden.shape)} != block input {tuple(hidden.shape)}")
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": repl.hidden}
        return (repl.hidden, *args[1:]), kwargs

    handle = sites.block(model, 1).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield repl
    finally:
        handle.remove()


class _Replay:
    """The output a replayed module returns on its next call (set it before each forward)."""

    def __init__(self) -> None:
        self.value = None

    def set(self, value) -> None:
        self.value = value


@contextmanager
def replay_output(module: nn.Module) -> Iterator[_Replay]:
    """Skip ``module``'s computation: its ``forward`` returns ``r.value`` (set before each call) instead.

    Its forward hooks still run on the replayed output, so an ablation hook can edit a cached
    intact output (the sweep replays ``attention.self`` of the ablated layer: the other heads' contexts
    are unchanged, so the query/key/value projections need not run again). Restored in ``finally``.
    """
    rp = _Replay()
    marker = object()
    old = module.__dict__.get("forward", marker)

    def replayed(*args, **kwargs):
        if rp.value is None:
            raise RuntimeError("replay_output: set() the output before the forward pass")
        return rp.value

    module.forward = replayed
    try:
        yield rp
    finally:
        if old is marker:
            del module.forward
        else:
            module.forward = old


@contextmanager
def keep_first_token(model: nn.Module) -> Iterator[None]:
    """Let the last block's feed-forward run on the first token only (exact when the head reads [CLS] only).

    A forward hook on the last block's ``adapter.first_token_site`` keeps position 0, so the block's
    intermediate and output layers (most of its cost) skip the other positions. Only valid for
    classifiers that read the first token of the last hidden state (BERT's pooler, RoBERTa/ELECTRA
    classification heads); callers check the logits against a full forward first.
    """
    _needs_cached_layout(model, "keep_first_token")
    last = get_path(sites.block(model, sites.num_layers(model)), sites.adapter(model).first_token_site)
    handle = last.register_forward_hook(lambda _m, _i, out: out[:, :1])
    try:
        yield
    finally:
        handle.remove()


class HeadGates:
    """Per-example gates ξ multiplying each head's context (Michel et al. 2019), all 1 in the forward pass.

    Call :meth:`prepare` with the batch size before each forward; after ``loss.backward()``
    ``grad`` is ``[batch, layers, heads]``: per example, because each example has its own gates and
    examples do not interact.
    """

    def __init__(self, n_layers: int, n_heads: int, head_size: int) -> None:
        self.n_layers, self.n_heads, self.head_size = n_layers, n_heads, head_size
        self.gates: torch.Tensor | None = None

    def prepare(self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self.gates = torch.ones(batch_size, self.n_layers, self.n_heads, device=device, dtype=dtype, requires_grad=True)
        return self.gates

    @property
    def grad(self) -> torch.Tensor | None:
        return None if self.gates is None else self.gates.grad

    def _hook(self, layer: int):
        def hook(_m, args):
            if self.gates is None:
                raise RuntimeError("HeadGates: call prepare(batch_size) before the forward pass")
            x = args[0]
            b, t = x.shape[:2]
            g = self.gates[:, layer - 1].to(x.dtype)  # [B, H]
            x = (x.view(b, t, self.n_heads, self.head_size) * g[:, None, :, None]).view(b, t, -1)
            return (x, *args[1:])

        return hook


@contextmanager
def head_gates(model: nn.Module) -> Iterator[HeadGates]:
    """Install a gate on every head of every layer (pre-hooks on the output projections)."""
    n = sites.num_layers(model)
    gates = HeadGates(n, sites.num_heads(model), sites.head_size(model))
    handles = on_layers(model, sites.out_proj, {layer: gates._hook(layer) for layer in range(1, n + 1)}, pre=True)
    try:
        yield gates
    finally:
        for h in handles:
            h.remove()
