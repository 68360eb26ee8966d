"""Test helpers, not a runtime room: tiny models and planted-signal pairs (:mod:`bertology.testing.models`),
tokenizers of every family trained in a few lines (:mod:`bertology.testing.tokenizers`) and a synthetic study
folder with planted effects (:mod:`bertology.testing.synthetic`).

``from bertology.testing import tiny_bert_pair, perturb_head, squad_fixture`` is the public face the docs name;
the names of :mod:`bertology.testing.models` are all importable from here. Nothing in the package's runtime rooms
imports this package.
"""
from __future__ import annotations

from bertology.testing.models import (
    DEPRELS,
    EXTRA_WORDS,
    FAMILY_CONFIGS,
    HOST_COPIES,
    LORA_HEADS,
    PUNCT,
    QA_PARAGRAPHS,
    SENTENCES,
    SPECIALS,
    SUBWORDS,
    TINY_WORDS,
    UPOS_TAGS,
    XPOS_TAGS,
    SideBySide,
    batch_on,
    captured_batches,
    check_final_intervals,
    classifier_logits,
    move_every_weight,
    moved_classifier_pair,
    no_host_copies,
    peft_merged_model,
    perturb_head,
    random_annotated_corpus,
    random_heads,
    save_lora_adapter,
    save_tiny_bert,
    save_tiny_family,
    save_tiny_qa,
    save_tiny_tagger,
    set_classifier_bias,
    split_classifier,
    squad_fixture,
    tiny_bert_pair,
    tiny_config,
    tiny_family_config,
    tiny_tokenizer,
    tiny_vocab,
)

__all__ = [
    "DEPRELS", "EXTRA_WORDS", "FAMILY_CONFIGS", "HOST_COPIES", "LORA_HEADS", "PUNCT", "QA_PARAGRAPHS", "SENTENCES",
    "SPECIALS", "SUBWORDS", "TINY_WORDS", "UPOS_TAGS", "XPOS_TAGS", "SideBySide", "batch_on", "captured_batches",
    "check_final_intervals", "classifier_logits", "move_every_weight", "moved_classifier_pair", "no_host_copies",
    "peft_merged_model", "perturb_head", "random_annotated_corpus", "random_heads", "save_lora_adapter",
    "save_tiny_bert", "save_tiny_family", "save_tiny_qa", "save_tiny_tagger", "set_classifier_bias",
    "split_classifier", "squad_fixture", "tiny_bert_pair", "tiny_config", "tiny_family_config", "tiny_tokenizer",
    "tiny_vocab",
]
