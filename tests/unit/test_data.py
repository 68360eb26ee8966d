"""Corpus loaders: every format, the GLUE / SNLI / Pang & Lee layouts, and every user error."""
from __future__ import annotations

import json
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertology.data import Corpus, Example, load_corpus
from bertology.errors import BertologyError

BOM = "\ufeff"


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8"))
    return path


# --------------------------------------------------------------------------------------------------
# .txt


def test_txt_one_sentence_per_line_blank_lines_counted(tmp_path):
    path = write(tmp_path, "sents.txt", "  the cat sat .  \n\nthe dog ran .\r\n   \n\ta movie\n")
    corpus = load_corpus(path)
    assert isinstance(corpus, Corpus)
    assert [ex.text for ex in corpus] == ["the cat sat .", "the dog ran .", "a movie"]
    assert corpus.stats["n_blank_lines"] == 2
    assert corpus.stats["format"] == "txt"
    assert corpus.name == "sents"
    assert corpus.source == str(path)
    assert not corpus.has_labels and not corpus.has_pairs


def test_txt_with_bom_and_limit(tmp_path):
    path = write(tmp_path, "s.txt", BOM + "one\ntwo\nthree\n")
    corpus = load_corpus(str(path), limit=2, name="mine")
    assert [ex.text for ex in corpus] == ["one", "two"]
    assert corpus.stats["limited_to"] == 2
    assert corpus.stats["n_before_limit"] == 3
    assert corpus.name == "mine"


def test_txt_refuses_column_flags(tmp_path):
    path = write(tmp_path, "s.txt", "one\n")
    with pytest.raises(BertologyError, match="text"):
        load_corpus(path, text_column="text")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20), min_size=1, max_size=8))
def test_txt_round_trip(tmp_path, lines):
    path = write(tmp_path, "rt.txt", "\n".join(lines) + "\n")
    expected = [ln.strip() for ln in lines if ln.strip()]
    if not expected:
        with pytest.raises(BertologyError, match="no examples"):
            load_corpus(path)
        return
    corpus = load_corpus(path)
    assert [ex.text for ex in corpus] == expected
    assert corpus.stats["n_blank_lines"] == len(lines) - len(expected)


# --------------------------------------------------------------------------------------------------
# GLUE-style TSV / CSV layouts


def test_sst2_tsv_layout_with_bare_quotes(tmp_path):
    path = write(
        tmp_path,
        "train.tsv",
        'sentence\tlabel\nit \'s a charming " journey . \t1\nunflinchingly bleak \t0\n"quoted start\t1\n',
    )
    corpus = load_corpus(path)
    assert [ex.text for ex in corpus] == ["it 's a charming \" journey .", "unflinchingly bleak", '"quoted start']
    assert [ex.label for ex in corpus] == ["1", "0", "1"]
    assert corpus.stats["columns"] == {"text": "sentence", "pair": None, "label": "label"}
    assert corpus.stats["format"] == "tsv"
    assert corpus.stats["header"] is True
    assert corpus.name == "train"


def test_mrpc_tsv_layout_with_bom(tmp_path):
    content = (
        BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t1355540\t1355592\tHe said the pie business doesn \'t fit .\t" The pie business does not fit .\n'
        "0\t2029631\t2029565\tMagnarelli said Racicot hated the regime .\tHis wife said he was \" 100 percent behind \" .\n"
    )
    corpus = load_corpus(write(tmp_path, "dev.tsv", content))
    assert corpus.stats["columns"] == {"text": "#1 String", "pair": "#2 String", "label": "Quality"}
    assert corpus[0] == Example(
        text="He said the pie business doesn 't fit .", text_pair='" The pie business does not fit .', label="1"
    )
    assert corpus[1].label == "0"
    assert corpus.has_pairs and corpus.has_labels


def test_snli_tsv_drops_rows_without_gold_label(tmp_path):
    content = (
        "premise\thypothesis\tlabel\n"
        "Two women are embracing .\tThe sisters are hugging .\tneutral\n"
        "A man eats .\tA man is eating .\t-\n"
        "A dog runs .\tA cat sleeps .\tcontradiction\n"
        "A boy sings .\t \tentailment\n"
    )
    corpus = load_corpus(write(tmp_path, "snli.tsv", content))
    assert [ex.label for ex in corpus] == ["neutral", "contradiction"]
    assert corpus.stats["n_no_gold_label"] == 1
    assert corpus.stats["n_empty_text"] == 1
    assert corpus.stats["n_rows"] == 4
    assert corpus.label_set() == ["contradiction", "neutral"]


