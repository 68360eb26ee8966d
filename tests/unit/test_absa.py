"""SemEval-2014 ABSA: the XML reader, the Sun et al. (2019) pairs, and the ABSA heads on hand-built maps."""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from absa_fixture import LAPTOP, RESTAURANT, write_absa  # noqa: E402

from bertology.activations.batch import PairBatch  # noqa: E402
from bertology.analyses.absa_heads import AbsaHeads, absa_instances, head_change  # noqa: E402
from bertology.data.absa import (  # noqa: E402
    MISC, absa_pairs, opinion_spans_in_doc, read_absa, split_sentences, term_categories,
)
from bertology.data.encode import encode_corpus  # noqa: E402
from bertology.data.spans import split_words  # noqa: E402
from bertology.errors import BertologyError  # noqa: E402
from bertology.testing import no_host_copies, tiny_tokenizer  # noqa: E402

CATS = ("food", "service", "price", "ambience", MISC)


@pytest.fixture()
def restaurant(tmp_path):
    return read_absa(write_absa(tmp_path / "rest.xml"))


def test_qa_m_pairs_labels_and_counts(restaurant):
    assert restaurant.categories == CATS  # first appearance, misc last
    pairs = absa_pairs(restaurant, "qa_m")
    assert len(pairs.pairs) == len(RESTAURANT) * len(CATS)
    two = {p.aspect: p for p in pairs.pairs if p.sentence_id == "2"}
    assert {a: p.label for a, p in two.items()} == {"service": "negative", "food": "positive", "price": "none",
                                                    "ambience": "none", MISC: "none"}
    assert two["food"].question == "what do you think of the food of it ?"
    q = two["food"].question
    assert q[slice(*two["food"].aspect_span)] == "food"
    assert [t.term for t in two["food"].target_terms] == ["food"]
    assert [t.term for t in two["food"].other_terms] == ["service"]
    assert not two["price"].present and two["food"].present
    c = pairs.counts
    assert c["n_conflict"] == 1 and c["n_conflict_dropped"] == 0 and c["labels"]["conflict"] == 1
    assert c["labels"]["none"] == len(RESTAURANT) * len(CATS) - sum(len(r[3]) for r in RESTAURANT)
    dropped = absa_pairs(restaurant, "qa_m", conflict="drop")
    assert len(dropped.pairs) == len(pairs.pairs) - 1 and dropped.counts["n_conflict_dropped"] == 1
    assert "conflict" not in dropped.counts["labels"]


def test_nli_m_and_term_level(restaurant):
    nli = absa_pairs(restaurant, "nli_m")
    assert {p.question for p in nli.pairs} == set(CATS)
    assert all(p.question[slice(*p.aspect_span)] == p.aspect for p in nli.pairs)
    term = absa_pairs(restaurant, "term_qa_m")
    assert len(term.pairs) == sum(len(r[2]) for r in RESTAURANT)
    two = [p for p in term.pairs if p.sentence_id == "2"]
    assert [(p.aspect, p.label) for p in two] == [("service", "negative"), ("food", "positive")]
    assert [t.term for t in two[0].other_terms] == ["food"]
    assert term.counts["n_sentences_without_terms"] == 1


def test_laptop_file_has_terms_only(tmp_path):
    data = read_absa(write_absa(tmp_path / "laptop.xml", LAPTOP))
    assert not data.has_categories
    pairs = absa_pairs(data, "term_nli_m")
    assert [(p.question, p.label) for p in pairs.pairs] == [("screen", "positive"), ("battery", "negative"),
                                                           ("keyboard", "positive")]
    with pytest.raises(BertologyError, match="no aspect categories.*term_qa_m"):
        absa_pairs(data, "qa_m")


def test_offset_mismatch_names_file_and_sentence(tmp_path):
    path = write_absa(tmp_path / "bad.xml", bad_offset="6")
    with pytest.raises(BertologyError) as err:
        read_absa(path)
    msg = str(err.value)
    assert "bad.xml" in msg and "sentence 6" in msg and "'staff'" in msg and "'taff '" in msg


def test_term_category_rule(restaurant):
    by_id = {s.id: s for s in restaurant.sentences}
    assert term_categories(by_id["2"]) == ["service", "food"]  # two categories: the lexicon decides
    assert term_categories(by_id["8"]) == ["food"]  # one category besides misc
    assert term_categories(by_id["6"]) == ["service"]  # one category


def test_sentence_split_keeps_pairs_of_a_sentence_together(restaurant):
    train, held = split_sentences(restaurant, 0.3, seed=1)
    assert len(held) == 3 and not set(train) & set(held) and len(train) + len(held) == len(RESTAURANT)
    assert split_sentences(restaurant, 0.3, seed=1) == (train, held)


def test_opinion_rule_on_a_parse():
    from bertology.data.annotate import load_spacy

    try:
        nlp = load_spacy()
    except BertologyError:
        pytest.skip("no spaCy pipeline")
    text = "the service was slow but the food was good ."
    data_term = SimpleNamespace(start=text.index("food"), end=text.index("food") + 4)
    spans = opinion_spans_in_doc(nlp(text), [data_term])
    assert [text[a:b] for a, b in spans] == ["good"]  # "slow" is three arcs away; "was" is AUX


