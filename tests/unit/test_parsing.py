"""Dependency parsing as a task (issue 15): targets on first pieces, UAS/LAS against hand counts (punctuation
excluded), the loss against a slow per-word loop, bootstrap weights = a resampled corpus, save -> reload, the
encoder of a saved parser loads as a plain encoder, cached == naive sweep, head importance, CoNLL-U edge cases."""
import numpy as np
import pandas.testing as pd_testing
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

from bertology.data.align import first_pieces
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.errors import BertologyError
from bertology.experiments.ablation import HeadScoring, SweepPlan, run_ablation, summary
from bertology.experiments.head_importance import PruningPlan, run_head_importance
from bertology.experiments.scoring import make_batches
from bertology.models.loading import load_model
from bertology.models.parser import HEAD_CONFIG, HEAD_WEIGHTS, BiaffineParser, ParserConfig
from bertology.tasks.catalog import get_task, task_of_model
from bertology.tasks.parsing import coverage, predicted_trees, word_targets
from bertology.testing import save_tiny_bert, tiny_tokenizer

TASK = get_task("parsing")
LABELS = ["case", "det", "nsubj", "obj", "obl", "punct", "root"]

#: word, UPOS, head, relation; "reads" and "books" are two pieces each in the tiny vocabulary (read ##s, book ##s)
SENTENCES = [
    [("the", "DET", 2, "det"), ("cat", "NOUN", 3, "nsubj"), ("sat", "VERB", 0, "root"), ("on", "ADP", 6, "case"),
     ("the", "DET", 6, "det"), ("mat", "NOUN", 3, "obl"), (".", "PUNCT", 3, "punct")],
    [("john", "PROPN", 2, "nsubj"), ("reads", "VERB", 0, "root"), ("books", "NOUN", 2, "obj"), (".", "PUNCT", 2, "punct")],
    [("mary", "PROPN", 2, "nsubj"), ("saw", "VERB", 0, "root"), ("the", "DET", 4, "det"), ("dog", "NOUN", 2, "obj")],
]


def _corpus(sentences=SENTENCES) -> Corpus:
    return Corpus([Example(text=" ".join(w for w, *_ in s), words=tuple(w for w, *_ in s), upos=tuple(u for _, u, _, _ in s),
                           heads=tuple(h for *_, h, _ in s), deprels=tuple(d for *_, d in s)) for s in sentences])


def _conllu(sentences) -> str:
    lines = []
    for s in sentences:
        lines.append("# text = " + " ".join(w for w, *_ in s))
        lines += ["\t".join([str(i), w, w, u, "_", "_", str(h), d, "_", "_"]) for i, (w, u, h, d) in enumerate(s, 1)]
        lines.append("")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def parser(tmp_path_factory) -> BiaffineParser:
    folder = save_tiny_bert(tmp_path_factory.mktemp("enc"), initializer_range=0.3)
    torch.manual_seed(0)
    model = BiaffineParser(AutoModel.from_pretrained(folder, attn_implementation="eager"),
                           ParserConfig(labels=tuple(LABELS), hidden_size=32, arc_dim=16, label_dim=8, dropout=0.0))
    with torch.no_grad():  # a random head (the biaffines start at zero), so predictions vary with the input
        for p in model.head.parameters():
            p.normal_(0, 0.5)
    return model.eval()


def test_first_pieces_of_words_and_of_words_sharing_a_token():
    word_ids = [-1, 0, 0, 1, 2, 2, -1, -1]  # [CLS] w0 w0 w1 w2 w2 [SEP] pad
    assert first_pieces(word_ids, 4).tolist() == [1, 3, 4, -1]
    assert first_pieces(word_ids, 4, {3: 4}).tolist() == [1, 3, 4, 4]


def test_targets_sit_on_first_pieces_with_heads_as_first_piece_positions():
    tok = tiny_tokenizer()
    corpus = _corpus()
    enc = encode_corpus(corpus, tok)
    y = word_targets(corpus, LABELS)
    item = enc.items[1]  # [CLS] john read ##s book ##s . [SEP]
    assert tok.convert_ids_to_tokens(item.input_ids.tolist()) == ["[CLS]", "john", "read", "##s", "book", "##s", ".", "[SEP]"]
    t = TASK.collate_targets([item], [y[1]])[0].numpy()
    # john -> reads (first piece at 2); reads -> root (0); books -> reads; "." -> reads, not scored
    expected = {1: (2, LABELS.index("nsubj"), 1), 2: (0, LABELS.index("root"), 1), 4: (2, LABELS.index("obj"), 1),
                6: (2, LABELS.index("punct"), 0)}
    for pos in range(len(item)):
        assert tuple(t[pos]) == expected.get(pos, (-100, -100, -100)), pos


