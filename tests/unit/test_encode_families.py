"""Encoding examples with known words gives exactly the plain text's token ids, for every tokenizer family.

The tiny WordPiece (BERT), byte-level BPE (RoBERTa) and Metaspace Unigram (XLM-R) tokenizers come from
:func:`bertology.testing.tokenizers.tiny_tokenizer`. Each test checks the ids against ``tok(text)`` and
the word map against the words' characters in the text.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from bertology.data.align import annotated_word_ids
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedExample, encode_corpus, encode_example
from bertology.errors import BertologyError
from bertology.testing.tokenizers import TOKENIZER_KINDS, tiny_tokenizer

KINDS = TOKENIZER_KINDS


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict[str, PreTrainedTokenizerFast]:
    return {k: tiny_tokenizer(k, tmp_path_factory.mktemp(k)) for k in KINDS}


@pytest.fixture(params=KINDS)
def kind_tok(request, toks):
    return request.param, toks[request.param]


# --------------------------------------------------------------------------------------------------
# helpers: independent checks of an encoding against the words' characters


def whitespace_words(text: str) -> list[str]:
    return text.split()


def punctuation_words(text: str) -> list[str]:
    """Punctuation split off ("great," -> "great", ","); contractions split as spaCy/UD do ("isn't" -> "is", "n't")."""
    return re.findall(r"\w+(?=n't)|n't|\w+|[^\w\s]", text)


def word_spans(words, text: str) -> list[tuple[int, int]]:
    """Each word's characters, found left to right (the words in these tests are pieces of the text)."""
    spans, pos = [], 0
    for w in words:
        start = text.index(w, pos)
        assert not text[pos:start].strip(), f"{w!r} is not next in {text!r}"
        spans.append((start, start + len(w)))
        pos = start + len(w)
    assert not text[pos:].strip()
    return spans


def piece_text(kind: str, tok, pieces: list[str]) -> str:
    """The characters a word's pieces stand for, word-start markers dropped."""
    if kind == "wordpiece":
        return "".join(p[2:] if p.startswith("##") else p for p in pieces)
    if kind == "bpe":
        return tok.convert_tokens_to_string(pieces).strip()  # byte-level symbols back to text
    return "".join(pieces).replace("▁", "")


def normalised(tok, word: str) -> str:
    norm = tok.backend_tokenizer.normalizer
    return norm.normalize_str(word) if norm is not None else word