def test_mnli_layout_sentence1_sentence2_gold_label(tmp_path):
    content = (
        "index\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\tThe new rights are nice enough\tEveryone really likes the newest benefits\tneutral\tneutral\n"
        "1\tThis site includes a list\tThe Government Executive has a list\tentailment\t-\n"
    )
    corpus = load_corpus(write(tmp_path, "mnli.tsv", content))
    assert corpus.stats["columns"] == {"text": "sentence1", "pair": "sentence2", "label": "gold_label"}
    assert len(corpus) == 1 and corpus[0].text_pair == "Everyone really likes the newest benefits"
    assert corpus.stats["n_no_gold_label"] == 1


def test_qqp_csv_layout(tmp_path):
    content = (
        "id,qid1,qid2,question1,question2,is_duplicate\n"
        '1,1,2,"How do I read, fast?",How to read quickly?,1\n'
        '2,3,4,"What is ""love""?",Who am I?,0\n'
    )
    corpus = load_corpus(write(tmp_path, "qqp.csv", content))
    assert corpus.stats["columns"] == {"text": "question1", "pair": "question2", "label": "is_duplicate"}
    assert corpus[0].text == "How do I read, fast?"
    assert corpus[1].text == 'What is "love"?'
    assert [ex.label for ex in corpus] == ["1", "0"]


def test_generic_text_label_csv_drops_empty_text(tmp_path):
    content = "Text,Label,extra\nthe movie was good,pos,x\n   ,neg,y\n,neg,z\nboring plot,neg,w\n"
    corpus = load_corpus(write(tmp_path, "reviews.csv", content))
    assert [ex.text for ex in corpus] == ["the movie was good", "boring plot"]
    assert corpus.stats["n_empty_text"] == 2
    assert corpus.stats["columns"] == {"text": "Text", "pair": None, "label": "Label"}


def test_column_flags_pick_columns_and_match_case_insensitively(tmp_path):
    content = "review,score,other\ngreat fun,5,a\nawful,1,b\n"
    path = write(tmp_path, "r.csv", content)
    corpus = load_corpus(path, text_column="other", label_column="SCORE")
    assert [ex.text for ex in corpus] == ["a", "b"]
    assert [ex.label for ex in corpus] == ["5", "1"]
    assert corpus.stats["columns"] == {"text": "other", "pair": None, "label": "score"}
    # Explicit text column: the pair is not guessed.
    path2 = write(tmp_path, "p.tsv", "premise\thypothesis\tlabel\na\tb\tneutral\n")
    corpus2 = load_corpus(path2, text_column="hypothesis")
    assert corpus2[0] == Example(text="b", label="neutral")


def test_csv_without_label_column(tmp_path):
    corpus = load_corpus(write(tmp_path, "t.csv", "sentence,id\nhello there,1\nbye now,2\n"))
    assert [ex.label for ex in corpus] == [None, None]
    assert corpus.stats["columns"]["label"] is None


# --------------------------------------------------------------------------------------------------
# header-less Pang & Lee style CSV

PANG_LEE = (
    BOM
    + '"1","the rock is destined to be the 21st century\'s new "" conan "" . \n"\r\n'
    + '"1","effective but too-tepid biopic\n"\r\n'
    + '"-1","simplistic , silly and tedious . \n"\r\n'
    + '"-1","it\'s so laddish and juvenile , only teenage boys could possibly find it funny . \n"\r\n'
)


def _check_pang_lee(corpus):
    assert [ex.label for ex in corpus] == ["1", "1", "-1", "-1"]
    assert corpus[0].text == "the rock is destined to be the 21st century's new \" conan \" ."
    assert corpus[1].text == "effective but too-tepid biopic"
    assert corpus.stats["header"] is False
    assert corpus.label_set() == ["-1", "1"]