def _planted_outputs(items, targets, heads_by_sent, labels_by_sent, n_labels):
    """Logits whose argmax decoding gives exactly the given word-level heads and labels."""
    B, T = targets.shape[:2]
    out = torch.zeros(B, T, T, 1 + n_labels)
    for b, it in enumerate(items):
        fp = first_pieces(it.word_ids, len(heads_by_sent[b]))
        for w, (h, lab) in enumerate(zip(heads_by_sent[b], labels_by_sent[b])):
            j = 0 if h == 0 else fp[h - 1]
            out[b, fp[w], j, 0] = 10.0
            out[b, fp[w], j, 1 + LABELS.index(lab)] = 10.0
    return out


def test_uas_and_las_against_a_hand_count_without_punctuation():
    tok = tiny_tokenizer()
    corpus = _corpus()
    enc = encode_corpus(corpus, tok)
    y = word_targets(corpus, LABELS)
    items = sorted(enc.items, key=lambda it: it.index)
    targets = TASK.collate_targets(items, [y[it.index] for it in items])
    # sentence 0: "on" gets the wrong head (3 for 6), "." too (punctuation: not counted), "mat" the wrong label
    # sentence 1: all right but "books" labelled nsubj; sentence 2: "dog" attached to "the"
    heads = [[2, 3, 0, 3, 6, 3, 2], [2, 0, 2, 2], [2, 0, 4, 3]]
    labels = [["det", "nsubj", "root", "case", "det", "obj", "punct"], ["nsubj", "root", "nsubj", "punct"],
              ["nsubj", "root", "det", "obj"]]
    out = _planted_outputs(items, targets, heads, labels, len(LABELS))
    # sentence 2's argmax is a cycle (the <-> dog); dog's second-best arc is its gold one (saw, labelled obj)
    fp = first_pieces(items[2].word_ids, 4)
    out[2, fp[3], fp[1], 0], out[2, fp[3], fp[1], 1 + LABELS.index("obj")] = 5.0, 10.0
    rec = TASK.record(out, targets)
    assert rec["n_scored"].tolist() == [6, 3, 4]  # punctuation left out
    assert rec["correct_argmax"].tolist() == [5, 3, 3]  # the per-word argmax, as planted
    assert rec["correct_labelled_argmax"].tolist() == [4, 2, 3]
    assert rec["correct"].tolist() == [5, 3, 4]  # the one-root tree breaks the cycle at dog's gold arc
    assert rec["correct_labelled"].tolist() == [4, 2, 4]  # with the label of the tree's arc
    scores = TASK.point_scores(rec, y)
    assert scores["uas_argmax"] == pytest.approx(11 / 13, abs=1e-12)
    assert scores["las_argmax"] == pytest.approx(9 / 13, abs=1e-12)
    assert scores["uas"] == pytest.approx(12 / 13, abs=1e-12) and scores["las"] == pytest.approx(10 / 13, abs=1e-12)
    argmax = predicted_trees(out, targets, items, [len(s) for s in SENTENCES], tree=False)
    assert [h.tolist() for h, _ in argmax] == heads
    assert [[LABELS[i] for i in lab] for _, lab in argmax] == labels
    trees = predicted_trees(out, targets, items, [len(s) for s in SENTENCES])
    assert [h.tolist() for h, _ in trees] == [heads[0], heads[1], [2, 0, 4, 2]]
    assert [[LABELS[i] for i in lab] for _, lab in trees] == labels