def check_side(kind: str, tok, enc: EncodedExample, segment: int, words, text: str, first_word: int = 0) -> None:
    """Word ids of one sentence against the words' characters.

    Every non-special token belongs to the word holding its first non-space character (or the next
    word when it starts in whitespace); word ids never go down; every word has a token or is listed in
    ``shared_words``; and the pieces of each word whose tokens cross no word boundary spell the word.
    """
    offsets = tok(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    positions = np.flatnonzero(enc.segment == segment)
    assert len(positions) == len(offsets) or enc.truncated
    spans = word_spans(words, text)
    wid = enc.word_ids[positions]
    assert (wid >= 0).all()
    assert (np.diff(wid) >= 0).all()
    def touches(t: int) -> list[int]:
        a, b = offsets[t]
        return [k for k, (s, e) in enumerate(spans) if a < e and b > s]

    crossing = set()
    for t, ((a, _), w) in enumerate(zip(offsets, wid)):
        touched = touches(t)
        first_char = next((k for k, (s, e) in enumerate(spans) if e > a), len(spans) - 1)
        if len(touched) > 1:
            crossing.update(touched)
        # the token's word holds its first character, or the token moved on to a word without another
        # token on its characters
        moved = w in touched and w > first_char and not any(w in touches(r) for r in np.flatnonzero(wid == w) if r != t)
        assert w == first_char or moved
    pieces = tok.convert_ids_to_tokens(enc.input_ids[positions].tolist())
    for k, word in enumerate(words):
        own = [p for p, w in zip(pieces, wid) if w == k]
        if not own:
            assert first_word + k in enc.shared_words, f"word {k} ({word!r}) has no token and is not shared"
            continue
        shares = set(positions[wid == k].tolist()) & set(enc.shared_words.values())
        if k in crossing or shares or tok.unk_token in own:
            continue  # a token also standing for another word (or an unknown one) spells more than this word
        assert piece_text(kind, tok, own) == normalised(tok, word), (word, own)


# --------------------------------------------------------------------------------------------------
# the tokenizers themselves


def test_tiny_tokenizers_have_their_familys_layout(toks):
    bert, roberta, xlmr = toks["wordpiece"], toks["bpe"], toks["unigram"]
    for tok in toks.values():
        assert isinstance(tok, PreTrainedTokenizerFast) and tok.is_fast
    enc = bert("the movie", "is great")
    tokens = bert.convert_ids_to_tokens(enc["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    assert enc["token_type_ids"] == [0] * (tokens.index("[SEP]") + 1) + [1] * (len(tokens) - tokens.index("[SEP]") - 1)
    for tok in (roberta, xlmr):
        tokens = tok.convert_ids_to_tokens(tok("the movie", "is great")["input_ids"])
        assert tokens[0] == "<s>" and tokens[-1] == "</s>" and "</s></s>" in "".join(tokens)
    # roberta-base: no prefix space, so only the words after the first carry "Ġ"
    tokens = roberta.tokenize("the movie was great")
    assert not tokens[0].startswith("Ġ") and sum(t.startswith("Ġ") for t in tokens) == 3
    assert xlmr.tokenize("the movie")[0].startswith("▁")
    # small vocabularies: ordinary words split into several pieces
    assert all(len(tok.tokenize(" wonderful")) > 1 for tok in toks.values())


def test_tiny_tokenizer_is_reproducible_and_reloads(tmp_path, toks):
    for kind in KINDS:
        again = tiny_tokenizer(kind, tmp_path / kind)
        assert again.get_vocab() == toks[kind].get_vocab()
        reloaded = AutoTokenizer.from_pretrained(tmp_path / kind)
        text = "The movie isn't great, said the naïve critic."
        assert reloaded(text)["input_ids"] == toks[kind](text)["input_ids"]
    with pytest.raises(ValueError, match="kind"):
        tiny_tokenizer("bytes", tmp_path / "x")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# single sentences

SENTENCES = [
    "the movie is just great and the actors were wonderful",
    "The movie is just great, isn't it?",
    'She said: "the plot (mostly) works."',
    "A naïve critic ate crème brûlée at a café in Zürich.",
    "Ørsted’s façade — ok?",  # characters never seen in training: unknown pieces, multi-byte BPE symbols
    "  spaces   before, between  and after  ",
]


@pytest.mark.parametrize("split", [whitespace_words, punctuation_words], ids=["whitespace", "punctuation"])
@pytest.mark.parametrize("text", SENTENCES)
def test_words_give_exactly_the_texts_ids(kind_tok, text, split):
    kind, tok = kind_tok
    words = tuple(split(text))
    enc = encode_example(tok, Example(text, words=words), 0)
    reference = tok(text)
    assert enc.input_ids.tolist() == reference["input_ids"]
    assert enc.special.tolist() == [bool(m) for m in tok(text, return_special_tokens_mask=True)["special_tokens_mask"]]
    assert (enc.word_ids[enc.special] == -1).all() and (enc.segment[enc.special] == -1).all()
    assert enc.word_source == "text"
    check_side(kind, tok, enc, 0, words, text)


def test_no_space_before_punctuation_and_contractions(kind_tok):
    """spaCy/UD words of a text written as people write it: "great," and "don't" have no space inside."""
    kind, tok = kind_tok
    text = "We don't think it's great, do you?"
    words = ("We", "do", "n't", "think", "it", "'s", "great", ",", "do", "you", "?")
    enc = encode_example(tok, Example(text, words=words), 0)
    assert enc.input_ids.tolist() == tok(text)["input_ids"]
    assert enc.input_ids.tolist() != tok(" ".join(words))["input_ids"]  # the joined words would be another input
    check_side(kind, tok, enc, 0, words, text)
    assert set(enc.word_ids[~enc.special].tolist()) | set(enc.shared_words) == set(range(len(words)))


def test_is_split_into_words_used_to_drop_the_bpe_word_marker(toks):
    """Regression: ``tok(words, is_split_into_words=True)`` tokenised each word on its own for RoBERTa-style
    BPE, so "the movie is just" lost every "Ġ" and became other ids; the words must give the text's ids."""
    text = "the movie is just great"
    words = text.split()
    for kind, tok in toks.items():
        old = tok(words, is_split_into_words=True)["input_ids"]
        new = encode_example(tok, Example(text, words=tuple(words)), 0).input_ids.tolist()
        assert new == tok(text)["input_ids"]
        if kind == "bpe":
            assert old != new
            assert not any(p.startswith("Ġ") for p in tok.convert_ids_to_tokens(old))
            assert sum(p.startswith("Ġ") for p in tok.convert_ids_to_tokens(new)) >= len(words) - 1
        elif kind == "wordpiece":
            assert old == new  # WordPiece never marked word starts: the old path was right for BERT


WORDS = ["the", "movie", "is", "just", "great", "naïve", "café", "actors", "were", "wonderful", "Zürich", "isn't",
         "plot", "zzz", "Ørsted", "2019", "don't"]
PUNCT = [",", ".", "!", "?", "(", ")", '"', ";", "—"]


@st.composite
def sentences(draw) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(PUNCT)), min_size=1, max_size=12))
    glue = draw(st.lists(st.sampled_from(["", " ", "  "]), min_size=len(parts), max_size=len(parts)))
    text = "".join(p + g for p, g in zip(parts, glue))
    return text if text.strip() else "the"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=sentences(), punct=st.booleans())