@pytest.mark.parametrize("flags", [{"text_column": "1", "label_column": "0"}, {"text_column": 1, "label_column": 0}])
def test_pang_lee_headerless_with_positions(tmp_path, flags):
    corpus = load_corpus(write(tmp_path, "polarity-en-pang&lee2.csv", PANG_LEE), **flags)
    _check_pang_lee(corpus)
    assert corpus.stats["columns"] == {"text": "1", "pair": None, "label": "0"}
    assert corpus.name == "polarity-en-pang&lee2"


def test_pang_lee_headerless_auto_detected(tmp_path):
    corpus = load_corpus(write(tmp_path, "pl.csv", PANG_LEE))
    _check_pang_lee(corpus)
    assert corpus.stats["columns"] == {"text": "1", "pair": None, "label": "0"}


def test_positions_on_a_file_with_a_header_skip_the_header(tmp_path):
    path = write(tmp_path, "sst.tsv", "sentence\tlabel\ngood film\t1\nbad film\t0\n")
    corpus = load_corpus(path, text_column="0", label_column="1")
    assert [ex.text for ex in corpus] == ["good film", "bad film"]
    assert corpus.stats["header"] is True


def test_unknown_header_is_not_mistaken_for_data(tmp_path):
    path = write(tmp_path, "s.csv", "tweet,stance\ni love it,favor\nmeh,against\ngreat,favor\n")
    with pytest.raises(BertologyError) as err:
        load_corpus(path)
    msg = str(err.value)
    assert "'tweet'" in msg and "'stance'" in msg and "--text-column" in msg
    corpus = load_corpus(path, text_column="tweet", label_column="stance")
    assert [ex.label for ex in corpus] == ["favor", "against", "favor"]


# --------------------------------------------------------------------------------------------------
# header-less GLUE CoLA, unknown header-less layouts, label sanity

COLA = (
    "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
    "gj04\t1\t\tOne more pseudo generalization and I'm giving up.\n"
    "clc95\t0\t*\tIn which way is Sandy very anxious to see if the students will be able to solve the problem?\n"
    "c-05\t1\t\tThe book was written by John.\n"
    "c-05\t0\t*\tBooks were sent to each other by the students.\n"
    'swb04\t0\t??\tShe said "hi" herself him.\n'
)


def _check_cola(corpus):
    assert [ex.label for ex in corpus] == ["1", "1", "0", "1", "0", "0"]
    assert corpus[0].text == "Our friends won't buy this analysis, let alone the next one we propose."
    assert corpus[5].text == 'She said "hi" herself him.'
    assert corpus.stats["header"] is False and corpus.stats["layout"] == "GLUE CoLA"
    assert corpus.stats["columns"] == {"text": "sentence", "pair": None, "label": "label"}


@pytest.mark.parametrize(
    "flags",
    [{}, {"text_column": "3", "label_column": "1"}, {"text_column": "sentence", "label_column": "label"}],
)
def test_headerless_cola_reads_sentence_and_label_not_the_source(tmp_path, flags):
    _check_cola(load_corpus(write(tmp_path, "train.tsv", COLA), **flags))


def test_cola_layout_needs_every_row_to_match(tmp_path):
    """One row with a word in the judgment column: not CoLA, so refused rather than guessed."""
    content = COLA + "gj04\t1\tok\tA sentence.\n"
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "train.tsv", content))
    msg = str(err.value)
    assert "match no known header-less layout" in msg and "GLUE CoLA" in msg


def test_headerless_unknown_layout_is_refused_with_the_columns(tmp_path):
    content = "gj04\t1\tx\tOur friends won't buy it.\ngj04\t0\ty\tOne more.\nc-05\t1\tz\tThe book was written.\n"
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "mystery.tsv", content))
    msg = str(err.value)
    assert "mystery.tsv" in msg and "looks like data" in msg
    assert "0: 'gj04'; 1: '1'; 2: 'x'; 3: \"Our friends won't buy it.\"" in msg
    assert "--text-column 3" in msg and "--label-column" in msg
    corpus = load_corpus(write(tmp_path, "mystery.tsv", content), text_column=3, label_column=1)
    assert [ex.label for ex in corpus] == ["1", "0", "1"]
    assert corpus.stats["header"] is False


def test_numeric_first_row_is_data_not_a_header(tmp_path):
    with pytest.raises(BertologyError, match=r"looks like data.*0: '17'; 1: 'hello there'"):
        load_corpus(write(tmp_path, "ids.csv", "17,hello there\n18,good bye\n"))