# ------------------------------------------------------------------------------------------ the heads

def _planted_batch(pairs, instances, planted: set[int], sep_absent=0.8, sep_present=0.1):
    """A batch of the pairs with hand-built maps (1 layer, 2 heads).

    Base: uniform. Tuned head 0: the aspect word puts all its attention on the first piece of its
    first target term for the instances in ``planted``, else on the review's first word ("the").
    Tuned head 1: the aspect word puts ``sep_absent`` / ``sep_present`` on the [SEP] tokens (split
    evenly), the rest on [CLS].
    """
    tok = tiny_tokenizer()
    from bertology.data.absa import AbsaPairs

    corpus = AbsaPairs(pairs, "qa_m").corpus()
    enc = encode_corpus(corpus, tok, 64, "truncate")
    B, T = len(enc.items), max(len(it) for it in enc.items)
    base = torch.zeros(B, 2, T, T, dtype=torch.float64)
    for b, it in enumerate(enc.items):
        base[b, :, : len(it), : len(it)] = 1.0 / len(it)
    tuned = base.clone()
    for b, it in enumerate(enc.items):
        x = instances[it.index]
        n1 = x.n_first_words
        seg, wid = np.asarray(it.segment), np.asarray(it.word_ids)
        rows = [t for t in range(len(it)) if seg[t] == 1 and wid[t] + n1 in x.source]
        if "aspect" in x.targets:
            goal = x.targets["aspect"][0] if it.index in planted else 0
            col = next(t for t in range(len(it)) if seg[t] == 0 and wid[t] == goal)
            for r in rows:
                tuned[b, 0, r] = 0.0
                tuned[b, 0, r, col] = 1.0
        sep_cols = [t for t in range(len(it)) if it.input_ids[t] == tok.sep_token_id]
        share = sep_present if x.present else sep_absent
        for r in rows:
            tuned[b, 1, r] = 0.0
            tuned[b, 1, r, 0] = 1.0 - share
            for c in sep_cols:
                tuned[b, 1, r, c] = share / len(sep_cols)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, it in enumerate(enc.items):
        mask[b, : len(it)] = True
    batch = PairBatch(enc.items, torch.zeros(B, T, dtype=torch.long), mask, mask, mask.sum(1),
                      SimpleNamespace(attentions={1: base}), SimpleNamespace(attentions={1: tuned}))
    return batch, tok


def test_aspect_head_accuracy_and_sep_share_on_hand_built_maps(restaurant):
    pairs = [p for p in absa_pairs(restaurant, "qa_m").pairs if p.sentence_id in {"1", "2", "4", "6", "10"}]
    instances = absa_instances(pairs)
    with_aspect = [x.example for x in instances if "aspect" in x.targets]
    assert len(with_aspect) == 7  # 1 food; 2 service, food; 4 price; 6 service; 10 food, price
    planted = set(with_aspect[:4])
    batch, tok = _planted_batch(pairs, instances, planted)
    a = AbsaHeads(instances, 1, 2, tok.sep_token_id)
    a.update(batch)
    table = a.compute().table
    row = table[(table.model == "tuned") & (table.relation == "aspect") & (table.direction == "from->to")
                & (table.layer == 1) & (table["head"] == 0)].iloc[0]
    assert row.n == 7 and row.accuracy == pytest.approx(4 / 7)  # the hand count
    # chance: per instance, targets / candidate words (every word of both texts but the aspect span)
    chance = np.mean([len(x.targets["aspect"]) / (len(split_words(pairs[x.example].text)[0])
                      + len(split_words(pairs[x.example].question)[0]) - len(x.source))
                      for x in instances if "aspect" in x.targets])
    assert row.chance == pytest.approx(chance)
    # position baseline: word 1 is the term in sentences 1, 4, 6, 2 (service) and 10 (food): 5 of 7
    position_hits = {k: sum((k if k >= 0 else x.n_first_words + k) in x.targets["aspect"]
                            for x in instances if "aspect" in x.targets) for k in (0, 1, 2, 3, 4, -1, -2, -3, -4, -5)}
    assert row.position_accuracy == pytest.approx(max(position_hits.values()) / 7) and row.position_accuracy == pytest.approx(5 / 7)
    sep = a.sep_table()
    s = sep[(sep.model == "tuned") & (sep["head"] == 1)].iloc[0]
    assert s.sep_absent == pytest.approx(0.8) and s.sep_present == pytest.approx(0.1)
    assert s.n_absent == sum(not x.present for x in instances) and s.n_present == sum(x.present for x in instances)
    # uniform base: the aspect word's [SEP] share is 2 / length, averaged per condition
    lengths = {it.index: len(it) for it in batch.items}
    b = sep[(sep.model == "base") & (sep["head"] == 1)].iloc[0]
    assert b.sep_absent == pytest.approx(np.mean([2 / lengths[x.example] for x in instances if not x.present]))
    change = head_change(table)
    c = change[(change.relation == "aspect") & (change.direction == "from->to") & (change["head"] == 0)].iloc[0]
    assert c.tuned == pytest.approx(4 / 7) and c.delta == pytest.approx(c.tuned - c.base)