def test_loss_is_the_mean_over_words_of_arc_plus_label_cross_entropy(parser):
    tok = tiny_tokenizer()
    corpus = _corpus()
    enc = encode_corpus(corpus, tok)
    y = word_targets(corpus, LABELS)
    batches = make_batches(enc, y, batch_size=8, pad_id=0, use_token_types=True, task=TASK)
    with torch.no_grad():
        out = parser(**batches.inputs[0]).logits
    target = batches.labels[0]
    # slow loop: per word, softmax over [CLS] and the sentence's other words' first pieces
    total, n = 0.0, 0
    for b, p in enumerate(batches.positions[0]):
        it = enc.items[p]
        fp = first_pieces(it.word_ids, len(y[it.index]))
        for w, (h, lab, _) in enumerate(y[it.index]):
            cands = [0] + [int(fp[v]) for v in range(len(fp)) if v != w]
            arc = out[b, fp[w], cands, 0].double()
            gold = cands.index(0 if h == 0 else int(fp[h - 1]))
            total += float(-F.log_softmax(arc, 0)[gold])
            total += float(-F.log_softmax(out[b, fp[w], 0 if h == 0 else fp[h - 1], 1:].double(), 0)[lab])
            n += 1
    assert float(TASK.loss(out, target)) == pytest.approx(total / n, rel=1e-5)
    assert float(TASK.loss(out, target, reduction="sum")) == pytest.approx(total, rel=1e-5)
    rec = TASK.record(out, target)
    assert rec["loss_sum"].sum() == pytest.approx(total, rel=1e-5) and rec["n_loss"].sum() == n


def test_bootstrap_weights_equal_scoring_the_resampled_corpus():
    rng = np.random.default_rng(0)
    records = {"correct": rng.integers(0, 8, 5).astype(float), "n_scored": rng.integers(8, 12, 5).astype(float),
               "correct_labelled": rng.integers(0, 6, 5).astype(float), "loss_sum": rng.uniform(0, 9, 5),
               "n_loss": rng.integers(9, 13, 5).astype(float), "pred": np.arange(5), "loss": np.zeros(5),
               "correct_argmax": rng.integers(0, 8, 5).astype(float),
               "correct_labelled_argmax": rng.integers(0, 6, 5).astype(float)}
    weights = np.array([[2, 0, 1, 0, 2], [1, 1, 1, 1, 1]], dtype=np.float32)
    got = TASK.scores(weights, {k: v[None] for k, v in records.items()}, np.empty(5, dtype=object))
    for r, w in enumerate(weights):
        resampled = np.repeat(np.arange(5), w.astype(int))
        assert got["uas"][r, 0] == pytest.approx(records["correct"][resampled].sum() / records["n_scored"][resampled].sum())
        assert got["las"][r, 0] == pytest.approx(
            records["correct_labelled"][resampled].sum() / records["n_scored"][resampled].sum())
        assert got["loss"][r, 0] == pytest.approx(records["loss_sum"][resampled].sum() / records["n_loss"][resampled].sum())
        assert got["uas_argmax"][r, 0] == pytest.approx(
            records["correct_argmax"][resampled].sum() / records["n_scored"][resampled].sum())
        assert got["las_argmax"][r, 0] == pytest.approx(
            records["correct_labelled_argmax"][resampled].sum() / records["n_scored"][resampled].sum())


def test_chance_is_the_best_fixed_offset_baseline():
    y = word_targets(_corpus(), LABELS)
    # each fixed offset counted over the scored words by a loop
    hits = {off: sum(int(h == i + 1 + off) for t in y for i, (h, _, s) in enumerate(t) if s) for off in (-3, -2, -1, 1, 2, 3)}
    assert TASK.chance(y) == pytest.approx(max(hits.values()) / 13)


def test_saved_parser_reloads_with_the_same_predictions_and_its_encoder_loads_alone(parser, tmp_path):
    parser.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    assert (tmp_path / HEAD_WEIGHTS).exists() and (tmp_path / HEAD_CONFIG).exists()
    loaded = load_model(tmp_path)
    assert isinstance(loaded.model, BiaffineParser) and loaded.is_classifier
    assert task_of_model(loaded.model).name == "parsing" and loaded.model.labels == tuple(LABELS)
    enc = encode_corpus(_corpus(), loaded.tokenizer)
    batch = make_batches(enc, word_targets(_corpus(), LABELS), batch_size=8, pad_id=0, use_token_types=True, task=TASK)
    with torch.no_grad():
        assert torch.equal(parser(**batch.inputs[0]).logits, loaded.model(**batch.inputs[0]).logits)
    plain = load_model(tmp_path, kind="encoder")  # the folder is an ordinary encoder folder too
    assert type(plain.model).__name__ == "BertModel"
    for k, v in parser.encoder.state_dict().items():
        assert torch.equal(v, plain.model.state_dict()[k]), k


