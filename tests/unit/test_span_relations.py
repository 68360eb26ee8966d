"""User-given token relations (JSONL spans): the loader's errors, and the analysis against a slow loop."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.span_relations import SpanRelationHeads, span_units
from bertology.data.encode import encode_corpus
from bertology.data.spans import load_span_relations, split_words
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair
from bertology.testing import batch_on, captured_batches, no_host_copies

# "movies", "books", "dogs", "reading" are several word pieces in the tiny vocabulary.
RECORDS = [
    {"text": "the movies were funny but the plot was boring .", "from": "movies", "to": "funny", "relation": "aspect"},
    {"text": "the plot was boring and the actors were great .", "from": "actors", "to": ["great"], "relation": "aspect"},
    {"text": "john saw mary and he liked her books .", "from": "he", "to": "john", "relation": "coref"},
    {"text": "mary gave john two books because she liked him .", "from": "she", "to": "mary", "relation": "coref"},
    {"text": "the dogs ran fast but they were slow .", "from": "they", "to": ["the dogs"], "relation": "coref"},
    {"text": "i love this funny movie .", "from": [18, 23], "to": [[12, 17]], "relation": "aspect"},
    {"text": "the old man was reading a very good book .", "from": "book", "to": ["very", "good"]},
]


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


@pytest.fixture(scope="module")
def spans(tmp_path_factory):
    return load_span_relations(_write(tmp_path_factory.mktemp("spans") / "rel.jsonl", RECORDS))


def test_loader_maps_spans_to_words(spans):
    corpus, rels = spans
    assert len(corpus) == len(rels) == len(RECORDS)
    words = corpus[4].words
    assert [words[w] for w in rels[4].source] == ["they"]
    assert [words[w] for w in rels[4].targets] == ["the", "dogs"]
    assert [corpus[5].words[w] for w in rels[5].source] == ["movie"]  # character range [18, 23)
    assert [corpus[5].words[w] for w in rels[5].targets] == ["funny"]
    assert rels[6].relation == "custom"
    assert [corpus[6].words[w] for w in rels[6].targets] == ["very", "good"]
    assert corpus.stats["n_relations"] == len(RECORDS)


def test_split_words_is_bert_like():
    words, offsets = split_words("It's great, isn't it?")
    assert words == ["It", "'", "s", "great", ",", "isn", "'", "t", "it", "?"]
    assert all("It's great, isn't it?"[s:e] == w for w, (s, e) in zip(words, offsets))


@pytest.mark.parametrize(
    "record,message",
    [
        ({"text": "the cat sat on the mat .", "from": "the", "to": "cat"}, "occurs 2 times"),
        ({"text": "the cat sat .", "from": "dog", "to": "cat"}, "does not occur"),
        ({"text": "the cat sat .", "from": "cat"}, "missing key(s) to"),
        ({"text": "the cat sat .", "from": [2, 99], "to": "sat"}, "outside the text"),
        ({"text": "the cat sat .", "from": "cat", "to": "cat"}, "no word outside"),
        ({"text": "the cat sat .", "from": 3, "to": "cat"}, "must be a string or [start, end)"),
        ({"text": "", "from": "a", "to": "b"}, "non-empty string"),
    ],
)
def test_loader_errors_name_the_line(tmp_path, record, message):
    path = _write(tmp_path / "bad.jsonl", [RECORDS[0], record])
    with pytest.raises(BertologyError) as err:
        load_span_relations(path)
    assert "line 2" in str(err.value) and message in str(err.value)


def test_loader_rejects_invalid_json_and_empty_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n{not json\n")
    with pytest.raises(BertologyError, match="line 2: not valid JSON"):
        load_span_relations(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BertologyError, match="holds no relation"):
        load_span_relations(empty)
    with pytest.raises(BertologyError, match="not found"):
        load_span_relations(tmp_path / "missing.jsonl")


def test_span_units_merge_the_source():
    word_ids = np.array([-1, 0, 1, 1, 2, 3, -1])
    units, n_units, word_unit = span_units(word_ids, (1, 2), 4)
    assert n_units == 3
    assert word_unit.tolist() == [0, 1, 1, 2]
    assert units.tolist() == [-1, 0, 1, 1, 1, 2, -1]


def _slow(pair, corpus, rels, offsets=(-3, -2, -1, 1, 2)):
    """Independent computation: one instance at a time through the HF models, Python loops."""
    L, H = pair.num_layers, pair.num_heads
    correct, n, base = {}, {}, {}
    for rel in rels:
        ex = corpus[rel.example]
        enc = pair.tokenizer(ex.text, return_tensors="pt")  # the plain text; its words are the corpus words here
        wids = [-1 if w is None else w for w in enc.word_ids()]
        # units: the source words are one unit, every other word its own
        units, order = {}, []
        for w in range(len(ex.words)):
            key = "src" if w in rel.source else w
            if key not in units:
                units[key] = len(order)
                order.append(key)
        pieces = {u: [t for t, w in enumerate(wids) if w >= 0 and units["src" if w in rel.source else w] == u]
                  for u in range(len(order))}
        src = units["src"]
        targets = {units[w] for w in rel.targets}
        n[rel.relation] = n.get(rel.relation, 0) + 1
        for k in offsets:
            w = min(rel.source) + k if k < 0 else max(rel.source) + k
            base[rel.relation, k] = base.get((rel.relation, k), 0) + (w in rel.targets)
        for m, model in (("base", pair.base.model), ("tuned", pair.tuned.model)):
            with torch.inference_mode():
                out = model(**enc, output_attentions=True)
            for layer in range(L):
                for h in range(H):
                    att = out.attentions[layer][0, h].double().tolist()

                    def unit_att(u, v):  # from u (mean over its pieces) to v (sum over its pieces)
                        return sum(att[p][q] for p in pieces[u] for q in pieces[v]) / len(pieces[u])

                    others = [u for u in range(len(order)) if u != src]
                    best_out = max(others, key=lambda v: (unit_att(src, v), -v))
                    best_in = max(others, key=lambda u: (unit_att(u, src), -u))
                    for d, best in (("from->to", best_out), ("to->from", best_in)):
                        key = (m, rel.relation, d, layer + 1, h)
                        correct[key] = correct.get(key, 0) + (best in targets)
    return correct, n, base


def test_agrees_with_slow_per_instance_loop(planted_pair, spans):
    pair = ModelPair.load(*map(str, planted_pair))
    corpus, rels = spans
    enc = encode_corpus(corpus, pair.tokenizer)
    a = SpanRelationHeads(rels, pair.num_layers, pair.num_heads)
    run_analyses(pair, enc, [a], batch_size=3)
    table = a.compute().table
    correct, n, base = _slow(pair, corpus, rels)
    assert set(table.relation) == set(n) == {"aspect", "coref", "custom"}
    assert set(table.direction) == {"from->to", "to->from"} and set(table.kind) == {"span"}
    assert len(table) == len(n) * 2 * 2 * pair.num_layers * pair.num_heads
    for row in table.itertuples():
        assert row.n == n[row.relation]
        assert row.accuracy == pytest.approx(correct[row.model, row.relation, row.direction, row.layer, row.head] / row.n)
        best = max(base[row.relation, k] for k in (-3, -2, -1, 1, 2)) / row.n
        assert row.baseline_accuracy == pytest.approx(best)
        assert base[row.relation, row.baseline_offset] / row.n == pytest.approx(best)
    # the tiny models' heads differ, so the table is not constant
    assert table.accuracy.nunique() > 1


def test_merge_of_shards_equals_whole(identical_pair, spans):
    pair = ModelPair.load(*map(str, identical_pair))
    corpus, rels = spans
    enc = encode_corpus(corpus, pair.tokenizer)
    whole = SpanRelationHeads(rels, pair.num_layers, pair.num_heads)
    run_analyses(pair, enc, [whole], batch_size=4)
    first, second = (SpanRelationHeads(rels, pair.num_layers, pair.num_heads) for _ in range(2))
    half = len(enc.items) // 2
    items = enc.items
    enc.items = items[:half]
    run_analyses(pair, enc, [first], batch_size=2)
    enc.items = items[half:]
    run_analyses(pair, enc, [second], batch_size=2)
    merged = first.merge(second)
    np.testing.assert_array_equal(merged.correct, whole.correct)
    np.testing.assert_array_equal(merged.n, whole.n)
    table = whole.compute().table
    # identical models: base and tuned rows agree
    b = table[table.model == "base"].accuracy.to_numpy()
    t = table[table.model == "tuned"].accuracy.to_numpy()
    np.testing.assert_array_equal(b, t)


# ------------------------------------------------------------------------ issue 35: the hits counted where the maps are
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")


def _span_heads(pair, rels, on_device: bool | None) -> SpanRelationHeads:
    a = SpanRelationHeads(rels, pair.num_layers, pair.num_heads)
    a.count_on_device = on_device
    return a


def test_hits_counted_on_the_device_equal_the_host_counts(planted_pair, spans):
    """The device path (forced on the CPU) counts the same hits as the host path: integers, exactly; its counts
    stay on the device until read, then cross once; shards of either path merge into the whole corpus's counts."""
    pair = ModelPair.load(*map(str, planted_pair))
    corpus, rels = spans
    enc = encode_corpus(corpus, pair.tokenizer)
    host, dev = _span_heads(pair, rels, False), _span_heads(pair, rels, True)
    run_analyses(pair, enc, [host, dev], batch_size=3)
    assert host._device_correct is None and dev._device_correct is not None
    assert dev._device_correct.dtype == torch.int64 and int(dev._device_correct.sum()) > 0
    np.testing.assert_array_equal(dev.correct, host.correct)
    assert dev._device_correct is None  # read once: folded into the host counts
    pd.testing.assert_frame_equal(dev.compute().table, host.compute().table, check_exact=True)
    items, half = enc.items, len(enc.items) // 2
    for paths in ((True, False), (False, True)):
        parts = [_span_heads(pair, rels, p) for p in paths]
        for part, chunk in zip(parts, (items[:half], items[half:])):
            enc.items = chunk
            run_analyses(pair, enc, [part], batch_size=2)
        enc.items = items
        pd.testing.assert_frame_equal(parts[0].merge(parts[1]).compute().table, host.compute().table, check_exact=True)


