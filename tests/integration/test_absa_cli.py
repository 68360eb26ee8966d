"""``bertology absa`` end to end on a tiny SemEval-style file and a tiny BERT: pairs, fine-tune, ABSA heads, report."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from absa_fixture import write_absa  # noqa: E402

from bertology.analyses.absa_heads import top_heads  # noqa: E402
from bertology.testing import save_tiny_bert  # noqa: E402
from cli_checks import assert_user_error, invoke  # noqa: E402


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("absa")
    data = write_absa(tmp / "rest.xml")
    base = save_tiny_bert(tmp / "base")
    out = tmp / "run"
    result = invoke("absa", "--data", data, "--base", base, "--out", out, "--epochs", 1, "--batch-size", 8,
                    "--eval-fraction", 0.4, "--seed", 0)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_tables_hold_base_and_tuned_side_by_side(study):
    out, output = study
    tables = out / "study" / "tables"
    heads = pd.read_parquet(tables / "absa_heads.parquet")
    assert set(heads.model) == {"base", "tuned"}
    assert {"aspect", "other_aspect"} <= set(heads.relation)
    change = pd.read_parquet(tables / "absa_head_change.parquet")
    assert {"base", "tuned", "delta", "best_baseline", "created"} <= set(change.columns)
    # the side-by-side table is the long one pivoted
    b = heads[(heads.model == "base")].set_index(["relation", "direction", "layer", "head"]).accuracy
    t = heads[(heads.model == "tuned")].set_index(["relation", "direction", "layer", "head"]).accuracy
    c = change.set_index(["relation", "direction", "layer", "head"])
    assert c.base.sort_index().tolist() == b.sort_index().tolist()
    assert c.tuned.sort_index().tolist() == t.sort_index().tolist()
    sep = pd.read_parquet(tables / "absa_sep_share.parquet")
    assert set(sep.model) == {"base", "tuned"} and (sep.n_absent > 0).all() and (sep.n_present > 0).all()
    assert (out / "finetune" / "model" / "config.json").exists()
    manifest = json.loads((out / "study" / "manifest.json").read_text())
    assert manifest["absa"]["held_out"]["style"] == "qa_m" and "n_conflict" in manifest["absa"]["train"]
    assert manifest["views"], "the report shows example maps"
    assert "held-out accuracy" in output and "report:" in output


def test_report_names_the_top_heads(study):
    out, _ = study
    html = (out / "study" / "report.html").read_text()
    assert 'id="absa"' in html and "Aspect-based sentiment heads" in html
    heads = pd.read_parquet(out / "study" / "tables" / "absa_heads.parquet")
    best = top_heads(heads, 1)
    for r in best[best.model == "tuned"].itertuples():
        assert f"L{r.layer}H{r.head}" in html
    assert 'id="attention-viewer"' in html


def test_offset_mismatch_is_a_user_error(tmp_path):
    data = write_absa(tmp_path / "bad.xml", bad_offset="4")
    result = invoke("absa", "--data", data, "--out", tmp_path / "run")
    assert_user_error(result, "bad.xml", "sentence 4", "'price'")


@pytest.mark.parametrize("batch_size", [32, 3])
def test_one_pass_per_model_gives_the_tables_of_the_former_two_passes(tmp_path, monkeypatch, batch_size):
    """run_absa streams the held-out pairs once for the ABSA heads and attention change together; its tables
    equal (exactly) those of the former way: the ABSA heads in a pass of their own, then compare's own pass."""
    import bertology.activations.extract as extract
    from bertology.activations.extract import run_analyses
    from bertology.analyses.absa_heads import TABLES, AbsaHeads, absa_instances
    from bertology.config import CompareConfig, DataConfig
    from bertology.data.absa import absa_pairs, read_absa, split_sentences
    from bertology.data.encode import encode_corpus
    from bertology.models.pair import ModelPair
    from bertology.commands.compare import compare
    from bertology.commands.absa import AbsaConfig, _seen_labels_only, run_absa
    from bertology.testing import tiny_bert_pair

    data = write_absa(tmp_path / "rest.xml")
    base, tuned = tiny_bert_pair(tmp_path / "pair", planted=(1, 0), classifier=True)
    cfg = AbsaConfig(data=str(data), out=str(tmp_path / "new"), base=str(base), tuned=str(tuned), eval_fraction=0.5,
                     batch_size=batch_size, max_length=40, opinions=False, view_examples=0, report=False)
    passes = []
    real = extract.run_shared_analyses
    monkeypatch.setattr(extract, "run_shared_analyses", lambda *a, **k: passes.append(1) or real(*a, **k))
    new = run_absa(cfg)
    assert len(passes) == 1  # one forward pass per model over the held-out pairs
    monkeypatch.undo()

    # the former way, step by step: the same held-out pairs, the ABSA heads alone, then compare
    doc = read_absa(str(data))
    train_ids, eval_ids = split_sentences(doc, cfg.eval_fraction, cfg.seed, None)
    train = absa_pairs(doc, cfg.style, cfg.conflict, train_ids)
    held = _seen_labels_only(absa_pairs(doc, cfg.style, cfg.conflict, eval_ids), {p.label for p in train.pairs}, [])
    corpus = held.corpus(name="held", source=str(data))
    pair = ModelPair.load(str(base), str(tuned))
    old = AbsaHeads(absa_instances(held.pairs), pair.num_layers, pair.num_heads, pair.tokenizer.sep_token_id)
    run_analyses(pair, encode_corpus(corpus, pair.tokenizer, cfg.max_length, "truncate"), [old], batch_size=batch_size)
    old_tables = {r.name: r.table for r in old.results()}
    change = compare(CompareConfig(base=str(base), tuned=str(tuned), out=str(tmp_path / "old"), analyses=("attention_change",),
                                   data=DataConfig(max_length=cfg.max_length, overlong="truncate"), batch_size=batch_size,
                                   view_examples=0), corpus=corpus, pair=pair, report=False)
    assert set(old_tables) == set(TABLES) == set(new.tables)
    for name in TABLES:
        pd.testing.assert_frame_equal(new.tables[name], old_tables[name], check_exact=True)
        pd.testing.assert_frame_equal(pd.read_parquet(new.out / "tables" / f"{name}.parquet"), old_tables[name],
                                      check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(new.out / "tables" / "attention_change.parquet"),
                                  change.results["attention_change"].table, check_exact=True)
    assert (change.results["attention_change"].table["js_divergence"] > 0).any()  # the planted head changed something
