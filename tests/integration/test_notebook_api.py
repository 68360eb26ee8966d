"""The notebook face: ``import bertology as bt`` stays light, ``bt.compare`` runs in memory, ``bt.load_run`` reopens
a folder as the same object, tables are DataFrames by attribute, ``plot`` returns the report's figures, and the
card is compact (headlines, changed settings, warnings), not a table dump."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

import bertology as bt
from bertology.errors import BertologyError
from bertology.testing import SENTENCES, tiny_bert_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_bert_pair(tmp_path_factory.mktemp("pair"), planted=(1, 2))


def test_import_bertology_imports_no_torch():
    code = "import sys, bertology as bt; bt.__all__; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_compare_in_memory_then_kept_and_reopened(pair, tmp_path):
    base, tuned = map(str, pair)
    run = bt.compare(base, tuned, SENTENCES, analyses=["attention_change", "representation_similarity"],
                     rsa_tokens=50, view_examples=0)
    assert run.out is None and run.report is None  # nothing kept on disk
    assert isinstance(run.attention_change, pd.DataFrame) and run.table("attention_change") is run.attention_change
    worst = run.attention_change.groupby(["layer", "head"])["cosine"].mean().idxmin()
    assert worst == (1, 2)  # the planted head changed most
    assert set(run.tables) == {"attention_change", "representation_similarity"}
    assert run.changed_settings() == {"--base": base, "--analyses": ["attention_change", "representation_similarity"],
                                      "--rsa-tokens": 50, "--view-examples": 0}
    with pytest.raises(AttributeError, match="has no table 'geometry'; its tables: attention_change"):
        run.geometry
    # plots are the report's own figures
    assert "attention_cosine" in run.figures()
    fig = run.plot("attention_cosine")
    assert fig.axes and fig is run.plot("attention_change")
    with pytest.raises(BertologyError, match="No figure 'nope'"):
        run.plot("nope")
    card = run._repr_html_()
    assert "attention change: lowest cosine L1H2" in card and "--rsa-tokens 50" in card and "--analyses attention_change,representation_similarity" in card and "<table" not in card
    assert len(card) < 4000
    # the same call with out= keeps the folder; load_run gives back the same tables and manifest
    kept = bt.compare(base, tuned, SENTENCES, analyses=["attention_change", "representation_similarity"],
                      rsa_tokens=50, view_examples=0, out=tmp_path / "run", report=True)
    assert kept.out == tmp_path / "run" and kept.report and kept.report.exists()
    again = bt.load_run(tmp_path / "run")
    assert again.kind == "compare" and again.manifest == kept.manifest
    for name, df in kept.tables.items():
        pd.testing.assert_frame_equal(again.tables[name], df, check_dtype=False)
        pd.testing.assert_frame_equal(df, run.tables[name], check_dtype=False)


def test_a_bad_setting_is_one_clear_error(pair):
    base, tuned = map(str, pair)
    with pytest.raises(BertologyError, match=r"--rsa-tokens \(rsa_tokens\) must be at least 4, not 2\."):
        bt.compare(base, tuned, SENTENCES, analyses="representation_similarity", rsa_tokens=2)
    with pytest.raises(BertologyError, match="Unknown setting rsa_tokenz"):
        bt.compare(base, tuned, SENTENCES, rsa_tokenz=2)
    with pytest.raises(BertologyError, match="report=True needs out="):
        bt.compare(base, tuned, SENTENCES, report=True)
    with pytest.raises(BertologyError, match="not a bertology run folder"):
        bt.load_run("/nonexistent/run")


def test_finetune_then_compare_then_ablate_from_python(tmp_path):
    """The three calls a notebook makes, each returning a Run."""
    import random

    from bertology.testing import TINY_WORDS, save_tiny_bert

    rng = random.Random(0)
    filler = [w for w in TINY_WORDS if w not in {"good", "bad"}]
    rows = [f"{rng.choice(filler)} {'good' if i % 2 else 'bad'} {rng.choice(filler)}\t{i % 2}" for i in range(40)]
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    base = save_tiny_bert(tmp_path / "base")
    tuned = bt.finetune(base, data, out=tmp_path / "ft", epochs=1, batch_size=8, seed=0, eval_fraction=0.25)
    assert tuned.kind == "finetune" and (tuned.model_dir / "config.json").exists()
    assert {"step", "epoch", "split", "metric", "value"} <= set(tuned.finetune.columns)
    with pytest.raises(BertologyError, match=r"Unknown setting epoch \(did you mean epochs\?\);"):
        bt.finetune(base, data, out=tmp_path / "ft2", epoch=1)
    cmp = bt.compare(base, tuned.model_dir, data, analyses=["attention_change", "ablation"], ablation_bootstrap=20,
                     ablation_importance=False, view_examples=0)
    assert set(cmp.tables) == {"attention_change", "ablation"}
    abl = bt.ablate(tuned.model_dir, data, n_bootstrap=20, importance=False)
    assert abl.kind == "ablate" and abl.out is None
    # the same sweep on the same examples: compare's ablation and ablate's agree
    heads = ["target", "layer", "head", "mode", "metric", "value", "delta"]
    a = cmp.ablation[heads].sort_values(heads[:5]).reset_index(drop=True)
    b = abl.ablation[heads].sort_values(heads[:5]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_probe_and_study_from_python(tmp_path, pair):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from study_helpers import tiny_study

    rows = []
    for n, s in enumerate(SENTENCES * 2, 1):
        words = s.split()
        rows.append(f"# sent_id = s{n}\n" + "\n".join(
            "\t".join([str(i), w, w, "PUNCT" if w in ".,!?" else "X", "_", "_", str(i - 1), "root" if i == 1 else "dep",
                       "_", "_"]) for i, w in enumerate(words, 1)))
    trees = tmp_path / "t.conllu"
    trees.write_text("\n\n".join(rows) + "\n\n", encoding="utf-8")
    base, tuned = map(str, pair)
    probes = bt.probe(base, trees, trees, tuned=tuned, rank=4, epochs=2, batch_size=6)
    assert probes.kind == "probe" and set(probes.probe["model"]) == {"base", "tuned"}
    with pytest.raises(BertologyError, match="Unknown setting ranks"):
        bt.probe(base, trees, trees, ranks=4)
    spec = tiny_study(tmp_path / "study", seeds=(0,))
    done = bt.study(spec)
    assert done.kind == "study" and done.out == tmp_path / "study/out"
    assert all(j["status"] in ("done", "cached") for j in done.manifest["jobs"]), done.manifest["jobs"]


def test_settings_by_flag_spelling_and_paths(pair, tmp_path):
    """A setting may be named as its flag is spelled (``importance`` for ``--importance``, ``lr`` for ``--lr``), and a
    file setting may be a Path, as ``data`` and ``out`` may."""
    from pathlib import Path

    from bertology.commands.selection import complete_config, make_config

    config = complete_config(make_config("d.txt", tuned="t", importance=False, ood_data=Path("ood.txt")))
    assert config.ablation_importance is False and config.ood_data == "ood.txt"
    with pytest.raises(BertologyError, match="given twice"):
        complete_config(make_config("d.txt", tuned="t", importance=False, ablation_importance=True))
    from bertology.api import _split
    from bertology.config import DataConfig, FinetuneConfig

    data, ft = _split({"lr": 1e-4, "text_column": "s", "eval_slices": "good"}, DataConfig, FinetuneConfig)
    assert data == {"text_column": "s"} and ft == {"learning_rate": 1e-4, "slice_words": "good"}
    with pytest.raises(BertologyError, match=r"Unknown setting epoch \(did you mean epochs\?\); known: .*epochs") as err:
        _split({"epoch": 1}, DataConfig, FinetuneConfig)
    assert " model," not in str(err.value) and " out," not in str(err.value)  # arguments are not settings


def test_loading_a_model_draws_no_transformers_bars_and_restores_their_state(pair, capfd):
    from transformers.utils import logging as hf_logging

    from bertology.models.loading import quiet_transformers

    hf_logging.enable_progress_bar()
    before = hf_logging.get_verbosity()
    base, tuned = map(str, pair)
    bt.compare(base, tuned, SENTENCES[:4], analyses="attention_change", view_examples=0)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "LOAD REPORT" not in err
    assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == before  # the user's settings kept
    with pytest.raises(RuntimeError):
        with quiet_transformers():
            assert not hf_logging.is_progress_bar_enabled()
            raise RuntimeError("restored even when the body raises")
    assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == before