def test_a_model_without_a_parser_head_is_refused(tmp_path):
    enc = load_model(save_tiny_bert(tmp_path))
    with pytest.raises(BertologyError, match="no dependency parser head"):
        TASK.check_model(enc.model)


def test_targets_need_trees_and_keep_unknown_labels_as_errors(parser):
    with pytest.raises(BertologyError, match="Parsing needs gold trees"):
        TASK.targets(Corpus.from_list(["the cat sat"], labels=["1"]), parser)
    s = [[("the", "DET", 2, "det"), ("cat", "NOUN", 0, "root"), ("sat", "VERB", 2, "acl")]]
    y = TASK.targets(_corpus(s), parser)
    assert y[0][:, 1].tolist() == [LABELS.index("det"), LABELS.index("root"), -1]  # acl: not in the parser's labels


def test_cached_and_naive_sweeps_agree_and_importance_runs(parser):
    corpus = _corpus(SENTENCES * 3)
    enc = encode_corpus(corpus, tiny_tokenizer())
    y = TASK.targets(corpus, parser)
    scoring = HeadScoring(batch_size=4)
    cached = run_ablation(parser, enc, y, scoring, n_bootstrap=20, sweep=SweepPlan(method="cached"))
    naive = run_ablation(parser, enc, y, scoring, n_bootstrap=20, sweep=SweepPlan(method="naive"))
    assert cached.params["method"] == "cached" and cached.params["task"] == "parsing"
    for key, rec in naive.per_example.items():
        for name in ("correct", "correct_labelled", "correct_argmax", "correct_labelled_argmax", "n_scored", "pred"):
            np.testing.assert_array_equal(cached.per_example[key][name], rec[name], err_msg=f"{key} {name}")
        np.testing.assert_allclose(cached.per_example[key]["loss_sum"], rec["loss_sum"], rtol=1e-4, atol=1e-5)
    assert set(cached.table["metric"]) == {"uas", "las", "loss", "uas_argmax", "las_argmax"}
    assert "intact: uas" in summary({"ablation": cached.table})
    imp = run_head_importance(parser, enc, y, scoring, pruning=PruningPlan(0.5))
    assert np.isfinite(imp.importance["importance_raw"]).all() and (imp.importance["importance_raw"] > 0).any()
    assert set(imp.curve["metric"]) == {"uas", "las", "loss", "uas_argmax", "las_argmax"}


def test_multiword_tokens_and_empty_nodes_are_read_and_a_word_sharing_a_token_is_left_out(tmp_path):
    text = ("# text = cannot go\n"
            "1-2\tcannot\t_\t_\t_\t_\t_\t_\t_\t_\n"
            "1\tcan\tcan\tAUX\t_\t_\t3\taux\t_\t_\n"
            "2\tnot\tnot\tPART\t_\t_\t3\tadvmod\t_\t_\n"
            "3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_\n"
            "3.1\tgone\tgo\tVERB\t_\t_\t_\t_\t0:root\t_\n\n")
    path = tmp_path / "mwt.conllu"
    path.write_text(text)
    corpus = load_corpus(path)
    assert corpus[0].words == ("can", "not", "go") and corpus.stats["n_multiword_tokens"] == 1
    assert corpus.stats["n_empty_nodes"] == 1
    enc = encode_corpus(corpus, tiny_tokenizer())  # "cannot" is one token ([UNK]): "not" has no piece of its own
    y = word_targets(corpus, ["advmod", "aux", "root"])
    cover = coverage(enc, y)
    assert cover["n_words"] == 3 and cover["n_words_without_piece"] == 1 and cover["n_scored_words_without_piece"] == 1
    t = TASK.collate_targets(enc.items, [y[0]])[0]
    assert int((t[:, 0] != -100).sum()) == 2  # "can" and "go" only


def test_a_head_outside_the_sentence_names_file_and_line(tmp_path):
    path = tmp_path / "bad.conllu"
    path.write_text("# text = the cat\n1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\t_\t_\t7\troot\t_\t_\n\n")
    with pytest.raises(BertologyError, match=r"bad.conllu, line 3: .*HEAD 7 points past the last word \(2\)"):
        load_corpus(path)


