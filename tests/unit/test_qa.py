"""Extractive QA (issue 15, item 4): the SQuAD reader, strided windows, the official EM/F1 rules, span decoding
and the ablation's bootstrap over questions (not windows)."""
from __future__ import annotations

import collections
import json
import re
import string
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertology.data.qa_features import encode_squad, window_stride
from bertology.data.squad import QAExample, SquadData, read_squad
from bertology.errors import BertologyError
from bertology.metrics.squad import best_scores
from bertology.models.loading import load_model
from bertology.tasks.catalog import get_task, task_of_model
from bertology.testing import save_tiny_qa, squad_fixture, tiny_tokenizer
from bertology.testing.tokenizers import tiny_tokenizer as trained_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ the official rules, written out
# evaluate-v2.0.py (SQuAD 2.0's official script), as published; v1.1's differs only where an answer is empty.
def official_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def official_get_tokens(s):
    if not s:
        return []
    return official_normalize_answer(s).split()


def official_compute_exact(a_gold, a_pred):
    return int(official_normalize_answer(a_gold) == official_normalize_answer(a_pred))


def official_compute_f1(a_gold, a_pred):
    gold_toks = official_get_tokens(a_gold)
    pred_toks = official_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def official_scores(qa_answers, prediction):
    gold_answers = [a for a in qa_answers if official_normalize_answer(a)]
    if not gold_answers:
        gold_answers = [""]
    return max(official_compute_exact(a, prediction) for a in gold_answers), max(
        official_compute_f1(a, prediction) for a in gold_answers)


PREDICTIONS = [
    (["the big red house"], "big red house"),  # an article is not a word
    (["the big red house"], "The Big, Red House!"),  # case and punctuation
    (["the big red house", "red house"], "a red house at night"),  # max over gold answers
    (["John"], "Mary"),
    (["a book"], "book book"),  # tokens count as a multiset
    ([], ""),  # unanswerable, answered no-answer
    ([], "the mat"),  # unanswerable, answered
    (["the mat"], ""),  # answerable, answered no-answer
    (["the"], "the"),  # a gold answer that normalises to nothing
    (["  an   old\thouse "], "old house"),
    (["well-acted"], "wellacted"),  # punctuation removed inside words
    (["Zürich café"], "zürich CAFÉ"),
]


@pytest.mark.parametrize("golds, prediction", PREDICTIONS)
def test_exact_match_and_f1_follow_the_official_script(golds, prediction):
    em, f1 = best_scores(prediction, golds)
    assert (em, pytest.approx(f1)) == official_scores(golds, prediction)


def test_hand_computed_scores():
    assert best_scores("big red house", ["the big red house"]) == (1.0, 1.0)
    em, f1 = best_scores("a red house at night", ["the big red house", "red house"])
    # best gold "red house": 2 shared of 4 predicted, 2 of 2 gold: P 1/2, R 1 -> F1 2/3
    assert em == 0.0 and f1 == pytest.approx(2 / 3)
    assert best_scores("", []) == (1.0, 1.0) and best_scores("the mat", []) == (0.0, 0.0)


# ------------------------------------------------------------------ the reader
def _write(tmp_path, doc, name="d.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_reader_reads_both_versions_and_counts(tmp_path):
    v2 = read_squad(_write(tmp_path, squad_fixture("v2.0")))
    assert len(v2) == 9 and v2.with_negative and sum(ex.is_impossible for ex in v2) == 3
    d = v2.describe()
    assert d["n_unanswerable"] == 3 and d["n_articles"] == 3 and d["n_with_plausible_answers"] == 3
    ex = v2[0]
    assert ex.context[ex.answers[0][1]:].startswith(ex.answers[0][0])
    v1 = read_squad(_write(tmp_path, squad_fixture("1.1"), "v1.json"))
    assert len(v1) == 6 and not v1.with_negative


def test_an_answer_that_does_not_match_its_offset_names_the_file_and_question(tmp_path):
    doc = squad_fixture("v2.0")
    doc["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    path = _write(tmp_path, doc)
    with pytest.raises(BertologyError) as err:
        read_squad(path)
    msg = str(err.value)
    assert str(path) in msg and "'c0a1q0'" in msg and "'a book'" in msg and "answer_start=" in msg


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=10_000), "outside the context"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][2].update(answers=[{"text": "The", "answer_start": 0}]),
     "is_impossible is true but the question has answers"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(id="c0a0q0"), "the id occurs twice"),
    (lambda d: d["data"][0]["paragraphs"][0].pop("context"), "needs a string 'context'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].pop("answer_start"), "needs 'text' and 'answer_start'"),
])
def test_malformed_files_get_one_clear_error(tmp_path, change, fragment):
    doc = squad_fixture("v2.0")
    change(doc)
    with pytest.raises(BertologyError, match=re.escape(fragment)):
        read_squad(_write(tmp_path, doc))


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"data": [\n  {"title": "x",\n  oops}\n]}')
    with pytest.raises(BertologyError, match=r"bad.json: line 3, column 3"):
        read_squad(path)