LABELLED = "text,label,id\n" + "".join(f"sentence number {i},{i % 2},row{i}\n" for i in range(12))


def test_label_warning_for_an_id_column(tmp_path):
    corpus = load_corpus(write(tmp_path, "d.csv", LABELLED), label_column="id")
    (warning,) = corpus.stats["label_warnings"]
    assert "d.csv" in warning and "'id'" in warning and "each of its 12 examples" in warning
    assert "looks like an ID" in warning and "--label-column" in warning


def test_label_warning_for_too_many_distinct_values(tmp_path):
    content = "text,label\n" + "".join(f"s {i},{i % 7}\n" for i in range(12))
    (warning,) = load_corpus(write(tmp_path, "d.csv", content)).stats["label_warnings"]
    assert "7 distinct values for 12 examples" in warning and "probably not a label" in warning


def test_no_label_warning_for_a_binary_label_or_a_regression_score(tmp_path):
    assert "label_warnings" not in load_corpus(write(tmp_path, "d.csv", LABELLED)).stats
    scores = "sentence1\tsentence2\tscore\n" + "".join(f"a {i}\tb {i}\t{i / 3:.3f}\n" for i in range(12))
    assert "label_warnings" not in load_corpus(write(tmp_path, "s.tsv", scores), label_column="score").stats


def test_label_warnings_reach_the_compare_warnings(tmp_path):
    from types import SimpleNamespace

    from bertology.commands.compare_data import encoding_warnings

    corpus = load_corpus(write(tmp_path, "d.csv", LABELLED), label_column="id")
    encoded = SimpleNamespace(describe=lambda: {"n_skipped_overlong": 0, "n_truncated": 0, "n_input": 12, "max_length": 128})
    assert encoding_warnings(encoded, corpus) == corpus.stats["label_warnings"]


def test_label_warnings_pure():
    from bertology.data.loaders import MIN_LABELS_CHECKED, label_warnings

    assert label_warnings([str(i) for i in range(MIN_LABELS_CHECKED - 1)], "id", "f") == []
    assert label_warnings(["pos", "neg"] * 20, "label", "f") == []
    assert "'id'" in label_warnings([str(i) for i in range(20)], "id", "f")[0]


# --------------------------------------------------------------------------------------------------
# .jsonl


def test_jsonl_text_pair_label(tmp_path):
    lines = [
        {"text": " the cat ", "text_pair": "a cat", "label": 1},
        {"text": "a dog", "text_pair": "the dog", "label": "0"},
        {"text": "", "text_pair": "x", "label": 1},
    ]
    content = "\n".join(json.dumps(d) for d in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n"
    corpus = load_corpus(write(tmp_path, "d.jsonl", content))
    assert corpus.examples == [
        Example(text="the cat", text_pair="a cat", label="1"),
        Example(text="a dog", text_pair="the dog", label="0"),
    ]
    assert corpus.stats["n_empty_text"] == 1
    assert corpus.stats["n_blank_lines"] == 1
    assert corpus.stats["format"] == "jsonl"


def test_jsonl_sentence_key_and_flags(tmp_path):
    content = '{"sentence": "hello", "y": true, "label": "x"}\n{"sentence": "bye", "y": false}\n'
    path = write(tmp_path, "d.jsonl", content)
    auto = load_corpus(path)
    assert [ex.text for ex in auto] == ["hello", "bye"]
    assert [ex.label for ex in auto] == ["x", None]
    flagged = load_corpus(path, label_column="y")
    assert [ex.label for ex in flagged] == ["True", "False"]
    with pytest.raises(BertologyError, match=r"no text column 'nope'.*'sentence'"):
        load_corpus(path, text_column="nope")


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    content = '{"text": "ok"}\n\n{"text": "broken"\n{"text": "fine"}\n'
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "bad.jsonl", content))
    assert "bad.jsonl" in str(err.value) and "line 3" in str(err.value)


def test_jsonl_non_object_and_missing_key_lines(tmp_path):
    with pytest.raises(BertologyError, match="line 2.*JSON object"):
        load_corpus(write(tmp_path, "a.jsonl", '{"text": "ok"}\n[1, 2]\n'))
    with pytest.raises(BertologyError, match="line 2.*'text'"):
        load_corpus(write(tmp_path, "b.jsonl", '{"text": "ok"}\n{"txt": "typo"}\n'))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.text(max_size=15), st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3))), min_size=1, max_size=6))
