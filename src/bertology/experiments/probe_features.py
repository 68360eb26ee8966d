"""The structural probes' word features: one pass per model and split, words mean-pooled over their
pieces, held in float32 or float16 and cached in a fingerprinted safetensors file that training reads
memory-mapped (:mod:`bertology.experiments.probe` trains and scores the probes on them).

Kept apart from the probes because it is the part that touches the encoders and the disk: a
``[layers, words, hidden]`` tensor per model and split (BERT-base on UD EWT train: 8.2 GB per model in
float32), written batch by batch into the cache file's mapping so the process never holds a copy.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.results import atomic_write


class Sentences(Protocol):
    """What the feature pass reads of a :class:`bertology.experiments.probe.TreeSet` (named here, not
    imported: the probes import this module)."""

    offsets: np.ndarray  # first word of each sentence in the concatenated word axis
    n_words: int

    def corpus(self) -> Corpus: ...


logger = logging.getLogger(__name__)

#: How word features may be held (``ProbeSettings.feature_dtype``, ``bertology probe --feature-dtype``).
FEATURE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


def _unpack(model) -> tuple[torch.nn.Module, object, dict]:
    """(encoder, tokenizer, description) of a LoadedModel or a (model, tokenizer) tuple."""
    from bertology.models.loading import LoadedModel, encoder_of

    if isinstance(model, LoadedModel):
        return model.encoder, model.tokenizer, model.describe()
    if isinstance(model, tuple) and len(model) == 2:
        m, tok = model
        cfg = m.config
        return encoder_of(m), tok, {"class": type(m).__name__, "model_type": cfg.model_type,
                                    "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size}
    raise TypeError(f"expected a LoadedModel or a (model, tokenizer) tuple, got {type(model).__name__}")


def _pooling_matrix(items, n_words: Sequence[int], width: int) -> np.ndarray:
    """``[B, max words, width]`` weights that average each word's pieces (the "mean" of
    :func:`bertology.data.align.pool_words`, as one batched product; special tokens get no weight)."""
    out = np.zeros((len(items), max(n_words), width), dtype=np.float32)
    for row, it in enumerate(items):
        wid = it.word_ids
        tok = np.nonzero(wid >= 0)[0]
        counts = np.bincount(wid[tok], minlength=n_words[row]).astype(np.float32)
        out[row, wid[tok], tok] = 1.0 / counts[wid[tok]]
    return out


def extract_word_features(
    model,
    trees: Sentences,
    layers: Sequence[int],
    *,
    batch_size: int = 32,
    device: str = "cpu",
    on_batch: Callable[[int], None] | None = None,
    dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Word vectors ``[len(layers), n_words, hidden]`` (``dtype``, CPU) of every sentence, words concatenated.

    One forward per length-sorted batch under ``inference_mode``; each word is the mean of its
    sub-word pieces (the same numbers as :func:`bertology.data.align.pool_words` with ``"mean"``, tested),
    computed in float32 whatever the model runs in; only the stored result is rounded to ``dtype``.
    Sentences must already fit (see :func:`encodable`). ``out``, when given, is filled instead of a new
    tensor (of that shape and ``dtype``; e.g. a file mapping, so the features never sit in memory whole).

    Precision of ``torch.float16``: each value is the float32 one rounded to nearest (exactly
    ``x32.half()``, tested), a relative error of at most 2^-11 (4.9e-4) for ``|x| >= 2^-14``
    (6.1e-5); smaller values are subnormal and carry an absolute error of at most 2^-25 (3e-8).
    The range ends at 65504: a word vector beyond it would become ``inf``, so it is refused with a
    :class:`BertologyError` naming the model and layer (re-run with float32 features) rather than
    trained on or silently widened (which would double the memory the user chose to save).
    """
    from bertology.activations.extract import capture_forward
    from bertology.data.batching import collate, length_batches
    from bertology.data.encode import encode_example

    encoder, tok, _ = _unpack(model)
    dev = torch.device(device)
    encoder.to(dev).eval()
    corpus = trees.corpus()
    items = [encode_example(tok, ex, i) for i, ex in enumerate(corpus)]
    offsets = trees.offsets
    hidden = encoder.config.hidden_size
    shape = (len(layers), trees.n_words, hidden)
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    elif tuple(out.shape) != shape or out.dtype != dtype:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}; the features are {shape} {dtype}")
    pad_id = getattr(tok, "pad_token_id", None) or 0
    with torch.inference_mode():
        for batch in length_batches(items, batch_size):
            t = collate(batch, pad_id)
            cap = capture_forward(encoder, t, frozenset({"hidden_states"}), dev)
            hs = torch.stack([cap.hidden_states[layer] for layer in layers])  # [L, B, T, H]
            pool = torch.from_numpy(_pooling_matrix(batch, [len(corpus[it.index].words) for it in batch], hs.shape[2]))
            words = torch.einsum("bwt,lbth->lbwh", pool.to(hs.device), hs.float()).cpu()  # [L, B, W, H], float32
            if not torch.isfinite(words).all():
                raise BertologyError("Non-finite word features (a word without sub-words slipped through alignment).")
            if dtype != torch.float32:
                words = _rounded(words, dtype, layers, getattr(model, "name", None) or "the model")
            for row, it in enumerate(batch):
                n = len(corpus[it.index].words)
                out[:, offsets[it.index] : offsets[it.index] + n] = words[:, row, :n]
            if on_batch is not None:
                on_batch(len(batch))
    return out


