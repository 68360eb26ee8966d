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
    WeightLayout,
    fused_value,
    get_path,
    linear_value,
    positions_after_padding,
    register_adapter,
)

_ASK_FOR_MAPS = MappingProxyType({"output_attentions": True})


def _layout(block: dict[str, str], embeddings: dict[str, str], top: dict[str, str] | None = None) -> WeightLayout:
    """A read-only :class:`WeightLayout` (canonical module name -> path)."""
    return WeightLayout(MappingProxyType(block), MappingProxyType(embeddings), MappingProxyType(top or {}))


#: BERT's embeddings (RoBERTa, XLM-R, ELECTRA, DeBERTa and ALBERT name them alike).
_BERT_EMBEDDINGS = {"word_embeddings": "embeddings.word_embeddings",
                    "position_embeddings": "embeddings.position_embeddings",
                    "token_type_embeddings": "embeddings.token_type_embeddings", "embedding_norm": "embeddings.LayerNorm"}
#: The FFN and the two post-norms of BERT's block (ELECTRA, DeBERTa-v2 and MPNet share them).
_BERT_FFN = {"attention_norm": "attention.output.LayerNorm", "ffn_in": "intermediate.dense", "ffn_out": "output.dense",
             "ffn_norm": "output.LayerNorm"}
_BERT_WEIGHTS = _layout({"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
                         "attention_output": "attention.output.dense", **_BERT_FFN}, _BERT_EMBEDDINGS)


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
        **{"weights": _BERT_WEIGHTS, **extra},
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
    weights=_layout(dict(_BERT_WEIGHTS.block), {**_BERT_EMBEDDINGS, "embedding_projection": "embeddings_project"}),
    notes="embeddings projected to the hidden size when embedding_size differs; layer 0 is the projection",
))
DISTILBERT = register_adapter(Adapter(
    family="DistilBERT", model_types=("distilbert",), blocks="transformer.layer", attention="attention",
    out_proj="attention.out_lin", value=linear_value("v_lin"), token_types=False, tokenizer="WordPiece",
    weights=_layout({"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
                     "attention_output": "attention.out_lin", "attention_norm": "sa_layer_norm", "ffn_in": "ffn.lin1",
                     "ffn_out": "ffn.lin2", "ffn_norm": "output_layer_norm"},
                    {"word_embeddings": "embeddings.word_embeddings", "position_embeddings": "embeddings.position_embeddings",
                     "embedding_norm": "embeddings.LayerNorm"}),
))
ALBERT = register_adapter(Adapter(
    family="ALBERT", model_types=("albert",), blocks="encoder.albert_layer_groups", attention="attention",
    out_proj="attention.dense", value=linear_value("value"), shared_blocks=True, layer_blocks=_albert_blocks,
    embeddings=("embeddings", "encoder.embedding_hidden_mapping_in"), tokenizer="SentencePiece unigram",
    notes="one layer module run N times: hooks are keyed by call order",
    weights=_layout({"query": "attention.query", "key": "attention.key", "value": "attention.value",
                     "attention_output": "attention.dense", "attention_norm": "attention.LayerNorm", "ffn_in": "ffn",
                     "ffn_out": "ffn_output", "ffn_norm": "full_layer_layer_norm"},
                    {**_BERT_EMBEDDINGS, "embedding_projection": "encoder.embedding_hidden_mapping_in"}),
))
DEBERTA_V2 = register_adapter(Adapter(
    family="DeBERTa-v2/v3", model_types=("deberta-v2",), blocks="encoder.layer", attention="attention.self",
    out_proj="attention.output.dense", value=linear_value("value_proj"), forward_kwargs=_ASK_FOR_MAPS,
    layer_output=_deberta_v2_output, max_tokens=_deberta_v2_max_tokens, tokenizer="SentencePiece unigram",
    notes="returns attention maps only when the forward asks for them",
    weights=_layout({"query": "attention.self.query_proj", "key": "attention.self.key_proj",
                     "value": "attention.self.value_proj", "position_query": "attention.self.pos_query_proj",
                     "position_key": "attention.self.pos_key_proj", "attention_output": "attention.output.dense",
                     **_BERT_FFN},
                    {**_BERT_EMBEDDINGS, "relative_embeddings": "encoder.rel_embeddings",
                     "relative_embedding_norm": "encoder.LayerNorm"}),
))
MPNET = register_adapter(Adapter(
    family="MPNet", model_types=("mpnet",), blocks="encoder.layer", attention="attention.attn",
    out_proj="attention.attn.o", value=linear_value("v"), forward_kwargs=_ASK_FOR_MAPS, token_types=False,
    max_tokens=lambda config: int(config.max_position_embeddings) - 2,  # position ids start after its fixed pad id 1
    tokenizer="WordPiece",
    weights=_layout({"query": "attention.attn.q", "key": "attention.attn.k", "value": "attention.attn.v",
                     "attention_output": "attention.attn.o", "attention_norm": "attention.LayerNorm", "ffn_in": "intermediate.dense",
                     "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"},
                    {"word_embeddings": "embeddings.word_embeddings", "position_embeddings": "embeddings.position_embeddings",
                     "embedding_norm": "embeddings.LayerNorm", "relative_attention_bias": "encoder.relative_attention_bias"}),
))
MODERNBERT = register_adapter(Adapter(
    family="ModernBERT", model_types=("modernbert",), blocks="layers", attention="attn", out_proj="attn.Wo",
    value=fused_value("Wqkv", 2), token_types=False, layer_output=_modernbert_output, tokenizer="byte-level BPE",
    norm_first=True,
    notes="local-window layers give full [T, T] maps with zeros outside the window",
    weights=_layout({"query": "attn.Wqkv:0/3", "key": "attn.Wqkv:1/3", "value": "attn.Wqkv:2/3", "attention_output": "attn.Wo",
                     "attention_norm": "attn_norm", "ffn_in": "mlp.Wi", "ffn_out": "mlp.Wo", "ffn_norm": "mlp_norm"},
                    {"word_embeddings": "embeddings.tok_embeddings", "embedding_norm": "embeddings.norm"},
                    {"final_norm": "final_norm"}),
))