def test_sep_share_summed_where_the_maps_are_equals_numpy(restaurant):
    """The [SEP] shares summed by torch where the maps are (the GPU path, forced here on the CPU) equal NumPy's
    sums to float64 rounding, and the hand-built shares still come out (0.8 absent, 0.1 present)."""
    pairs = [p for p in absa_pairs(restaurant, "qa_m").pairs if p.sentence_id in {"1", "2", "4", "6", "10"}]
    instances = absa_instances(pairs)
    batch, tok = _planted_batch(pairs, instances, {x.example for x in instances if "aspect" in x.targets})

    class OnDevice(AbsaHeads):
        sum_on_device = True

    class OnCpu(AbsaHeads):
        sum_on_device = False

    tables = []
    for cls in (OnDevice, OnCpu):
        a = cls(instances, 1, 2, tok.sep_token_id)
        a.update(batch)
        tables.append(a.sep_table())
    pd.testing.assert_frame_equal(tables[0], tables[1], rtol=1e-15, atol=1e-15)
    s = tables[0][(tables[0].model == "tuned") & (tables[0]["head"] == 1)].iloc[0]
    assert s.sep_absent == pytest.approx(0.8) and s.sep_present == pytest.approx(0.1)


def _both_paths(instances, tok, on_device: bool) -> AbsaHeads:
    """Absa heads with the [SEP] shares summed and the span hits counted on the device (forced) or on the host."""
    a = AbsaHeads(instances, 1, 2, tok.sep_token_id)
    a.sum_on_device = on_device
    a.spans.count_on_device = on_device
    return a


def test_the_absa_updates_make_no_host_copy_and_keep_their_sums_on_the_device(restaurant):
    """Issue 35: the device paths (forced on the CPU) copy nothing to the host per batch (``Tensor.cpu/numpy/item/
    tolist/__array__`` and the scalar conversions refused), keep the [SEP] sums and hit counts there until read,
    and give the host paths' tables: hit counts exactly; the [SEP] shares to float64 rounding (1e-15: each
    example's share is the same few float64 sums in another order, then added in the same order on both paths)."""
    pairs = [p for p in absa_pairs(restaurant, "qa_m").pairs if p.sentence_id in {"1", "2", "4", "6", "10"}]
    instances = absa_instances(pairs)
    batch, tok = _planted_batch(pairs, instances, {x.example for x in instances if "aspect" in x.targets})
    dev, host = _both_paths(instances, tok, True), _both_paths(instances, tok, False)
    with no_host_copies(), torch.inference_mode():
        dev.update(batch)
    host.update(batch)
    assert dev._device_sep_sum is not None and dev.spans._device_correct is not None
    assert host._device_sep_sum is None and host.spans._device_correct is None
    pd.testing.assert_frame_equal(dev.sep_table(), host.sep_table(), rtol=1e-15, atol=1e-15)
    assert dev._device_sep_sum is None  # read once: folded into the host sums
    pd.testing.assert_frame_equal(dev.compute().table, host.compute().table, check_exact=True)
    # a device shard merges with a host shard (into an empty instance): the sum of their sums, exactly
    again = _both_paths(instances, tok, True)
    again.update(batch)
    assert again._device_sep_sum is not None
    counts = again.spans._device_correct.clone()
    merged = _both_paths(instances, tok, False).merge(again).merge(host)
    np.testing.assert_array_equal(merged.sep_sum, dev.sep_sum + host.sep_sum)
    np.testing.assert_array_equal(merged.spans.correct, counts.numpy() + host.spans.correct)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")
def test_on_a_gpu_absa_sums_stay_there_and_equal_the_cpu_tables(restaurant):
    """The hand-built batch on the GPU (default paths) and on the CPU: the same counts, [SEP] shares to 1e-15."""
    pairs = [p for p in absa_pairs(restaurant, "qa_m").pairs if p.sentence_id in {"1", "2", "4", "6", "10"}]
    instances = absa_instances(pairs)
    batch, tok = _planted_batch(pairs, instances, {x.example for x in instances if "aspect" in x.targets})
    gpu, cpu = AbsaHeads(instances, 1, 2, tok.sep_token_id), AbsaHeads(instances, 1, 2, tok.sep_token_id)
    moved = PairBatch(batch.items, batch.input_ids.cuda(), batch.mask.cuda(), batch.content.cuda(), batch.lengths.cuda(),
                      SimpleNamespace(attentions={1: batch.base.attentions[1].cuda()}),
                      SimpleNamespace(attentions={1: batch.tuned.attentions[1].cuda()}))
    gpu.update(moved)
    cpu.update(batch)
    assert gpu._device_sep_sum.device.type == "cuda" and gpu.spans._device_correct.device.type == "cuda"
    pd.testing.assert_frame_equal(gpu.sep_table(), cpu.sep_table(), rtol=1e-15, atol=1e-15)
    pd.testing.assert_frame_equal(gpu.compute().table, cpu.compute().table, check_exact=True)