def test_any_sentence_gives_the_texts_ids(toks, text, punct):
    words = tuple(punctuation_words(text) if punct else whitespace_words(text))
    for kind, tok in toks.items():
        enc = encode_example(tok, Example(text, words=words), 0)
        assert enc.input_ids.tolist() == tok(text)["input_ids"]
        assert enc.word_source == "text"
        check_side(kind, tok, enc, 0, words, text)


# --------------------------------------------------------------------------------------------------
# sentence pairs


def test_pair_annotated_over_both_texts(kind_tok):
    kind, tok = kind_tok
    first, second = "The movie is just great, isn't it?", "A naïve critic (mostly) agreed."
    w1, w2 = punctuation_words(first), punctuation_words(second)
    ex = Example(first, text_pair=second, words=tuple(w1 + w2), n_first_words=len(w1))
    enc = encode_example(tok, ex, 3)
    reference = tok(first, second)
    assert enc.index == 3
    assert enc.input_ids.tolist() == reference["input_ids"]
    tti = reference.get("token_type_ids")
    assert enc.token_type_ids.tolist() == (tti if tti is not None else [0] * len(enc))
    mask = tok(first, second, return_special_tokens_mask=True)["special_tokens_mask"]
    assert enc.segment.tolist() == [-1 if s is None or m else s for s, m in zip(reference.sequence_ids(), mask)]
    check_side(kind, tok, enc, 0, w1, first)
    check_side(kind, tok, enc, 1, w2, second, first_word=len(w1))
    annotated = annotated_word_ids(enc.word_ids, enc.segment, ex.n_first_words)
    assert set(annotated[enc.segment == 1].tolist()) == set(range(len(w1), len(w1) + len(w2)))


def test_pair_with_words_for_the_first_text_only(kind_tok):
    """The second text's words are its whitespace-separated parts and carry no annotations (as before)."""
    kind, tok = kind_tok
    first, second = "the movie was great.", "a dull, slow plot"
    ex = Example(first, text_pair=second, words=("the", "movie", "was", "great", "."))
    enc = encode_example(tok, ex, 0)
    assert enc.input_ids.tolist() == tok(first, second)["input_ids"]
    check_side(kind, tok, enc, 0, ex.words, first)
    check_side(kind, tok, enc, 1, second.split(), second)
    assert (annotated_word_ids(enc.word_ids, enc.segment, None)[enc.segment == 1] == -1).all()


# --------------------------------------------------------------------------------------------------
# words without a token of their own, words that are not the text


def _token_covering(tok, text: str, start: int, end: int) -> int:
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    hits = [t for t, (a, b) in enumerate(offsets) if b > a and a <= start and b >= end and b - a < len(text)]
    assert len(hits) == 1, f"precondition: one token covers {text[start:end]!r}"
    return hits[0]


def test_word_inside_another_words_token_shares_it(kind_tok):
    """"the" is one token in every tiny vocabulary; the words "th" + "e" cannot both have one."""
    kind, tok = kind_tok
    text = "I saw the cat"
    enc = encode_example(tok, Example(text, words=("I", "saw", "th", "e", "cat")), 0)
    the = _token_covering(tok, text, 6, 9)
    assert enc.input_ids.tolist() == tok(text)["input_ids"]
    assert enc.word_ids[the] == 2 and 3 not in enc.word_ids.tolist()
    assert enc.shared_words == {3: the}


