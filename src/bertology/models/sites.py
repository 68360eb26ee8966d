"""Where each activation lives inside a BERT-family encoder (BERT, RoBERTa, ELECTRA, MiniLM, ...).

bertology hooks the real Hugging Face modules; this file is the one place that knows their names.
Layer numbering follows DESIGN §3: hidden-state layer 0 is the embedding output, 1..N the blocks;
attention layers are 1..N.
"""
from __future__ import annotations

from torch import nn

from bertology.errors import BertologyError


def _encoder(model: nn.Module) -> nn.Module:
    return getattr(model, "base_model", model)


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks (``encoder.layer``) of a BERT-family model or its task wrapper."""
    enc = _encoder(model)
    layers = getattr(getattr(enc, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise BertologyError(
            f"{type(model).__name__} is not a BERT-family encoder (no encoder.layer); "
            "bertology supports BERT, RoBERTa, ELECTRA, MiniLM and models with the same layout."
        )
    return layers


def embeddings(model: nn.Module) -> nn.Module:
    """The embedding module whose output is hidden-state layer 0."""
    emb = getattr(_encoder(model), "embeddings", None)
    if emb is None:
        raise BertologyError(f"{type(model).__name__} has no embeddings module.")
    return emb


def self_attention(model: nn.Module, layer: int) -> nn.Module:
    """The self-attention module of attention layer ``layer`` (1-based); returns (context, probs)."""
    return blocks(model)[layer - 1].attention.self


def attention_output_dense(model: nn.Module, layer: int) -> nn.Module:
    """The output projection whose input is the concatenated per-head contexts (for head ablation)."""
    return blocks(model)[layer - 1].attention.output.dense


def num_layers(model: nn.Module) -> int:
    return len(blocks(model))
