"""RelationHeads (Clark et al. 2019 §4.2) against a slow per-sentence loop, baselines, merge, planted maps."""
import numpy as np
import pandas as pd
import pytest
import torch

from bertology.activations.batch import PairBatch
from bertology.activations.extract import collate, run_analyses
from bertology.analyses.relation_heads import RelationHeads, WordPooling, best_heads
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.testing import tiny_tokenizer

# "cats", "reading", "books", "slowly", "dogs", "movies", "house s" split into several word pieces.
CONLLU = """\
# text = the cats sat on the mat .
1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcats\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\t_
4\ton\ton\tADP\t_\t_\t6\tcase\t_\t_
5\tthe\tthe\tDET\t_\t_\t6\tdet\t_\t_
6\tmat\tmat\tNOUN\t_\t_\t3\tobl\t_\t_
7\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# text = john saw mary reading books slowly .
1\tjohn\tjohn\tPROPN\t_\t_\t2\tnsubj\t_\t_
2\tsaw\tsee\tVERB\t_\t_\t0\troot\t_\t_
3\tmary\tmary\tPROPN\t_\t_\t2\tobj\t_\t_
4\treading\tread\tVERB\t_\t_\t2\txcomp\t_\t_
5\tbooks\tbook\tNOUN\t_\t_\t4\tobj\t_\t_
6\tslowly\tslowly\tADV\t_\t_\t4\tadvmod\t_\t_
7\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_

# text = a dull film .
1\ta\ta\tDET\t_\t_\t_\t_\t_\t_
2\tdull\tdull\tADJ\t_\t_\t_\t_\t_\t_
3\tfilm\tfilm\tNOUN\t_\t_\t_\t_\t_\t_
4\t.\t.\tPUNCT\t_\t_\t_\t_\t_\t_

# text = the old dogs ran fast to the big houses at night .
1\tthe\tthe\tDET\t_\t_\t3\tdet\t_\t_
2\told\told\tADJ\t_\t_\t3\tamod\t_\t_
3\tdogs\tdog\tNOUN\t_\t_\t4\tnsubj\t_\t_
4\tran\trun\tVERB\t_\t_\t0\troot\t_\t_
5\tfast\tfast\tADV\t_\t_\t4\tadvmod\t_\t_
6\tto\tto\tADP\t_\t_\t9\tcase\t_\t_
7\tthe\tthe\tDET\t_\t_\t9\tdet\t_\t_
8\tbig\tbig\tADJ\t_\t_\t9\tamod\t_\t_
9\thouses\thouse\tNOUN\t_\t_\t4\tobl\t_\t_
10\tat\tat\tADP\t_\t_\t11\tcase\t_\t_
11\tnight\tnight\tNOUN\t_\t_\t4\tobl:tmod\t_\t_
12\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

# text = she liked the movies and the books .
1\tshe\tshe\tPRON\t_\t_\t2\tnsubj\t_\t_
2\tliked\tlike\tVERB\t_\t_\t0\troot\t_\t_
3\tthe\tthe\tDET\t_\t_\t4\tdet\t_\t_
4\tmovies\tmovie\tNOUN\t_\t_\t2\tobj\t_\t_
5\tand\tand\tCCONJ\t_\t_\t7\tcc\t_\t_
6\tthe\tthe\tDET\t_\t_\t7\tdet\t_\t_
7\tbooks\tbook\tNOUN\t_\t_\t4\tconj\t_\t_
8\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("ud") / "tiny.conllu"
    path.write_text(CONLLU)
    return load_corpus(str(path))


@pytest.fixture(scope="module")
def pair(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


def _run(pair, corpus, batch_size=2, **kw):
    enc = encode_corpus(corpus, pair.tokenizer)
    a = RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=1, **kw)
    run_analyses(pair, enc, [a], batch_size=batch_size)
    return a


def test_tiny_corpus_exercises_word_pieces(corpus):
    tok = tiny_tokenizer()
    assert tok.tokenize("cats") == ["cat", "##s"] and tok.tokenize("reading") == ["read", "##ing"]
    assert corpus[2].heads is None and corpus[0].deprels[5] == "obl"


def _slow_word_attention(att, word_ids, W):
    """att: [T, T] list of lists; explicit loops: sum over the target word's pieces, mean over the source's."""
    pieces = [[t for t, w in enumerate(word_ids) if w == i] for i in range(W)]
    out = [[0.0] * W for _ in range(W)]
    for i in range(W):
        for j in range(W):
            total = 0.0
            for p in pieces[i]:
                for q in pieces[j]:
                    total += float(att[p][q])
            out[i][j] = total / len(pieces[i])
    return out


def _argmax(values, skip):
    best, arg = None, None
    for w, v in enumerate(values):
        if w == skip:
            continue
        if best is None or v > best:
            best, arg = v, w
    return arg


def _slow(pair, corpus, offsets=(-3, -2, -1, 1, 2), reverse="transpose"):
    """Independent computation: one sentence at a time through the HF models, Python loops."""
    L, H = pair.num_layers, pair.num_heads
    correct, n, base = {}, {}, {}
    for ex in corpus:
        if ex.heads is None:
            continue
        enc = pair.tokenizer(ex.text, return_tensors="pt")  # the plain text; its words are the corpus words here
        wids = [-1 if w is None else w for w in enc.word_ids()]
        W = len(ex.words)
        maps = {}
        for m, model in (("base", pair.base.model), ("tuned", pair.tuned.model)):
            with torch.inference_mode():
                out = model(**enc, output_attentions=True)
            for layer in range(L):
                for h in range(H):
                    maps[m, layer + 1, h] = _slow_word_attention(out.attentions[layer][0, h].tolist(), wids, W)
        for d, (g1, rel) in enumerate(zip(ex.heads, ex.deprels)):
            if g1 == 0:
                continue
            g = g1 - 1
            for r in (rel, "all"):
                n[r] = n.get(r, 0) + 1
                for k in offsets:
                    base["dep->head", r, k] = base.get(("dep->head", r, k), 0) + (g == d + k)
                    hit = (g == d + k) if reverse == "transpose" else (d == g + k)
                    base["head->dep", r, k] = base.get(("head->dep", r, k), 0) + hit
            for (m, layer, h), A in maps.items():
                dh = _argmax(A[d], d) == g
                if reverse == "transpose":
                    hd = _argmax([A[w][d] for w in range(W)], d) == g
                else:
                    hd = _argmax(A[g], g) == d
                for r in (rel, "all"):
                    for direction, hit in (("dep->head", dh), ("head->dep", hd)):
                        key = (m, r, direction, layer, h)
                        correct[key] = correct.get(key, 0) + hit
    return correct, n, base


@pytest.mark.parametrize("reverse", ["transpose", "row"])
def test_agrees_with_slow_per_sentence_loop(pair, corpus, reverse):
    a = _run(pair, corpus, reverse=reverse)
    res = a.compute()
    table = res.table
    correct, n, base = _slow(pair, corpus, reverse=reverse)
    assert set(table.relation) == set(n)
    assert len(table) == len(n) * 2 * 2 * pair.num_layers * pair.num_heads
    assert list(table.columns[:9]) == [
        "model", "relation", "direction", "layer", "head", "accuracy", "baseline_offset", "baseline_accuracy", "n"
    ]
    for row in table.itertuples():
        key = (row.model, row.relation, row.direction, row.layer, row.head)
        assert row.n == n[row.relation]
        assert row.accuracy == pytest.approx(correct[key] / n[row.relation], abs=1e-12), key
        accs = {k: base[row.direction, row.relation, k] / n[row.relation] for k in (-3, -2, -1, 1, 2)}
        assert row.baseline_accuracy == pytest.approx(max(accs.values()))
        assert accs[row.baseline_offset] == pytest.approx(max(accs.values()))
    # not everything trivially right or wrong: the comparison means something
    assert 0 < table.accuracy.mean() < 1
    assert res.params["n_skipped_no_tree"] == 1 and res.params["n_examples"] == 4
    assert res.params["n_root"] == 4 and res.params["n_pairs"]["all"] == n["all"] == 34 - 4
    # ranks: 1 = best within (model, relation, direction)
    top = table[table["rank"] == 1]
    for (m, r, d), grp in table.groupby(["model", "relation", "direction"]):
        assert top[(top.model == m) & (top.relation == r) & (top.direction == d)].accuracy.iloc[0] == grp.accuracy.max()


def test_identical_pair_gives_identical_models(identical_pair, corpus):
    pair = ModelPair.load(*map(str, identical_pair))
    t = _run(pair, corpus).compute().table
    b = t[t.model == "base"].drop(columns="model").reset_index(drop=True)
    u = t[t.model == "tuned"].drop(columns="model").reset_index(drop=True)
    pd.testing.assert_frame_equal(b, u)


def _chain_corpus():
    words = ["the", "old", "man", "saw", "a", "big", "red", "dog", "."]
    n = len(words)
    heads = tuple(list(range(2, n + 1)) + [0])  # every word's head is the next word; the last is the root
    ex = Example(" ".join(words), words=tuple(words), heads=heads, deprels=tuple(["dep"] * (n - 1) + ["root"]))
    return Corpus([ex, ex, ex], name="chain")


@pytest.mark.parametrize("reverse,expected", [("transpose", (1, 1)), ("row", (1, -1))])
def test_baseline_on_a_chain_tree(pair, reverse, expected):
    corpus = _chain_corpus()
    table = _run(pair, corpus, reverse=reverse).compute().table
    for direction, offset in zip(("dep->head", "head->dep"), expected):
        rows = table[(table.relation == "dep") & (table.direction == direction)]
        assert (rows.baseline_offset == offset).all()
        assert (rows.baseline_accuracy == 1.0).all()
        assert (rows.n == 3 * 8).all()


def test_merge_of_shards_equals_whole(pair, corpus):
    whole = _run(pair, corpus).compute()
    first = _run(pair, corpus.subset([0, 1]))
    second = _run(pair, corpus.subset([2, 3, 4]))
    merged = first.merge(second).compute()
    key = ["model", "relation", "direction", "layer", "head"]
    a = whole.table.sort_values(key).reset_index(drop=True)
    b = merged.table.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    for k in ("n_examples", "n_skipped_no_tree", "n_root", "n_pairs_unscored"):
        assert merged.params[k] == whole.params[k]
    with pytest.raises(ValueError):
        first.merge(RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=2))


def test_min_count_drops_rare_relations_but_counts_them(pair, corpus):
    res = _run(pair, corpus).compute()
    a = RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=3)
    run_analyses(pair, encode_corpus(corpus, pair.tokenizer), [a], batch_size=3)
    res3 = a.compute()
    counts = res.params["n_pairs"]
    assert set(res3.table.relation) == {r for r, c in counts.items() if c >= 3}
    assert res3.params["dropped_relations"] == {r: c for r, c in counts.items() if c < 3}
    assert "obl:tmod" in res3.params["dropped_relations"]  # full label kept, not folded into obl


def test_truncated_example_scores_only_complete_words(pair, corpus):
    enc = encode_corpus(corpus, pair.tokenizer, max_length=8, overlong="truncate")
    a = RelationHeads(corpus, pair.num_layers, pair.num_heads, min_count=1)
    run_analyses(pair, enc, [a], batch_size=2)
    res = a.compute()
    # sentence 1 keeps [CLS] the cat ##s sat on the [SEP]: 'the'(2nd) is the last word present -> dropped
    # so only pairs among {the, cats, sat, on}: the->cats, cats->sat (on->mat unscored)
    assert res.params["n_pairs_unscored"] > 0
    assert res.params["n_pairs"]["all"] + res.params["n_pairs_unscored"] == 30


def _planted_batch(corpus, tok):
    """A fake batch whose L1H2 attends from every word to its gold head, L2H0 from each head to a dependent."""
    enc = encode_corpus(corpus, tok)
    items = [it for it in enc.items]
    t = collate(items, tok.pad_token_id)
    B, T = t["input_ids"].shape
    L, H = 2, 4
    caps = []
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        att = [None] + [torch.rand(B, H, T, T, generator=gen) * 0.1 for _ in range(L)]
        for b, it in enumerate(items):
            ex = corpus[it.index]
            if ex.heads is None:
                continue
            wid = it.word_ids
            for tq, w in enumerate(wid):
                if w < 0:
                    continue
                g = ex.heads[w] - 1
                if g >= 0:
                    att[1][b, 2, tq, np.flatnonzero(wid == g)[0]] = 5.0  # first piece of the head
            for d, g1 in enumerate(ex.heads):  # head attends to its dependent (the transposed pattern)
                if g1 > 0:
                    for tq in np.flatnonzero(wid == g1 - 1):
                        att[2][b, 0, tq, np.flatnonzero(wid == d)[0]] += 1.0 + d  # its last dependent wins
        caps.append(Captured([], att))
    return PairBatch(items, t["input_ids"], t["mask"], t["content"], t["lengths"], caps[0], caps[1])


def test_planted_attention_heads_rank_first(corpus):
    a = RelationHeads(corpus, 2, 4, min_count=1)
    a.update(_planted_batch(corpus, tiny_tokenizer()))
    table = a.compute().table
    best = best_heads(table)
    for model in ("base", "tuned"):
        row = best[(best.model == model) & (best.relation == "all") & (best.direction == "dep->head")].iloc[0]
        assert row.head_label == "L1H2" and row.accuracy == 1.0
    over = best_heads(table, by_direction=False)
    assert set(over.columns) >= {"model", "relation", "direction", "head_label", "accuracy", "baseline_accuracy"}
    assert len(over) == 2 * table.relation.nunique()
    assert table[(table.layer == 1) & (table["head"] == 2) & (table.direction == "dep->head")].accuracy.eq(1.0).all()
    # L2H0: each head word attends to its dependents, so the word attending most to a dependent is its head
    l2h0 = table[(table.layer == 2) & (table["head"] == 0) & (table.direction == "head->dep")]
    assert l2h0.accuracy.eq(1.0).all()
    assert (l2h0["rank"] == 1).all()


class _PerExample(RelationHeads):
    """The pre-batching implementation: word attention pooled and scored one example at a time."""

    def update(self, batch):
        L = self.num_layers
        for b, item in enumerate(batch.items):
            T = int(batch.mask[b].sum())
            found = self._pairs(item, T)
            if found is None:
                self.n_skipped_no_tree += 1
                continue
            self.n_examples += 1
            wid, W, present, dep, gov, rels = found
            if len(dep) == 0:
                continue
            rel_ids = [self._relation(r) for r in rels]
            onehot = np.zeros((len(dep), len(self.relations)), dtype=np.int64)
            onehot[np.arange(len(dep)), rel_ids] = 1
            onehot[:, self._rel_index["all"]] = 1
            self.n += onehot.sum(0)
            for m, cap in enumerate((batch.base, batch.tuned)):
                att = torch.stack([cap.attentions[layer][b, :, :T, :T] for layer in range(1, L + 1)])
                hits = self._hits(att, wid, W, present, dep, gov).astype(np.int64)
                self.correct[:, m] += np.einsum("dlhp,pr->rdlh", hits, onehot)


def _side_by_side(pair, corpus, classes, device: str = "cpu", **kw) -> list[RelationHeads]:
    """One instance of each class, every other setting alike, fed the same batches of ``corpus`` (batch size 3)."""
    enc = encode_corpus(corpus, pair.tokenizer)
    made = [cls(corpus, pair.num_layers, pair.num_heads, min_count=1, **kw) for cls in classes]
    run_analyses(pair, enc, made, batch_size=3, device=device)
    return made


@pytest.mark.parametrize("to_method,from_method", [("sum", "first"), ("max", "max"), ("mean", "sum")])
@pytest.mark.parametrize("reverse", ["transpose", "row"])
def test_batched_pooling_equals_per_example_for_every_method(pair, corpus, to_method, from_method, reverse):
    fast, slow = _side_by_side(pair, corpus, (RelationHeads, _PerExample), pooling=WordPooling(to_method, from_method),
                               reverse=reverse)
    assert fast.relations == slow.relations
    np.testing.assert_array_equal(fast.n, slow.n)
    np.testing.assert_array_equal(fast.correct, slow.correct)
    assert fast.correct[fast.relations.index("all")].sum() > 0


def test_sentence_pair_annotated_over_both_texts_scores_both_trees():
    from bertology.data.align import annotated_word_ids

    first = Example("the cat sat .", words=("the", "cat", "sat", "."), upos=("DET", "NOUN", "VERB", "PUNCT"),
                    heads=(2, 3, 0, 3), deprels=("det", "nsubj", "root", "punct"))
    # pair: "the cats sat" + "a dog ran fast", heads over the concatenation (second tree shifted by 3)
    pair_ex = Example("the cats sat", text_pair="a dog ran fast", words=("the", "cats", "sat", "a", "dog", "ran", "fast"),
                      upos=("DET", "NOUN", "VERB", "DET", "NOUN", "VERB", "ADV"),
                      heads=(2, 3, 0, 5, 6, 0, 6), deprels=("det", "nsubj", "root", "det", "nsubj", "root", "advmod"),
                      n_first_words=3)
    legacy = Example("the cats sat", text_pair="a dog ran fast", words=("the", "cats", "sat"),
                     upos=("DET", "NOUN", "VERB"), heads=(2, 3, 0), deprels=("det", "nsubj", "root"))
    tok = tiny_tokenizer()
    for corpus_examples, expected_pairs in (([first, pair_ex], 3 + 5), ([first, legacy], 3 + 2)):
        corpus = Corpus(corpus_examples)
        enc = encode_corpus(corpus, tok)
        items = enc.items
        t = collate(items, tok.pad_token_id)
        B, T = t["input_ids"].shape
        att = [None] + [torch.full((B, 4, T, T), 0.01) for _ in range(2)]
        for b, it in enumerate(items):
            ex = corpus[it.index]
            wid = annotated_word_ids(it.word_ids, it.segment, ex.n_first_words)
            if ex.text_pair is not None and ex.n_first_words is not None:
                assert (wid[it.segment == 1] >= 3).all()  # second-text pieces map past the first text's words
            for tq, w in enumerate(wid):
                if w >= 0 and ex.heads[w] > 0:
                    att[1][b, 2, tq, np.flatnonzero(wid == ex.heads[w] - 1)[0]] = 5.0
        cap = Captured([], att)
        batch = PairBatch(items, t["input_ids"], t["mask"], t["content"], t["lengths"], cap, cap)
        a = RelationHeads(corpus, 2, 4, min_count=1)
        a.update(batch)
        res = a.compute()
        assert res.params["n_pairs"]["all"] == expected_pairs
        row = res.table[(res.table.relation == "all") & (res.table.direction == "dep->head") & (res.table.layer == 1)
                        & (res.table["head"] == 2) & (res.table.model == "base")]
        assert row.accuracy.iloc[0] == 1.0


class _OnDevice(RelationHeads):
    """The path --device cuda takes (word attention pooled and scored where the maps are), forced on the CPU."""

    score_on_device = True


@pytest.mark.parametrize("to_method,from_method", [("sum", "mean"), ("max", "first"), ("mean", "sum")])
@pytest.mark.parametrize("reverse", ["transpose", "row"])
def test_scoring_where_the_maps_are_counts_what_the_kernel_counts(pair, corpus, to_method, from_method, reverse):
    kernel, device = _side_by_side(pair, corpus, (RelationHeads, _OnDevice),
                                   pooling=WordPooling(to_method, from_method), reverse=reverse)
    assert kernel.relations == device.relations
    np.testing.assert_array_equal(kernel.n, device.n)
    np.testing.assert_array_equal(kernel.correct, device.correct)
    np.testing.assert_array_equal(kernel.baseline_correct, device.baseline_correct)
    assert device.correct[device.relations.index("all")].sum() > 0
    pd.testing.assert_frame_equal(kernel.compute().table, device.compute().table, check_exact=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")
def test_on_a_gpu_the_maps_are_scored_there_and_count_what_the_kernel_counts(pair, corpus):
    class Kernel(RelationHeads):
        score_on_device = False

    try:  # RelationHeads' default: where the maps are
        kernel, device = _side_by_side(pair, corpus, (Kernel, RelationHeads), device="cuda")
    finally:  # the pair is shared with the other tests
        pair.base.model.cpu()
        pair.tuned.model.cpu()
    np.testing.assert_array_equal(kernel.correct, device.correct)
    np.testing.assert_array_equal(kernel.n, device.n)