def test_token_crossing_into_a_word_without_one_moves_to_it(kind_tok):
    """When the word before keeps a token of its own, the crossing token goes to the word left without one."""
    kind, tok = kind_tok
    for word in ("happily", "wonderful", "emotional", "predictable", "parents", "garden"):
        text = f"they {word}"
        offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
        pieces = [t for t, (a, b) in enumerate(offsets) if a >= 5 and b > a]
        a, b = offsets[pieces[-1]]
        if len(pieces) >= 2 and b - a >= 2 and a > 5:
            break
    else:
        raise AssertionError("precondition: a word whose last piece has 2+ characters")
    # split inside the last piece: the second part has no token starting in it
    words = ("they", text[5 : a + 1], text[a + 1 : b])
    enc = encode_example(tok, Example(text, words=words), 0)
    assert enc.input_ids.tolist() == tok(text)["input_ids"]
    assert enc.word_ids[pieces[-1]] == 2 and (enc.word_ids[pieces[:-1]] == 1).all()
    assert enc.shared_words == {}


def test_lone_marker_is_not_a_token_of_its_own(toks):
    """Unigram gives " is" as "▁" + "is": split into "i" + "s", the "is" token stays with "i" and "s" shares it."""
    tok = toks["unigram"]
    text = "this is it"
    assert tok.tokenize(" is") == ["▁", "is"], "precondition"
    enc = encode_example(tok, Example(text, words=("this", "i", "s", "it")), 0)
    is_token = _token_covering(tok, text, 5, 7)
    assert enc.word_ids[is_token] == 1 and enc.shared_words == {2: is_token}


@pytest.mark.parametrize(
    "text, words, group",
    [
        ("voy al mercado", ("voy", "a", "el", "mercado"), (1, 2)),  # Spanish "al" = "a" + "el"
        ("le chat du voisin", ("le", "chat", "de", "le", "voisin"), (2, 3)),  # French "du" = "de" + "le"
        ("dámelo ya", ("da", "me", "lo", "ya"), (0, 1, 2)),  # "dámelo" = "da" + "me" + "lo"
        ("voy al", ("voy", "a", "el"), (1, 2)),  # a multi-word token that ends the text
        ("zum zum del, au", ("zu", "dem", "zu", "dem", "de", "el", ",", "à", "le"), (0, 1, 2, 3, 4, 5, 7, 8)),
        ('"no (way)"', ("``", "no", "-LRB-", "way", "-RRB-", "''"), (0, 2, 4, 5)),  # Penn Treebank escapes
    ],
)
def test_conllu_multiword_tokens_keep_the_texts_ids(kind_tok, text, words, group):
    """CoNLL-U words of a multi-word token need not spell its surface form: the text is still what is
    tokenised, and every word of the group either has a token of the form or shares one."""
    kind, tok = kind_tok
    enc = encode_example(tok, Example(text, words=words), 0)
    assert enc.input_ids.tolist() == tok(text)["input_ids"]
    assert enc.word_source == "multiword"
    wid = enc.word_ids[~enc.special]
    assert (wid >= 0).all() and (np.diff(wid) >= 0).all()
    assert set(wid.tolist()) | set(enc.shared_words) == set(range(len(words)))
    assert set(enc.shared_words) <= set(group)
    for w, t in enc.shared_words.items():  # a shared token is one of the group's
        assert enc.word_ids[t] in group


def test_words_that_are_not_the_text_tokenise_their_join(kind_tok, caplog):
    kind, tok = kind_tok
    ex = Example("x y z", words=("completely", "different", "words"))
    enc = encode_example(tok, ex, 0)
    assert enc.word_source == "joined"
    assert enc.input_ids.tolist() == tok("completely different words")["input_ids"]
    check_side(kind, tok, enc, 0, ex.words, " ".join(ex.words))
    with caplog.at_level(logging.WARNING, logger="bertology.data.encode"):
        info = encode_corpus(Corpus([ex, Example("the movie", words=("the", "movie"))]), tok).describe()
    assert info["n_examples_words_not_in_text"] == 1 and info["n_examples_multiword"] == 0
    assert "not their text" in caplog.text
    plain = encode_corpus(Corpus.from_list(["the movie"]), tok).describe()
    assert "n_examples_words_not_in_text" not in plain  # corpora without words: the manifest is as before