def test_jsonl_round_trip(tmp_path, rows):
    path = write(tmp_path, "rt.jsonl", "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    expected = []
    for t, lab in rows:
        lab = None if lab is None or str(lab).strip() == "" else str(lab).strip()
        if lab == "-":
            continue
        if t.strip():
            expected.append(Example(text=t.strip(), label=lab))
    if not expected:
        with pytest.raises(BertologyError, match="no examples"):
            load_corpus(path)
        return
    assert load_corpus(path).examples == expected


# --------------------------------------------------------------------------------------------------
# .conllu

CONLLU = """# newdoc id = d1
# sent_id = s1
# text = Mary's dog doesn't bark.
1\tMary\tMary\tPROPN\tNNP\t_\t3\tnmod:poss\t_\t_
2\t's\t's\tPART\tPOS\t_\t1\tcase\t_\t_
3\tdog\tdog\tNOUN\tNN\t_\t6\tnsubj\t_\t_
4-5\tdoesn't\t_\t_\t_\t_\t_\t_\t_\t_
4\tdoes\tdo\tAUX\tVBZ\t_\t6\taux\t_\t_
5\tn't\tnot\tPART\tRB\t_\t6\tadvmod\t_\t_
6\tbark\tbark\tVERB\tVB\t_\t0\troot\t_\t_
6.1\tbarks\tbark\tVERB\tVB\t_\t_\t_\t6:conj\t_
7\t.\t.\tPUNCT\t.\t_\t6\tpunct\t_\t_

# sent_id = s2
1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
2\thome\thome\tADV\tRB\t_\t1\tadvmod\t_\tSpaceAfter=No
"""


def test_conllu_words_trees_and_skipped_tokens(tmp_path):
    corpus = load_corpus(write(tmp_path, "ud.conllu", CONLLU))
    assert len(corpus) == 2 and corpus.has_trees
    first = corpus[0]
    assert first.text == "Mary's dog doesn't bark."
    assert first.words == ("Mary", "'s", "dog", "does", "n't", "bark", ".")
    assert first.upos == ("PROPN", "PART", "NOUN", "AUX", "PART", "VERB", "PUNCT")
    assert first.heads == (3, 1, 6, 6, 6, 0, 6)
    assert first.deprels == ("nmod:poss", "case", "nsubj", "aux", "advmod", "root", "punct")
    second = corpus[1]
    assert second.text == "Go home"  # no "# text": the words joined by spaces
    assert second.heads == (0, 1)
    assert corpus.stats["n_multiword_tokens"] == 1
    assert corpus.stats["n_empty_nodes"] == 1
    assert corpus.stats["format"] == "conllu"


def test_conllu_without_heads(tmp_path):
    content = "1\tGo\tgo\tVERB\t_\t_\t_\t_\t_\t_\n2\thome\thome\tADV\t_\t_\t_\t_\t_\t_\n"
    corpus = load_corpus(write(tmp_path, "pos.conllu", content))
    assert corpus[0].heads is None and corpus[0].deprels is None
    assert corpus[0].upos == ("VERB", "ADV")
    assert corpus.stats["n_without_heads"] == 1


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("3\tdog\tdog\tNOUN\tNN\t_\t6\tnsubj\t_", "expected 10 tab-separated fields, found 9"),
        ("3 dog dog NOUN NN _ 6 nsubj _ _", "expected 10 tab-separated fields, found 1"),
        ("x\tdog\tdog\tNOUN\tNN\t_\t6\tnsubj\t_\t_", "ID 'x'"),
        ("3\tdog\tdog\tNOUN\tNN\t_\tsix\tnsubj\t_\t_", "HEAD 'six' is not an integer"),
        ("3\tdog\tdog\tNOUN\tNN\t_\t9\tnsubj\t_\t_", "HEAD 9 points past the last word"),
        ("4\tdog\tdog\tNOUN\tNN\t_\t6\tnsubj\t_\t_", "word ID 4 out of sequence"),
        ("3\tdog\tdog\tNOUN\tNN\t_\t_\tnsubj\t_\t_", "HEAD is '_'"),
    ],
)
def test_conllu_malformed_line_has_line_number(tmp_path, line, needle):
    lines = CONLLU.split("\n")
    assert lines[5].startswith("3\tdog")
    lines[5] = line
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "bad.conllu", "\n".join(lines)))
    msg = str(err.value)
    assert "bad.conllu" in msg and "line 6" in msg and needle in msg


