"""One adapter per encoder family (checked on transformers 5.24 with tiny random models of each).

Adding a family is one ``register_adapter`` call here and one tiny config in
:mod:`bertology.testing`; the conformance tests then run every analysis on it.
"""
from __future__ import annotations

from types import MappingProxyType

from torch import nn

from bertology.errors import BertologyError
from bertology.models.adapters.base import (
    Adapter,
    fused_value,
    get_path,
    linear_value,
    positions_after_padding,
    register_adapter,
)

_ASK_FOR_MAPS = MappingProxyType({"output_attentions": True})


def _bert_layout(family: str, model_types: tuple[str, ...], tokenizer: str, **extra) -> Adapter:
    """BERT's module tree: ``encoder.layer[i].attention.self`` returns (context, probs)."""
    return Adapter(
        family=family,
        model_types=model_types,
        blocks="encoder.layer",
        attention="attention.self",
        out_proj="attention.output.dense",
        value=linear_value("value"),
        cached_sweep=True,
        first_token_site="attention.output",
        tokenizer=tokenizer,
        **extra,
    )


def _deberta_v2_max_tokens(config) -> int | None:
    """DeBERTa-v2/v3 use relative positions only (``position_biased_input`` False): no absolute limit."""
    return int(config.max_position_embeddings) if getattr(config, "position_biased_input", True) else None


def _albert_blocks(encoder: nn.Module) -> list[nn.Module]:
    """The AlbertLayer run at each depth: depth i uses group int(i / (N / G)) (ALBERT's own rule)."""
    cfg = encoder.config
    if int(getattr(cfg, "inner_group_num", 1)) != 1:
        raise BertologyError(
            f"ALBERT with inner_group_num={cfg.inner_group_num} is not supported: bertology numbers one layer per "
            "group call (every released ALBERT has inner_group_num=1)."
        )
    groups = get_path(encoder, "encoder.albert_layer_groups")
    n, g = int(cfg.num_hidden_layers), int(cfg.num_hidden_groups)
    return [groups[int(i / (n / g))].albert_layers[0] for i in range(n)]


def _deberta_v2_output(encoder: nn.Module, layer: int) -> nn.Module | None:
    """DeBERTa-v2 adds a convolution to block 1's output (conv_kernel_size > 0): hidden state 1 is its output."""
    conv = getattr(encoder.encoder, "conv", None)
    return conv if layer == 1 and conv is not None else None


def _modernbert_output(encoder: nn.Module, layer: int) -> nn.Module | None:
    """ModernBERT's last hidden state is the final norm's output (as in its own ``hidden_states``)."""
    return encoder.final_norm if layer == int(encoder.config.num_hidden_layers) else None


BERT = register_adapter(_bert_layout("BERT", ("bert",), "WordPiece"))
ROBERTA = register_adapter(_bert_layout("RoBERTa", ("roberta", "camembert"), "byte-level BPE",
                                      max_tokens=positions_after_padding))
XLM_R = register_adapter(_bert_layout("XLM-RoBERTa", ("xlm-roberta",), "SentencePiece unigram",
                                      max_tokens=positions_after_padding))
ELECTRA = register_adapter(_bert_layout(
    "ELECTRA", ("electra",), "WordPiece", embeddings=("embeddings", "embeddings_project"),
    notes="embeddings projected to the hidden size when embedding_size differs; layer 0 is the projection",
))
DISTILBERT = register_adapter(Adapter(
    family="DistilBERT", model_types=("distilbert",), blocks="transformer.layer", attention="attention",
    out_proj="attention.out_lin", value=linear_value("v_lin"), token_types=False, tokenizer="WordPiece",
))
ALBERT = register_adapter(Adapter(
    family="ALBERT", model_types=("albert",), blocks="encoder.albert_layer_groups", attention="attention",
    out_proj="attention.dense", value=linear_value("value"), shared_blocks=True, layer_blocks=_albert_blocks,
    embeddings=("embeddings", "encoder.embedding_hidden_mapping_in"), tokenizer="SentencePiece unigram",
    notes="one layer module run N times: hooks are keyed by call order",
))
DEBERTA_V2 = register_adapter(Adapter(
    family="DeBERTa-v2/v3", model_types=("deberta-v2",), blocks="encoder.layer", attention="attention.self",
    out_proj="attention.output.dense", value=linear_value("value_proj"), forward_kwargs=_ASK_FOR_MAPS,
    layer_output=_deberta_v2_output, max_tokens=_deberta_v2_max_tokens, tokenizer="SentencePiece unigram",
    notes="returns attention maps only when the forward asks for them",
))
MPNET = register_adapter(Adapter(
    family="MPNet", model_types=("mpnet",), blocks="encoder.layer", attention="attention.attn",
    out_proj="attention.attn.o", value=linear_value("v"), forward_kwargs=_ASK_FOR_MAPS, token_types=False,
    max_tokens=lambda config: int(config.max_position_embeddings) - 2,  # position ids start after its fixed pad id 1
    tokenizer="WordPiece",
))
MODERNBERT = register_adapter(Adapter(
    family="ModernBERT", model_types=("modernbert",), blocks="layers", attention="attn", out_proj="attn.Wo",
    value=fused_value("Wqkv", 2), token_types=False, layer_output=_modernbert_output, tokenizer="byte-level BPE",
    notes="local-window layers give full [T, T] maps with zeros outside the window",
))
