"""Streaming analyses of a model in training against its cached base activations, on a fixed probe set.

A :class:`ProbeSet` is the probe sentences tokenised and batched once. :func:`base_activations` runs the
base model over it once and keeps what the analyses need (on the CPU); :func:`snapshot` then runs only the
model in training, feeding each analysis a :class:`~bertology.activations.batch.PairBatch` of the cached
base activations and the fresh ones, exactly as ``bertology compare`` would on the same batches.

:func:`quiet_forward` is what keeps a training run bit-identical with and without the analyses: the
forward runs in eval mode under ``torch.no_grad()``, every module's train/eval flag is put back as it
was, and torch's CPU and CUDA random states (dropout), NumPy's and Python's are restored afterwards.
"""
from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.activations.batch import PairBatch
from bertology.activations.extract import capture_forward
from bertology.blas import one_blas_thread
from bertology.data.batching import collate, length_batches
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample
from bertology.models.hooks import Captured


@dataclass
class ProbeSet:
    """The probe corpus, tokenised once, and its length-bucketed padded batches."""

    corpus: Corpus
    encoded: EncodedCorpus
    batches: list[tuple[list[EncodedExample], dict[str, torch.Tensor]]]

    @classmethod
    def build(cls, corpus: Corpus, tokenizer, *, max_length: int, batch_size: int, pad_to: int | None = None) -> "ProbeSet":
        """Tokenise ``corpus`` (over-long examples are skipped and counted) and collate its batches once."""
        from bertology.data.encode import encode_corpus

        encoded = encode_corpus(corpus, tokenizer, max_length, "skip")
        pad_id = tokenizer.pad_token_id or 0
        batches = [(items, collate(items, pad_id, pad_to)) for items in length_batches(encoded.items, batch_size)]
        return cls(corpus, encoded, batches)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


@contextlib.contextmanager
def quiet_forward(model: torch.nn.Module) -> Iterator[None]:
    """Run the block in eval mode without autograd, then restore every module's mode and every RNG state.

    Eval mode switches dropout off, so the forward should draw no random numbers; the random states are
    restored anyway (a family or a hook that draws must not shift the training run's dropout masks).
    """
    modes = [(m, m.training) for m in model.modules()]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            yield
    finally:
        for module, training in modes:
            module.training = training
        random.setstate(py_state)
        np.random.set_state(np_state)


def _to(cap: Captured, device: torch.device) -> Captured:
    """The captured tensors moved to ``device`` (a new record; ``None`` entries stay ``None``)."""
    move = lambda t: None if t is None else t.to(device)  # noqa: E731 - one-line helper
    return Captured([move(h) for h in cap.hidden_states], [move(a) for a in cap.attentions])


def base_activations(model: torch.nn.Module, probe: ProbeSet, requires: frozenset[str]) -> list[Captured]:
    """The base model's activations on every probe batch (what ``requires`` asks for), kept on the CPU.

    Memory: per batch ``(N + 1) * B * T * hidden`` floats of hidden states and ``N * B * heads * T * T`` of
    attention maps (float32): for 64 sentences of 32 tokens and BERT-base, about 82 MB and 38 MB.
    """
    device = model_device(model)
    with quiet_forward(model):
        return [_to(capture_forward(model, t, requires, device), torch.device("cpu")) for _items, t in probe.batches]


def snapshot(model: torch.nn.Module, probe: ProbeSet, base: Sequence[Captured], analyses: Sequence,
             requires: frozenset[str]) -> list:
    """Feed ``analyses`` one pass of ``model`` over the probe set against the cached ``base``; return them."""
    device = model_device(model)
    with quiet_forward(model), one_blas_thread():
        for (items, t), base_cap in zip(probe.batches, base):
            tuned = capture_forward(model, t, requires, device)
            batch = PairBatch(items, t["input_ids"], t["mask"].to(device), t["content"].to(device), t["lengths"],
                              _to(base_cap, device), tuned)
            for analysis in analyses:
                analysis.update(batch)
    return list(analyses)