def test_conllu_library_error_is_located(tmp_path, monkeypatch):
    import conllu
    import conllu.parser
    from conllu.exceptions import ParseException

    def fail(*args, **kwargs):
        raise ParseException("boom")

    real_parse_line = conllu.parser.parse_line

    def parse_line(line, *args, **kwargs):
        if line.startswith("2\t"):
            raise ParseException("bad field")
        return real_parse_line(line, *args, **kwargs)

    monkeypatch.setattr(conllu, "parse_token_and_metadata", fail)
    monkeypatch.setattr(conllu.parser, "parse_line", parse_line)
    with pytest.raises(BertologyError, match=r"x\.conllu, line 5: .*bad field"):
        load_corpus(write(tmp_path, "x.conllu", CONLLU))


# --------------------------------------------------------------------------------------------------
# errors common to all formats


@pytest.mark.parametrize("ext", [".txt", ".csv", ".tsv", ".jsonl", ".conllu"])
def test_non_utf8_file_reports_byte_offset(tmp_path, ext):
    good = {
        ".txt": b"hello\n",
        ".csv": b"text,label\nhello,1\n",
        ".tsv": b"text\tlabel\nhello\t1\n",
        ".jsonl": b'{"text": "hello"}\n',
        ".conllu": b"1\thello\thello\tINTJ\t_\t_\t0\troot\t_\t_\n",
    }[ext]
    data = good + "caf\u00e9".encode("latin-1") + b"\n"
    offset = len(good) + 3
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "latin" + ext, data))
    msg = str(err.value)
    assert f"latin{ext} is not valid UTF-8" in msg
    line = good.count(b"\n") + 1
    assert f"byte offset {offset}" in msg and f"line {line}" in msg


def test_non_utf8_offset_counts_the_bom(tmp_path):
    with pytest.raises(BertologyError, match="byte offset 5"):
        load_corpus(write(tmp_path, "b.txt", b"\xef\xbb\xbfab\xff\n"))


def test_missing_file(tmp_path):
    with pytest.raises(BertologyError, match="No such file.*nothere.csv"):
        load_corpus(tmp_path / "nothere.csv")


def test_directory_is_refused(tmp_path):
    (tmp_path / "dir.txt").mkdir()
    with pytest.raises(BertologyError, match="dir.txt is a folder; the data is one file"):
        load_corpus(tmp_path / "dir.txt")


def test_unknown_extension_lists_supported(tmp_path):
    with pytest.raises(BertologyError) as err:
        load_corpus(write(tmp_path, "data.xlsx", "x"))
    msg = str(err.value)
    assert "'.xlsx'" in msg
    for ext in (".txt", ".csv", ".tsv", ".jsonl", ".conllu", "hf:"):
        assert ext in msg


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("blank.txt", "\n  \n\n"),
        ("header_only.csv", "text,label\n"),
        ("all_empty.csv", "text,label\n ,1\n,0\n"),
        ("empty.csv", ""),
        ("empty.jsonl", "\n"),
        ("comments.conllu", "# just a comment\n\n"),
        ("nogold.tsv", "premise\thypothesis\tlabel\na\tb\t-\n"),
    ],
)
def test_empty_corpus(tmp_path, name, content):
    with pytest.raises(BertologyError, match=f"{name}.*has no examples"):
        load_corpus(write(tmp_path, name, content))


def test_empty_corpus_message_says_why(tmp_path):
    with pytest.raises(BertologyError, match="2 dropped with an empty text"):
        load_corpus(write(tmp_path, "e.csv", "text,label\n ,1\n,0\n"))


def test_missing_named_column_lists_available(tmp_path):
    path = write(tmp_path, "d.tsv", "sentence\tlabel\nhi\t1\n")
    with pytest.raises(BertologyError) as err:
        load_corpus(path, label_column="gold")
    msg = str(err.value)
    assert "no label column 'gold'" in msg and "['sentence', 'label']" in msg


