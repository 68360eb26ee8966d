"""Tiny tokenizers of the three families BERT-like models use, built offline in a fraction of a second.

:func:`tiny_tokenizer` builds a WordPiece (BERT), byte-level BPE (RoBERTa / GPT-2 / ModernBERT) or
Metaspace Unigram (XLM-R / ALBERT / DeBERTa-v3 SentencePiece) tokenizer whose vocabulary is learnt
from :data:`TRAINING_TEXT`, gives it the family's normaliser, pre-tokenizer, special tokens and
post-processor, saves it with ``save_pretrained`` and loads it back with ``AutoTokenizer``, so tests
exercise what loading a real checkpoint gives. The vocabularies are small on purpose: ordinary words
split into several pieces, which is where word alignment goes wrong. The same call always gives the
same vocabulary and ids.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from transformers import AutoTokenizer, PreTrainedTokenizerFast

TokenizerKind = Literal["wordpiece", "bpe", "unigram"]
TOKENIZER_KINDS: tuple[str, ...] = ("wordpiece", "bpe", "unigram")

#: The training text: short English sentences with punctuation, contractions, digits and accents.
TRAINING_TEXT: tuple[str, ...] = (
    "The movie is just great, and the actors were wonderful!",
    "I didn't like the plot; it was boring and far too long.",
    "She really liked the story, but he hated the ending.",
    "John saw Mary read a book in the old house at night.",
    "The cat sat on the mat. The dog ran fast to the big red house.",
    "We don't think they're coming, aren't they?",
    "A naïve critic ate crème brûlée at a café in Zürich.",
    "The film (released in 2019) was \"surprisingly\" funny.",
    "Was it good? No, it wasn't: it was dull, slow and predictable.",
    "Reading books, watching movies and playing games are fun things to do.",
    "The children played happily in the garden while their parents talked.",
    "Nobody expected the ending to be so emotional and well-acted.",
)

_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _bpe_pieces(normalizer, pre_tokenizer, vocab_size: int, specials: list[str], unk: str):
    """A plain BPE trained on :data:`TRAINING_TEXT` after ``normalizer`` and ``pre_tokenizer``.

    The WordPiece and Unigram vocabularies are derived from it because their own trainers are not
    reproducible (WordPiece's "##" pieces and Unigram's scores vary from run to run with Rust hash
    order), while BPE training over a sorted initial alphabet is: the same call gives the same ids.
    """
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    words = (w for line in TRAINING_TEXT for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    alphabet = sorted({c for w in words for c in w})
    tok.train_from_iterator(TRAINING_TEXT, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                                initial_alphabet=alphabet))
    return tok


def _wordpiece(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True)  # lower-cases and strips accents
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bpe = _bpe_pieces(normalizer, pre_tokenizer, vocab_size, _BERT_SPECIALS, "[UNK]")
    pieces = sorted(bpe.get_vocab(), key=bpe.get_vocab().__getitem__)
    vocab: dict[str, int] = {}
    for piece in pieces:  # each piece may start a word ...
        vocab.setdefault(piece, len(vocab))
    for piece in pieces:  # ... or continue one
        if piece not in _BERT_SPECIALS:
            vocab.setdefault("##" + piece, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    specials = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    return tok, specials, ["input_ids", "token_type_ids", "attention_mask"]


def _bpe(vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # roberta-base: no prefix space, so a sentence's first word has no "Ġ" while the others do.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=_ROBERTA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True, add_prefix_space=False
    )
    specials = dict(
        bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>", cls_token="<s>", pad_token="<pad>",
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False),
    )
    return tok, specials, ["input_ids", "attention_mask"]


def _unigram(vocab_size: int):
    import math
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.NFKC()
    pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    bpe = _bpe_pieces(normalizer, pre_tokenizer, vocab_size, _ROBERTA_SPECIALS, "<unk>")
    # a unigram language model over the pieces: log of each piece's share of the BPE segmentation
    counts = Counter(t for line in TRAINING_TEXT for t in bpe.encode(line).tokens)
    total = sum(counts.values())
    pieces = sorted(bpe.get_vocab(), key=bpe.get_vocab().__getitem__)
    vocab = [(p, 0.0 if p in _ROBERTA_SPECIALS else math.log(max(counts[p], 0.5) / total)) for p in pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=pieces.index("<unk>")))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    cls, sep = pieces.index("<s>"), pieces.index("</s>")
    # XLM-R's layout: <s> A </s></s> B </s>, no token types.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", cls), ("</s>", sep)]
    )
    specials = dict(
        bos_token="<s>", eos_token="</s>", unk_token="<unk>", sep_token="</s>", cls_token="<s>", pad_token="<pad>",
        mask_token="<mask>",
    )
    return tok, specials, ["input_ids", "attention_mask"]


_BUILDERS = {"wordpiece": (_wordpiece, 120), "bpe": (_bpe, 400), "unigram": (_unigram, 150)}


def tiny_tokenizer(kind: TokenizerKind, folder: str | Path) -> PreTrainedTokenizerFast:
    """A tiny trained tokenizer of one family, saved under ``folder`` and loaded back with ``AutoTokenizer``.

    ``kind``: ``"wordpiece"`` (BERT: lower-casing, ``[CLS] a [SEP] b [SEP]`` with token types),
    ``"bpe"`` (RoBERTa: byte-level, no prefix space, ``<s> a </s></s> b </s>``) or ``"unigram"``
    (XLM-R: NFKC + Metaspace ``▁`` Unigram, ``<s> a </s></s> b </s>``). Special-token ids follow the
    family (BERT ``[PAD]`` 0, ``[CLS]`` 2, ``[SEP]`` 3; RoBERTa / XLM-R ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2);
    a model's ``vocab_size`` is ``len(tokenizer)``. ``folder`` holds ``tokenizer.json`` with a generic
    ``tokenizer_class``, so ``from_pretrained`` reads it as saved, also beside a tiny model's config.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, not {kind!r}")
    build, vocab_size = _BUILDERS[kind]
    tok, specials, input_names = build(vocab_size)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_input_names=input_names, model_max_length=512, **specials
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