def _rounded(words: torch.Tensor, dtype: torch.dtype, layers: Sequence[int], model_name: str) -> torch.Tensor:
    """Finite float32 ``words`` ``[L, B, W, H]`` rounded to ``dtype``; a value beyond its range is an error."""
    out = words.to(dtype)
    inf = torch.isinf(out).flatten(1).any(1)
    if inf.any():
        k = int(inf.nonzero()[0, 0])
        peak = float(words[k].abs().max())
        raise BertologyError(
            f"Word features of {model_name}, layer {layers[k]}, reach {peak:.4g}, beyond {str(dtype).removeprefix('torch.')}'s "
            f"largest value {torch.finfo(dtype).max:.0f}; hold them in float32 (--feature-dtype float32) to probe this model.")
    return out


_SAFETENSORS_DTYPES = {torch.float16: ("F16", "<f2"), torch.float32: ("F32", "<f4")}


def _mapped_safetensors(path: Path, shape: tuple[int, ...], dtype: torch.dtype, metadata: dict[str, str]) -> np.memmap:
    """A new safetensors file at ``path`` holding one tensor ``features`` of ``shape`` and ``dtype``, returned
    as a writable shared mapping of its data (``torch.from_numpy`` of it is a tensor on the file): what is
    written to it lands in the file through the page cache, without a copy in memory. The layout is
    safetensors' own (an 8-byte little-endian header length, the JSON header padded with spaces to a
    multiple of 8 bytes, the raw little-endian data), so ``safe_open`` reads it (tested).
    """
    import struct

    code, np_dtype = _SAFETENSORS_DTYPES[dtype]
    nbytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
    header = json.dumps({"features": {"dtype": code, "shape": list(shape), "data_offsets": [0, nbytes]},
                         "__metadata__": metadata}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + nbytes)
    return np.memmap(path, dtype=np_dtype, mode="r+", offset=8 + len(header), shape=shape)


def _cached_features(
    path: Path | None, key: str, compute: Callable[[torch.Tensor | None], torch.Tensor],
    shape: tuple[int, ...] | None = None, dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, bool]:
    """Features from ``path`` when its fingerprint is ``key``; else computed and (atomically) saved there.

    ``compute(out)`` returns the features, filling ``out`` when it is a tensor. With a ``path`` and the
    features' ``shape``, ``out`` is the new file's writable mapping (:func:`_mapped_safetensors`), so the
    features are written to disk batch by batch and never held in memory whole; without a ``shape`` they
    are computed in memory, then saved. Either way the tensor returned is backed by the memory-mapped file
    (safetensors' ``load_file`` maps it and reads pages as they are touched): the features sit in the page
    cache, which the kernel can drop and re-read, not in this process's anonymous memory (measured:
    docs/results/benchmarks.md, item 4).
    """
    from safetensors.torch import load_file, safe_open, save_file

    if path is not None and path.exists():
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
            if meta.get("fingerprint") == key:
                return load_file(str(path))["features"], True  # memory-mapped, not copied
        except Exception as err:  # a truncated or foreign file: recompute
            logger.warning("ignoring unreadable feature cache %s (%s)", path, err)
    if path is None:
        return compute(None), False
    if shape is None:
        x = compute(None)
        atomic_write(path, lambda p: save_file({"features": x.contiguous()}, str(p), metadata={"fingerprint": key}))
        del x  # the only copy in memory: serve the file's mapping instead
    else:
        def write(p: Path) -> None:
            mapped = _mapped_safetensors(p, shape, dtype, {"fingerprint": key})
            compute(torch.from_numpy(mapped))
            mapped.flush()
            del mapped  # unmapped before the file is moved into place

        atomic_write(path, write)
    return load_file(str(path))["features"], False