def test_the_span_updates_make_no_host_copy(planted_pair, spans):
    """What a GPU run would copy to the host per batch: nothing (the device path forced on the CPU, with
    ``Tensor.cpu/numpy/item/tolist/__array__`` and the scalar conversions refused during the updates)."""
    pair = ModelPair.load(*map(str, planted_pair))
    corpus, rels = spans
    enc = encode_corpus(corpus, pair.tokenizer)
    batches = captured_batches(pair, enc, frozenset({"attentions"}), batch_size=3)
    dev, host = _span_heads(pair, rels, True), _span_heads(pair, rels, False)
    with no_host_copies(), torch.inference_mode():
        for batch in batches:
            dev.update(batch)
    for batch in batches:
        host.update(batch)
    assert host.correct.sum() > 0
    np.testing.assert_array_equal(dev.correct, host.correct)


@needs_cuda
def test_on_a_gpu_span_hits_are_counted_there_and_equal_the_cpu_counts(planted_pair, spans):
    """The same batches on the GPU (default path: counted there) and on the CPU: the same hits. The word attention
    is float64 on both; an argmax could differ only between two units within float64 rounding (none here)."""
    pair = ModelPair.load(*map(str, planted_pair))
    corpus, rels = spans
    enc = encode_corpus(corpus, pair.tokenizer)
    batches = captured_batches(pair, enc, frozenset({"attentions"}), batch_size=3)
    gpu, cpu = _span_heads(pair, rels, None), _span_heads(pair, rels, None)
    with torch.inference_mode():
        for batch in batches:
            cpu.update(batch)
            gpu.update(batch_on(batch, "cuda"))
    assert gpu._device_correct.device.type == "cuda" and cpu._device_correct is None
    np.testing.assert_array_equal(gpu.correct, cpu.correct)