def test_empty_word_and_slow_tokenizer_are_refused(tmp_path, toks):
    with pytest.raises(BertologyError, match="empty"):
        encode_example(toks["wordpiece"], Example("a b", words=("a", " ")), 0)
    from transformers import BertTokenizerLegacy

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]))
    slow = BertTokenizerLegacy(vocab_file=str(tmp_path / "vocab.txt"))
    assert not slow.is_fast
    with pytest.raises(BertologyError, match="fast tokenizer"):
        encode_example(slow, Example("the cat", words=("the", "cat")), 0)


# --------------------------------------------------------------------------------------------------
# truncation


def test_truncation_keeps_the_word_map_a_prefix(kind_tok):
    kind, tok = kind_tok
    text = "The children played happily in the garden, while their parents talked about the wonderful movie."
    words = tuple(punctuation_words(text))
    full = encode_example(tok, Example(text, words=words), 0)
    for m in (5, 9, 14):
        cut = encode_example(tok, Example(text, words=words), 0, max_length=m)
        assert len(cut) == m < len(full)
        assert cut.input_ids.tolist() == tok(text, truncation=True, max_length=m)["input_ids"]
        body = cut.word_ids[~cut.special]
        assert body.tolist() == full.word_ids[~full.special][: len(body)].tolist()
        assert all(t < m for t in cut.shared_words.values())


def test_truncated_pair_keeps_each_sides_word_map_a_prefix(kind_tok):
    kind, tok = kind_tok
    first = "The children played happily in the garden, while their parents talked."
    second = "Nobody expected the ending to be so emotional."
    w1, w2 = punctuation_words(first), punctuation_words(second)
    ex = Example(first, text_pair=second, words=tuple(w1 + w2), n_first_words=len(w1))
    full = encode_example(tok, ex, 0)
    cut = encode_example(tok, ex, 0, max_length=16)
    assert cut.input_ids.tolist() == tok(first, second, truncation=True, max_length=16)["input_ids"]
    for s in (0, 1):
        body = cut.word_ids[cut.segment == s]
        assert len(body) and body.tolist() == full.word_ids[full.segment == s][: len(body)].tolist()


def test_left_truncation_keeps_the_word_map_a_suffix(toks):
    tok = toks["bpe"]
    text = "The children played happily in the garden, while their parents talked."
    words = tuple(punctuation_words(text))
    full = encode_example(tok, Example(text, words=words), 0)
    tok.truncation_side = "left"
    try:
        cut = encode_example(tok, Example(text, words=words), 0, max_length=10)
        assert cut.input_ids.tolist() == tok(text, truncation=True, max_length=10)["input_ids"]
    finally:
        tok.truncation_side = "right"
    body = cut.word_ids[~cut.special]
    assert body.tolist() == full.word_ids[~full.special][-len(body):].tolist()


def test_word_the_normaliser_deletes_shares_the_token_before(toks):
    """BERT's normaliser strips accents: a lone combining accent (decomposed "é") has no character left."""
    tok = toks["wordpiece"]
    text = "the cafe\u0301 is great"
    enc = encode_example(tok, Example(text, words=("the", "cafe", "\u0301", "is", "great")), 0)
    assert enc.input_ids.tolist() == tok(text)["input_ids"]
    assert 2 not in enc.word_ids.tolist() and list(enc.shared_words) == [2]
    assert enc.word_ids[enc.shared_words[2]] == 1  # the last piece of "cafe"


def test_encode_corpus_counts_overlong_examples_as_before(kind_tok):
    kind, tok = kind_tok
    long_text = "The children played happily in the garden, while their parents talked."
    corpus = Corpus([Example(long_text, words=tuple(punctuation_words(long_text))),
                     Example("a movie", words=("a", "movie"))])
    skipped = encode_corpus(corpus, tok, max_length=10)
    assert skipped.skipped == [0] and [it.index for it in skipped.items] == [1]
    truncated = encode_corpus(corpus, tok, max_length=10, overlong="truncate")
    assert truncated.truncated == [0] and truncated.items[0].truncated and len(truncated.items[0]) == 10
    assert truncated.describe()["n_truncated"] == 1