def _model_fingerprint(encoder: torch.nn.Module, desc: dict) -> str:
    """The weights' identity for the feature cache; a model run in bfloat16/float16 has other features."""
    dtype = next(encoder.parameters()).dtype
    suffix = "" if dtype == torch.float32 else f":{str(dtype).removeprefix('torch.')}"
    if desc.get("weights_sha256"):
        return str(desc["weights_sha256"]) + suffix
    d = hashlib.sha256()
    for name, p in sorted(encoder.state_dict().items()):
        d.update(name.encode())
        d.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype
    return d.hexdigest() + suffix


#: A split's word features another probe computed, offered for reuse: ``(sentences_key, layers, features)``.
SharedFeatures = tuple[str, tuple[int, ...], torch.Tensor]


@dataclass(frozen=True)
class FeaturePass:
    """One pass of the models over the probe sentences for their word features: the hidden ``layers`` (None: all,
    0 = embeddings), ``batch_size`` sentences a forward on ``device``, sentences over ``max_length`` tokens dropped
    (counted); ``work_dir`` keeps the features for a rerun after an interruption, ``shared`` offers another probe's
    float32 features of the same sentences (:func:`word_features_once`)."""

    layers: Sequence[int] | None = None
    batch_size: int = 32
    device: str = "cpu"
    max_length: int = 512
    work_dir: Path | None = None
    shared: dict | None = None


def word_features_once(models: dict, splits: dict, layers: dict, *, work: Path | None = None,
                       shared: dict[str, list[SharedFeatures]] | None = None, batch_size: int = 32,
                       device: str = "cpu",
                       on_progress: Callable[[str, int, int], None] | None = None) -> tuple[dict, dict]:
    """Every model's float32 word features ``[len(layers[m]), n_words, hidden]`` of every split (``splits``: name ->
    :class:`~bertology.experiments.probe_trees.WordSentences`), each extracted once: taken from ``shared[model]``
    when another probe (the structural probes) already holds float32 features of the very same sentences and
    layers, else from ``work/features/words-<split>-<model>.safetensors`` when an interrupted run left them there,
    else computed (and cached there). Returns the features (``split -> model -> array``) and, per split and model,
    where they came from (``shared``, ``cache`` or ``computed``)."""
    progress = on_progress or (lambda *_: None)
    feats: dict = {s: {} for s in splits}
    source: dict = {s: {} for s in splits}
    for split, words in splits.items():
        key_words = words.sentences_key()
        for name, model in models.items():
            encoder, _, desc = _unpack(model)
            hit = next((f for k, ls, f in (shared or {}).get(name, [])
                        if k == key_words and tuple(ls) == tuple(layers[name]) and f.dtype == torch.float32), None)
            if hit is not None:
                feats[split][name], source[split][name] = hit.numpy(), "shared"
                continue
            stage, done = f"features {split} {name}", [0]

            def on_batch(k, stage=stage, done=done, total=len(words)):
                done[0] += k
                progress(stage, done[0], total)

            key = cache_key(_model_fingerprint(encoder, desc), key_words, list(layers[name]), "mean", "float32")
            path = None if work is None else work / "features" / f"words-{split}-{name}.safetensors"
            x, cached = _cached_features(
                path, key, lambda out, model=model, name=name, words=words, cb=on_batch: extract_word_features(
                    model, words, layers[name], batch_size=batch_size, device=device, on_batch=cb, out=out),
                shape=(len(layers[name]), words.n_words, encoder.config.hidden_size))
            feats[split][name], source[split][name] = x.numpy(), "cache" if cached else "computed"
    return feats, source


def cache_key(*parts: object) -> str:
    """A feature cache's key (a full SHA-256 of the parts as JSON, not a run fingerprint): the model, the
    sentences, the layers, the pooling, the dtype (kept as written before, so caches stay valid)."""
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()