def test_a_v11_question_without_answers_is_skipped_and_counted(tmp_path):
    doc = squad_fixture("1.1")
    doc["data"][0]["paragraphs"][0]["qas"][1]["answers"] = []
    data = read_squad(_write(tmp_path, doc))
    assert len(data) == 5 and data.describe()["n_skipped_no_answer"] == 1 and data.stats["skipped_ids"] == ["c0a0q1"]


# ------------------------------------------------------------------ windows with a document stride
@pytest.fixture(scope="module")
def fast_tok(tmp_path_factory):
    return trained_tokenizer("wordpiece", tmp_path_factory.mktemp("tok"))


def _long_question(context_sentences: int = 6):
    sentences = ["The cat sat on the mat.", "The dog ran fast to the big red house.", "John saw Mary read a book.",
                 "The children played happily in the garden.", "Nobody expected the ending.",
                 "She really liked the story."]
    context = " ".join(sentences[:context_sentences])
    answer = "the garden"
    return QAExample("q", "Where did the children play?", context, ((answer, context.index(answer)),))


def test_a_long_context_is_cut_into_strided_windows_and_the_answer_found_in_a_later_one(fast_tok):
    ex = _long_question()
    data = SquadData([ex, QAExample("x", "Why?", ex.context, (), True)], version="v2.0")
    feats = encode_squad(data, fast_tok, max_length=32, doc_stride=8)
    mine = [f for f in feats.items if f.question == 0]
    assert len(mine) >= 3
    cls = [f.start == f.cls_index == f.end for f in mine]
    assert cls[0] and not all(cls)  # the first window lacks the answer; a later one holds it
    for f in mine:
        ctx = np.flatnonzero(f.segment == 1)
        assert len(f) <= 32 and (f.offsets[ctx] >= 0).all() and (f.offsets[f.segment != 1] == -1).all()
        if f.start != f.cls_index:
            s, e = f.offsets[f.start, 0], f.offsets[f.end, 1]
            assert ex.context[s:e] == "the garden"
    # consecutive windows share doc_stride context tokens (their character spans overlap by that many tokens)
    for a, b in zip(mine, mine[1:]):
        ca, cb = a.offsets[a.segment == 1], b.offsets[b.segment == 1]
        assert (ca[-8:] == cb[:8]).all()
    # an unanswerable question's windows all point at [CLS]
    assert all(f.start == f.end == f.cls_index for f in feats.items if f.question == 1)
    assert feats.describe()["n_questions_over_several_windows"] == 2


def test_a_slow_tokenizer_and_a_question_without_room_are_refused(fast_tok):
    data = SquadData([_long_question()])
    assert tiny_tokenizer().is_fast  # transformers 5: the tiny BERT tokenizer is backed by `tokenizers` too
    slow = SimpleNamespace(is_fast=False)  # what a Python-only tokenizer reports (no offsets)
    with pytest.raises(BertologyError, match="fast tokenizer"):
        encode_squad(data, slow, max_length=32, doc_stride=8)
    with pytest.raises(BertologyError, match=r"question 'q' takes \d+ tokens.*raise --max-length"):
        encode_squad(data, fast_tok, max_length=4, doc_stride=1)


