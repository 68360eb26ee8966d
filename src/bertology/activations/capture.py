"""A paired activation cache: base and tuned activations for the same tokens, held in memory, by layer.

What TransformerLens's ``run_with_cache`` gives for one model (an ``ActivationCache`` indexed by activation and
layer), for a pair: ``cache["hidden_states", 3]`` is ``(base, tuned)``, two ``[examples, tokens, hidden]`` tensors
of the same tokens. It is made by the capture the extraction loop uses (:func:`bertology.activations.extract.
capture_forward`: the same hooks, float32 activations), so what a prototype reads here is what an analysis's
``update`` reads in a run; :meth:`PairedCache.batch` hands the whole cache over as that
:class:`~bertology.activations.batch.PairBatch`.

Everything is kept in memory (unlike a run, which streams), so a capture is bounded: ``max_examples``, and an
estimate of its size checked against a limit before any forward pass runs.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from bertology.activations.batch import PairBatch
from bertology.activations.extract import capture_forward
from bertology.data.batching import collate
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample, encode_corpus
from bertology.errors import BertologyError
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair

#: What a paired capture can hold (the extraction loop's activations).
KINDS = ("hidden_states", "attentions")
#: Bytes per stored value (float32).
_FLOAT = 4


def chosen_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    """The layers to keep (0 = embeddings, 1..N blocks; None: all), refused when one is outside 0..N."""
    chosen = tuple(range(num_layers + 1)) if layers is None else tuple(sorted({int(x) for x in layers}))
    outside = [x for x in chosen if not 0 <= x <= num_layers]
    if outside or not chosen:
        raise BertologyError(f"layers are 0 (the embeddings) to {num_layers}; not {list(outside) or 'none'}.")
    return chosen


def chosen_kinds(what: str | Sequence[str]) -> tuple[str, ...]:
    """``what`` as a tuple of :data:`KINDS`, refused when empty or naming another activation."""
    kinds = (what,) if isinstance(what, str) else tuple(what)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise BertologyError(f"what names activations from {', '.join(KINDS)}; not {unknown or 'none'}.")
    return tuple(k for k in KINDS if k in kinds)


def estimate_bytes(n: int, width: int, pair: ModelPair, layers: Sequence[int], kinds: Sequence[str]) -> int:
    """Bytes the cache will hold: both models' float32 tensors of ``n`` examples padded to ``width`` tokens."""
    hidden, heads = int(pair.base.model.config.hidden_size), pair.num_heads
    per_model = 0
    if "hidden_states" in kinds:
        per_model += len(layers) * n * width * hidden
    if "attentions" in kinds:
        per_model += len([x for x in layers if x >= 1]) * n * heads * width * width
    return 2 * _FLOAT * per_model


def check_size(estimate: int, limit_gb: float, n: int, width: int) -> None:
    """Refuse a capture whose estimate is above ``limit_gb`` GB, saying how large it would be and what shrinks it."""
    if estimate > limit_gb * 1e9:
        size = f"{estimate / 1e9:.2f} GB" if estimate >= 1e8 else f"{estimate / 1e6:.2f} MB"
        raise BertologyError(f"This capture would hold {size} in memory ({n} examples padded to "
                             f"{width} tokens, both models, float32), above the limit of {limit_gb:g} GB: capture "
                             "fewer examples, layers or activations (what=), a shorter max_length, or raise "
                             "memory_limit_gb. A run (bt.compare) streams instead of holding everything.")


@dataclass
class PairedCache:
    """Base and tuned activations of the same examples: ``cache[kind, layer] -> (base, tuned)``.

    ``hidden_states`` layers are 0..N (``[examples, tokens, hidden]``), ``attentions`` layers 1..N
    (``[examples, heads, tokens, tokens]``); examples in corpus order, padded to the longest with zeros
    (``mask`` is True on real tokens, ``content`` on real tokens that are not special). ``tokens[i]`` are
    example ``i``'s token strings, ``texts[i]`` its text (``(text, pair)`` for a sentence pair).
    """

    tensors: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]
    items: list[EncodedExample]
    tokens: list[list[str]]
    texts: list
    input_ids: torch.Tensor
    mask: torch.Tensor
    content: torch.Tensor
    num_layers: int
    info: dict = field(default_factory=dict)

    def __getitem__(self, key: tuple[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(key, tuple) and len(key) == 2):
            raise KeyError(f"index a paired cache by (kind, layer), e.g. cache['hidden_states', 1]; not {key!r}")
        if key not in self.tensors:
            kinds = sorted({k for k, _ in self.tensors})
            layers = {k: sorted(layer for kk, layer in self.tensors if kk == k) for k in kinds}
            raise KeyError(f"no {key!r} in this cache; it holds " +
                           "; ".join(f"{k} layers {layers[k]}" for k in kinds) + " (attentions start at layer 1)")
        return self.tensors[key]

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self) -> list[tuple[str, int]]:
        """Every ``(kind, layer)`` held, hidden states first."""
        return list(self.tensors)

    @property
    def n_examples(self) -> int:
        return len(self.items)

    @property
    def nbytes(self) -> int:
        """Bytes held by the activation tensors (both models)."""
        return sum(t.element_size() * t.nelement() for pair in self.tensors.values() for t in pair)

    def batch(self) -> PairBatch:
        """The whole cache as the :class:`PairBatch` an analysis's ``update`` receives (layers not captured are
        None), so a prototype analysis can be fed it before it runs in ``bt.compare``."""
        sides = []
        for side in (0, 1):
            hidden = [self.tensors[("hidden_states", x)][side] if ("hidden_states", x) in self else None
                      for x in range(self.num_layers + 1)]
            maps = [self.tensors[("attentions", x)][side] if ("attentions", x) in self else None
                    for x in range(self.num_layers + 1)]
            sides.append(Captured(hidden, maps))
        return PairBatch(list(self.items), self.input_ids, self.mask, self.content, self.mask.sum(1), *sides)

    def __repr__(self) -> str:
        kinds = sorted({k for k, _ in self.tensors})
        return (f"<PairedCache: {self.n_examples} examples x {self.mask.shape[1]} tokens, {', '.join(kinds)}, "
                f"{len(self.tensors)} (kind, layer) pairs, {self.nbytes / 1e6:.2f} MB>")