def test_column_position_out_of_range(tmp_path):
    with pytest.raises(BertologyError, match="position 5 is out of range.*2 column"):
        load_corpus(write(tmp_path, "pl.csv", PANG_LEE), text_column="5")


def test_ragged_csv_is_a_user_error(tmp_path):
    with pytest.raises(BertologyError, match="r.csv.*line 3"):
        load_corpus(write(tmp_path, "r.csv", "text,label\na,1\nb,1,extra\n"))


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(tmp_path, limit):
    with pytest.raises(BertologyError, match="limit"):
        load_corpus(write(tmp_path, "s.txt", "a\n"), limit=limit)


def test_limit_larger_than_corpus_keeps_all(tmp_path):
    corpus = load_corpus(write(tmp_path, "s.txt", "a\nb\n"), limit=10)
    assert len(corpus) == 2 and "limited_to" not in corpus.stats  # nothing was cut, so nothing is recorded


# --------------------------------------------------------------------------------------------------
# hf:NAME[:CONFIG]:SPLIT through a fake `datasets`


class FakeClassLabel:
    def __init__(self, names):
        self.names = names


class FakeDataset:
    def __init__(self, rows, features=None):
        self.rows = rows
        self.column_names = list(rows[0])
        self.features = features or {}

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []
    registry: dict = {}

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "offline/fail":
            raise ConnectionError("Couldn't reach the Hub")
        return registry[name]

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return registry, calls


def test_hf_glue_sst2(fake_datasets):
    registry, calls = fake_datasets
    registry["glue"] = FakeDataset(
        [{"sentence": "good ", "label": 1, "idx": 0}, {"sentence": "bad", "label": 0, "idx": 1}],
        features={"label": FakeClassLabel(["negative", "positive"])},
    )
    corpus = load_corpus("hf:glue:sst2:validation[:2]")
    assert calls == [("glue", "sst2", "validation[:2]")]
    assert [ex.text for ex in corpus] == ["good", "bad"]
    assert [ex.label for ex in corpus] == ["1", "0"]
    assert corpus.source == "hf:glue:sst2:validation[:2]"
    assert corpus.name == "glue-sst2-validation"
    assert corpus.stats["format"] == "hf"
    assert corpus.stats["label_names"] == ["negative", "positive"]
    assert corpus.stats["columns"] == {"text": "sentence", "pair": None, "label": "label"}


def test_hf_snli_without_config_drops_minus_one(fake_datasets):
    registry, calls = fake_datasets
    registry["stanfordnlp/snli"] = FakeDataset(
        [
            {"premise": "A man eats.", "hypothesis": "Someone eats.", "label": 0},
            {"premise": "A dog.", "hypothesis": "A cat.", "label": -1},
        ],
        features={"label": FakeClassLabel(["entailment", "neutral", "contradiction"])},
    )
    corpus = load_corpus("hf:stanfordnlp/snli:test", limit=5)
    assert calls == [("stanfordnlp/snli", None, "test")]
    assert corpus.examples == [Example(text="A man eats.", text_pair="Someone eats.", label="0")]
    assert corpus.stats["n_no_gold_label"] == 1
    assert corpus.name == "snli-test"


def test_hf_flags_and_missing_column(fake_datasets):
    registry, _ = fake_datasets
    registry["x"] = FakeDataset([{"body": "hello", "stars": 5}])
    corpus = load_corpus("hf:x:train", text_column="body", label_column="stars")
    assert corpus[0] == Example(text="hello", label="5")
    with pytest.raises(BertologyError, match=r"cannot tell which column.*'body', 'stars'"):
        load_corpus("hf:x:train")


def test_hf_network_error(fake_datasets):
    with pytest.raises(BertologyError, match="offline/fail.*ConnectionError.*Couldn't reach"):
        load_corpus("hf:offline/fail:train")


def test_hf_bad_spec(fake_datasets):
    for spec in ("hf:glue", "hf:a:b:c:d", "hf:"):
        with pytest.raises(BertologyError, match="hf:NAME"):
            load_corpus(spec)


def test_hf_without_datasets_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(BertologyError, match="pip install datasets"):
        load_corpus("hf:glue:sst2:train")