def test_head_importance_resumes_from_its_saved_parsing_records(parser, tmp_path):
    corpus = _corpus(SENTENCES * 2)
    enc = encode_corpus(corpus, tiny_tokenizer())
    y = TASK.targets(corpus, parser)
    first = run_head_importance(parser, enc, y, HeadScoring(batch_size=4), pruning=PruningPlan(0.5), progress_dir=tmp_path)
    again = run_head_importance(parser, enc, y, HeadScoring(batch_size=4), pruning=PruningPlan(0.5), progress_dir=tmp_path)
    pd_testing.assert_frame_equal(first.curve, again.curve)


def _state(folder) -> dict:
    from safetensors.torch import load_file

    return {**load_file(str(folder / "model.safetensors")), **{f"head.{k}": v for k, v in load_file(str(folder / HEAD_WEIGHTS)).items()}}


def test_an_interrupted_parser_run_resumes_to_the_same_weights(tmp_path):
    from bertology.config import DataConfig, FinetuneConfig
    from bertology.training.finetune import finetune
    from bertology.training.run import finetune_to_dir

    base = save_tiny_bert(tmp_path / "m", hidden_dropout_prob=0.1)  # dropout on: the RNG state must be restored too
    data = tmp_path / "t.conllu"
    data.write_text(_conllu(SENTENCES * 4))
    train = load_corpus(data)

    def cfg(out):
        return FinetuneConfig(model=str(base), data=DataConfig(path=str(data)), out=str(out), task="parsing", epochs=2,
                              batch_size=2, grad_accum=2, save_every=2, learning_rate=1e-3, seed=0)

    full = finetune(cfg(tmp_path / "full"), train)

    def stop(step):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune_to_dir(cfg(tmp_path / "cut"), train, on_step=stop)
    run = finetune_to_dir(cfg(tmp_path / "cut"), train)
    assert run.metrics["uas"] == pytest.approx(full.metrics["uas"])
    a, b = _state(full.model_dir), _state(run.model_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_the_parser_records_its_exclusion_with_the_eval_counts_of_finetune_and_tagging(tmp_path):
    """--exclude-words on a parser: the manifest's exclusion record carries the held-out slice counts, as
    finetune and tagging do, and they equal a count of the held-out sentences' own words."""
    from bertology.config import DataConfig, FinetuneConfig
    from bertology.training.finetune import finetune

    base = save_tiny_bert(tmp_path / "m")
    train_file, eval_file = tmp_path / "t.conllu", tmp_path / "e.conllu"
    train_sents, eval_sents = SENTENCES * 3, SENTENCES * 2 + SENTENCES[1:]
    train_file.write_text(_conllu(train_sents))
    eval_file.write_text(_conllu(eval_sents))
    cfg = FinetuneConfig(model=str(base), data=DataConfig(path=str(train_file)), out=str(tmp_path / "run"),
                         task="parsing", epochs=1, batch_size=4, seed=0, exclude_words=("John",))
    result = finetune(cfg, load_corpus(train_file), load_corpus(eval_file))
    ex = result.details["excluded_words"]
    mentions = [any(w.lower() == "john" for w, *_ in s) for s in eval_sents]  # the words, not the regex
    assert (ex["eval_with_words"], ex["eval_without_words"]) == (sum(mentions), len(mentions) - sum(mentions)) == (3, 5)
    dropped = sum(any(w == "john" for w, *_ in s) for s in train_sents)
    assert (ex["n_before"], ex["n_dropped"], ex["n_after"]) == (len(train_sents), dropped, len(train_sents) - dropped)
    assert result.details["training_objective"] == "supervised (arc + label cross-entropy per word)"
    assert result.details["eval_slices"] == {"words": ["john"], "with_words": 3, "without_words": 5}
    from bertology.training.tagging import finetune_tagger  # the tagger's record has the same keys
    tag_cfg = FinetuneConfig(model=str(base), data=DataConfig(path=str(train_file)), out=str(tmp_path / "tag"),
                             epochs=1, batch_size=4, seed=0, exclude_words=("John",))
    tagged = finetune_tagger(tag_cfg, load_corpus(train_file), load_corpus(eval_file)).details["excluded_words"]
    assert tagged.keys() == ex.keys() and {k: tagged[k] for k in tagged} == {k: ex[k] for k in tagged}