def _batches(items: Sequence[EncodedExample], size: int) -> Iterator[tuple[int, list[EncodedExample]]]:
    """``(first row, items)`` in corpus order (rows of the cache are the examples' order)."""
    for start in range(0, len(items), size):
        yield start, list(items[start:start + size])


def capture_pair(pair: ModelPair, encoded: EncodedCorpus, *, layers: Sequence[int], kinds: Sequence[str],
                 batch_size: int = 32, device: str = "cpu") -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """Both models' ``kinds`` at ``layers`` for every encoded example, as zero-padded float32 CPU tensors."""
    items, want = encoded.items, frozenset(kinds)
    width, n = max(len(it) for it in items), len(items)
    pad_id, dev = pair.tokenizer.pad_token_id or 0, torch.device(device)
    hidden = int(pair.base.model.config.hidden_size)
    shapes = {"hidden_states": (n, width, hidden), "attentions": (n, pair.num_heads, width, width)}
    out = {(k, x): (torch.zeros(shapes[k]), torch.zeros(shapes[k]))
           for k in KINDS if k in want for x in layers if k == "hidden_states" or x >= 1}
    with torch.inference_mode():
        for start, chunk in _batches(items, batch_size):
            t = collate(chunk, pad_id)
            w, rows = t["input_ids"].shape[1], slice(start, start + len(chunk))
            for side, model in enumerate((pair.base.model, pair.tuned.model)):
                cap = capture_forward(model, t, want, dev)
                for (kind, x), held in out.items():
                    value = (cap.hidden_states if kind == "hidden_states" else cap.attentions)[x].float().cpu()
                    real = t["mask"].to(value.dtype)  # zero where a padding token reads or is read
                    if kind == "hidden_states":
                        held[side][rows, :w] = value * real[:, :, None]
                    else:
                        held[side][rows, :, :w, :w] = value * real[:, None, :, None] * real[:, None, None, :]
    return out


def paired_cache(pair: ModelPair, encoded: EncodedCorpus, texts: Sequence, *, layers: Sequence[int] | None,
                 kinds: Sequence[str], limit_gb: float, device: str = "cpu") -> PairedCache:
    """Capture ``encoded`` through both models into a :class:`PairedCache` (refused above ``limit_gb``)."""
    if not encoded.items:
        raise BertologyError("No example is left to capture (all were longer than max_length and skipped).")
    chosen, kinds = chosen_layers(layers, pair.num_layers), chosen_kinds(kinds)
    width, n = max(len(it) for it in encoded.items), len(encoded.items)
    check_size(estimate_bytes(n, width, pair, chosen, kinds), limit_gb, n, width)
    tensors = capture_pair(pair, encoded, layers=chosen, kinds=kinds, device=device)
    t = collate(encoded.items, pair.tokenizer.pad_token_id or 0)
    tokens = [pair.tokenizer.convert_ids_to_tokens([int(i) for i in it.input_ids]) for it in encoded.items]
    info = {"skipped_overlong": list(encoded.skipped), "truncated": list(encoded.truncated),
            "max_length": encoded.max_length}
    return PairedCache(tensors, list(encoded.items), tokens, [texts[it.index] for it in encoded.items],
                       t["input_ids"], t["mask"], t["content"], pair.num_layers, info)


def capture_data(base: str, tuned: str, corpus: Corpus, *, layers: Sequence[int] | None, what: Sequence[str],
                 max_length: int, limit_gb: float) -> PairedCache:
    """``bt.capture``: load the pair, encode ``corpus`` (longer than ``max_length``: skipped) and capture it."""
    pair = ModelPair.load(base, tuned)
    encoded = encode_corpus(corpus, pair.tokenizer, max_length, "skip")
    texts = [ex.text if ex.text_pair is None else (ex.text, ex.text_pair) for ex in corpus]
    return paired_cache(pair, encoded, texts, layers=layers, kinds=what, limit_gb=limit_gb)
