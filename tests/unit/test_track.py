"""``track``: every checkpoint of a tiny fine-tuning run compared with its base, tables over steps, figures."""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from matplotlib.figure import Figure

from bertology.config import CompareConfig, DataConfig, FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.testing import TINY_WORDS, save_tiny_bert
from bertology.training.run import finetune_to_dir
from bertology.commands.track import find_checkpoints, track, track_figures


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("track")
    base = save_tiny_bert(tmp / "m")
    rng = random.Random(0)
    filler = [w for w in TINY_WORDS if w not in ("good", "bad")]
    texts = [f"{rng.choice(filler)} {'good' if i % 2 == 0 else 'bad'} {rng.choice(filler)}" for i in range(32)]
    labels = ["pos" if i % 2 == 0 else "neg" for i in range(32)]
    data = tmp / "train.csv"
    pd.DataFrame({"sentence": texts, "label": labels}).to_csv(data, index=False)
    cfg = FinetuneConfig(model=str(base), out=str(tmp / "run"), epochs=1, batch_size=8, learning_rate=5e-3,
                         warmup_ratio=0.0, save_every=2, eval_fraction=0.25,
                         data=DataConfig(path=str(data), max_examples=None, overlong="truncate"))
    finetune_to_dir(cfg, Corpus.from_list(texts, labels=labels))
    return tmp / "run", base, texts


def test_track_collects_both_checkpoints_against_the_base(run, tmp_path):
    folder, base, texts = run
    ckpts = find_checkpoints(folder)
    # 24 training examples / 8 = 3 steps: checkpoints at 2 and 3; the final model is the step-3 checkpoint
    assert [(c.name, c.step) for c in ckpts] == [("step-2", 2), ("step-3", 3)]

    result = track(folder, max_examples=8)
    assert set(result.tables) == {"attention_change", "representation_similarity"}
    for name, table in result.tables.items():
        assert {"model", "checkpoint", "step"} <= set(table.columns)
        assert sorted(set(table["step"])) == [2, 3]
        assert set(table["checkpoint"]) == {"step-2", "step-3"}
        on_disk = pd.read_parquet(folder / "tables" / f"track_{name}.parquet")
        assert len(on_disk) == len(table)
        assert (folder / "tables" / f"track_{name}.csv").exists()
        assert (folder / "figures" / f"track_{name}.svg").read_text().lstrip().startswith("<?xml")
    ac = result.tables["attention_change"]
    assert {"layer", "head", "cosine", "js_divergence"} <= set(ac.columns)
    # the checkpoints moved away from the base: attention is not identical at every head
    assert (ac["cosine"] < 1 - 1e-6).any()

    # the rows of step 2 are what a direct compare of that checkpoint gives
    from bertology.commands.compare import compare

    direct = compare(
        CompareConfig(base=str(base), tuned=str(folder / "checkpoints" / "step-2"), out=str(tmp_path / "direct"),
                      analyses=("attention_change",), view_examples=0, data=DataConfig(max_examples=8)),
        corpus=Corpus.from_list(texts[:8]), report=False,
    ).table("attention_change")
    mine = ac[ac["step"] == 2].drop(columns=["model", "checkpoint", "step"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mine[direct.columns], direct.reset_index(drop=True), check_exact=False, atol=1e-6)

    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "finetune" and manifest["metrics"]  # the fine-tuning record is kept
    assert [c["name"] for c in manifest["track"]["checkpoints"]] == ["step-2", "step-3"]

    # figures are returned, one per analysis; again on the same folder reuses the compare runs
    figs = track_figures(result.tables)
    assert set(figs) == set(result.tables) and all(isinstance(f, Figure) for f in figs.values())
    again = track(folder, max_examples=8, figures=False)
    assert again.reused == ["step-2", "step-3"]


def test_track_errors(tmp_path, run):
    with pytest.raises(BertologyError, match="not a fine-tuning run"):
        track(tmp_path)
    with pytest.raises(BertologyError, match="Unknown analysis"):
        track(run[0], analyses=("nope",))


def test_track_cli(run):
    from typer.testing import CliRunner

    import bertology.cli  # noqa: F401
    from bertology.cli.app import app

    result = CliRunner().invoke(app, ["track", str(run[0]), "--analyses", "attention_change", "--max-examples", "8"])
    assert result.exit_code == 0, result.output
    assert "tracked 2 checkpoints" in result.output
    assert "track_attention_change.parquet" in result.output and "[2, 3]" in result.output
    assert "track_representation_similarity" not in result.output


def test_track_refuses_a_run_with_removed_layers(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "manifest.json").write_text(json.dumps({"kind": "finetune", "config": {"drop_layers": [2]}}))
    with pytest.raises(BertologyError, match="fewer layers"):
        track(tmp_path / "r")