def test_a_stride_past_half_the_context_room_is_capped_and_recorded(fast_tok):
    """--doc-stride 128 at --max-length 64 (bertology's defaults are 128 / 128): windows overlap by half their
    context room, every window still brings new context, and the manifest counts the capped questions."""
    ex = _long_question()
    n_question = len(fast_tok(ex.question, add_special_tokens=False)["input_ids"])
    room = 32 - n_question - fast_tok.num_special_tokens_to_add(pair=True)
    feats = encode_squad(SquadData([ex]), fast_tok, max_length=32, doc_stride=128)
    assert window_stride(128, room) == room // 2 and window_stride(8, room) == 8
    windows = feats.items
    assert len(windows) >= 2 and feats.describe()["n_questions_with_a_capped_stride"] == 1
    for a, b in zip(windows, windows[1:]):
        ca, cb = a.offsets[a.segment == 1], b.offsets[b.segment == 1]
        assert (ca[-(room // 2):] == cb[:room // 2]).all() and len(cb) > room // 2


# ------------------------------------------------------------------ span decoding over windows
def _slow_best(start, end, context, max_len):
    best = (-np.inf, -1, -1)
    for s in range(len(start)):
        for e in range(s, min(len(end), s + max_len)):
            if context[s] and context[e] and start[s] + end[e] > best[0]:
                best = (start[s] + end[e], s, e)
    return best


def test_best_span_equals_a_slow_loop():
    from bertology.tasks.qa import best_span

    g = torch.Generator().manual_seed(0)
    start, end = torch.randn(5, 20, generator=g, dtype=torch.float64), torch.randn(5, 20, generator=g, dtype=torch.float64)
    context = torch.rand(5, 20, generator=g) > 0.3
    context[4] = False  # a window with no context token: no span
    max_len = torch.tensor([1, 3, 30, 5, 4])
    score, s, e = best_span(start, end, context, max_len)
    for b in range(5):
        want = _slow_best(start[b].numpy(), end[b].numpy(), context[b].numpy(), int(max_len[b]))
        assert (float(score[b]), int(s[b]), int(e[b])) == pytest.approx(want)


def _decode(feats, logits_of):
    """Run the task's records and folding on hand-made logits ``logits_of(feature) -> [T, 2]``."""
    task = get_task("qa")
    items = feats.items
    outputs = torch.zeros(len(items), max(len(f) for f in items), 2, dtype=torch.float64)
    for i, f in enumerate(items):
        outputs[i, : len(f)] = logits_of(f)
    targets = task.collate_targets(items, task.targets(feats, None))
    return task.example_records(task.record(outputs, targets), feats)


def _span_logits(f, text, context, high=5.0, null=0.0):
    """Logits that put ``high`` on the tokens spanning ``text`` (when the window holds it) and ``null`` at [CLS]."""
    out = torch.zeros(len(f), 2, dtype=torch.float64)
    out[f.cls_index] = null
    a = context.index(text)
    hits = [t for t in range(len(f)) if f.segment[t] == 1 and f.offsets[t, 0] >= a and f.offsets[t, 1] <= a + len(text)]
    if hits and f.offsets[hits[0], 0] == a and f.offsets[hits[-1], 1] == a + len(text):
        out[hits[0], 0] = high
        out[hits[-1], 1] = high
    return out


def test_the_best_span_over_all_windows_of_a_question_wins(fast_tok):
    ex = _long_question()
    feats = encode_squad(SquadData([ex], version="1.1"), fast_tok, max_length=32, doc_stride=8)
    rec = _decode(feats, lambda f: _span_logits(f, "the garden", ex.context, null=100.0))
    # v1.1: a span is always predicted, however high the null score
    assert ex.context[rec["pred"][0]:rec["pred_end"][0]] == "the garden"
    assert rec["exact_match"][0] == 1.0 and rec["f1"][0] == 1.0


def test_max_answer_length_bounds_the_span(fast_tok):
    ex = _long_question()
    data = SquadData([ex], version="1.1")
    long_answer = "the big red house"
    feats = encode_squad(data, fast_tok, max_length=48, doc_stride=8, max_answer_length=2)
    rec = _decode(feats, lambda f: _span_logits(f, long_answer, ex.context))
    n_tokens = len(fast_tok(long_answer, add_special_tokens=False)["input_ids"])
    assert n_tokens > 2
    got = ex.context[rec["pred"][0]:rec["pred_end"][0]]
    assert got != long_answer and len(fast_tok(got, add_special_tokens=False)["input_ids"]) <= 2


@pytest.mark.parametrize("null, threshold, answered", [(11.0, 0.0, False), (9.0, 0.0, True), (11.0, 2.0, True)])
def test_v2_predicts_no_answer_when_the_null_score_beats_the_span_by_the_threshold(fast_tok, null, threshold, answered):
    ex = _long_question()
    feats = encode_squad(SquadData([ex], version="v2.0"), fast_tok, max_length=32, doc_stride=8, null_threshold=threshold)
    # span score 10 in its window; null score `null` in every window, so min over windows = null
    rec = _decode(feats, lambda f: _span_logits(f, "the garden", ex.context, high=5.0, null=null / 2))
    assert rec["null_margin"][0] == pytest.approx(null - 10.0)
    assert (rec["pred"][0] >= 0) == answered
    assert rec["exact_match"][0] == float(answered)  # the gold answer is "the garden"


# ------------------------------------------------------------------ the model and the ablation over questions
@pytest.fixture(scope="module")
def qa_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa")
    (root / "d.json").write_text(json.dumps(squad_fixture("v2.0", copies=2)))
    loaded = load_model(save_tiny_qa(root / "m", seed=3))
    data = read_squad(root / "d.json")
    return loaded, encode_squad(data, loaded.tokenizer, max_length=32, doc_stride=8)


def test_task_of_model_recognises_a_question_answering_head(qa_model):
    loaded, _ = qa_model
    assert type(loaded.model).__name__ == "BertForQuestionAnswering"
    assert task_of_model(loaded.model).name == "qa"
    with pytest.raises(BertologyError, match="no question-answering head"):
        get_task("qa").check_model(torch.nn.Linear(2, 2))


def test_ablation_bootstraps_questions_and_the_cached_sweep_equals_the_naive(qa_model):
    from bertology.experiments.ablation import HeadScoring, SweepPlan, run_ablation

    loaded, feats = qa_model
    assert len(feats.items) > len(feats.data)  # several windows per question
    y = get_task("qa").targets(feats, loaded.model)
    scoring = HeadScoring.for_tokenizer(loaded.tokenizer, batch_size=5)
    naive = run_ablation(loaded.model, feats, y, scoring, n_bootstrap=30,
                         sweep=SweepPlan(method="naive", layer_modes=("skip",)))
    cached = run_ablation(loaded.model, feats, y, scoring, n_bootstrap=30,
                          sweep=SweepPlan(method="cached", layer_modes=("skip",)))
    assert set(naive.table["n_examples"]) == {len(feats.data)} and naive.params["n_examples"] == len(feats.data)
    assert all(len(v) == len(feats.data) for v in naive.per_example["intact"].values())
    assert set(naive.table["task"]) == {"qa"} and set(naive.table["metric"]) == {"f1", "exact_match", "loss"}
    for key in naive.per_example:
        for name in ("f1", "exact_match", "pred"):
            np.testing.assert_array_equal(naive.per_example[key][name], cached.per_example[key][name])
        np.testing.assert_allclose(naive.per_example[key]["loss"], cached.per_example[key]["loss"], rtol=1e-4, atol=1e-5)
    # the intact F1 is the mean of the per-question F1s (each question counted once, whatever its windows)
    intact = naive.table[(naive.table["target"] == "intact") & (naive.table["metric"] == "f1")]["value"].iloc[0]
    assert intact == pytest.approx(naive.per_example["intact"]["f1"].mean())
    assert naive.params["degenerate"]["answered"] + naive.params["degenerate"]["no_answer"] == len(feats.data)


def test_head_importance_runs_on_the_span_loss(qa_model):
    from bertology.experiments.ablation import HeadScoring
    from bertology.experiments.head_importance import PruningPlan, run_head_importance

    loaded, feats = qa_model
    y = get_task("qa").targets(feats, loaded.model)
    res = run_head_importance(loaded.model, feats, y, HeadScoring.for_tokenizer(loaded.tokenizer), pruning=PruningPlan(0.5))
    assert np.isfinite(res.importance["importance"]).all() and (res.importance["importance"] > 0).any()
    assert set(res.curve["metric"]) == {"f1", "exact_match", "loss"} and set(res.curve["n_examples"]) == {len(feats.data)}


def test_the_finetune_run_warns_about_a_qa_model_that_answers_everything_alike():
    import pandas as pd

    from bertology.training.run import chance_warnings

    n = 40
    impossible = np.arange(n) % 4 == 0
    alike = pd.DataFrame({"prediction": [""] * n, "is_impossible": impossible, "exact_match": impossible.astype(float),
                          "f1": impossible.astype(float)})
    (warning,) = chance_warnings(alike)
    assert "gives one answer to every eval question" in warning and "'no answer' scores 0.250" in warning
    good = alike.assign(prediction=[f"answer {i}" for i in range(n)], f1=0.9, exact_match=0.8)
    assert chance_warnings(good) == []


def test_load_corpus_reads_a_squad_file_as_question_context_pairs(tmp_path):
    from bertology.data.loaders import load_corpus

    corpus = load_corpus(_write(tmp_path, squad_fixture("v2.0")))
    assert len(corpus) == 9 and corpus.has_pairs and not corpus.has_labels
    assert corpus[0].text == "Where did the cat sit?" and corpus[0].text_pair.startswith("The cat sat on the mat.")
    assert corpus.describe()["format"] == "squad" and corpus.describe()["n_unanswerable"] == 3
