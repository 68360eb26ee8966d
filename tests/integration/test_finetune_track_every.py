"""``bertology finetune --track-every N``: the Trainer callback's tracker driven by bertology's own loop.

Tiny BERT with dropout on (a disturbed random state would change training), CPU, a few steps: the tracking
tables have rows at the expected steps, the trained weights are ``torch.equal`` to a run without tracking
and the run's fingerprint is unchanged, the flag works from the command line, and a run killed after a
checkpoint resumes with its tracking rows.
"""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from bertology.config import FinetuneConfig  # noqa: E402
from bertology.data.corpus import Corpus  # noqa: E402
from bertology.errors import BertologyError  # noqa: E402
from bertology.integrations.tracker import finetune_tracker  # noqa: E402
from bertology.results import read_table  # noqa: E402
from bertology.testing import TINY_WORDS, save_tiny_bert  # noqa: E402
from bertology.training.run import finetune_to_dir, run_fingerprint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FILLER = [w for w in TINY_WORDS if w not in {"good", "bad"}]


def polarity(n: int, seed: int = 0) -> Corpus:
    rng = random.Random(seed)
    texts = [" ".join([("good" if i % 2 == 0 else "bad"), *rng.sample(FILLER, 2)]) for i in range(n)]
    return Corpus.from_list(texts, labels=["pos" if i % 2 == 0 else "neg" for i in range(n)], name="polarity")


def config(model, out, **overrides) -> FinetuneConfig:
    params = dict(model=str(model), out=str(out), epochs=2, batch_size=4, learning_rate=5e-3, warmup_ratio=0.0, seed=0)
    return FinetuneConfig(**{**params, **overrides})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "m", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """The same run with --track-every 2 and without (16 examples / batch 4 = 4 steps per epoch, 8 in all)."""
    root = tmp_path_factory.mktemp("runs")
    train, held = polarity(16), polarity(6, seed=5)
    tracked = finetune_to_dir(config(tiny, root / "tracked", track_every=2), train, held, tracker=finetune_tracker)
    plain = finetune_to_dir(config(tiny, root / "plain"), train, held)
    return dict(tracked=tracked, plain=plain, root=root, train=train, held=held)


def test_tracking_tables_have_rows_at_the_expected_steps(runs):
    folder = runs["tracked"].out / "tracking"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["kind"], manifest["status"]) == ("track", "complete")
    assert manifest["source"] == "bertology finetune --track-every"
    rs = read_table(folder, "track_representation_similarity")
    cka = rs[(rs.layer_base == rs.layer_tuned) & (rs.metric == "cka_linear")]
    # every 2 steps, step 0 (the base: CKA 1) and the evaluations at each epoch end (4, 8)
    assert sorted(cka.step.unique()) == [0, 2, 4, 6, 8]
    assert all(sorted(cka[cka.step == s].layer_base) == [0, 1, 2] for s in (0, 2, 4, 6, 8))
    assert cka[cka.step == 0].value.to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert (cka[cka.step == 8].value < 1 - 1e-6).any()  # the model moved away from its base
    ac = read_table(folder, "track_attention_change")
    assert sorted(ac.step.unique()) == [0, 2, 4, 6, 8]
    grads = read_table(folder, "track_gradient_norms")
    assert sorted(grads.step.unique()) == list(range(1, 9))  # every step
    layers = grads[grads.group == "layer"]
    assert all(sorted(layers[layers.step == s].layer) == [1, 2] for s in range(1, 9))
    assert (grads[grads.group == "total"].value > 0).all()
    # the fine-tuning run's manifest says what was tracked and where
    run = json.loads((runs["tracked"].out / "manifest.json").read_text())
    assert run["result"]["tracking"]["steps"] == [0, 2, 4, 6, 8]
    assert run["summary"]["tracking"]["folder"] == str(folder)
    assert run["settings"]["finetune"]["track_every"]["changes_numbers"] is False


def test_tracking_does_not_change_the_trained_weights_or_the_fingerprint(runs):
    a = load_file(str(runs["tracked"].model_dir / "model.safetensors"))
    b = load_file(str(runs["plain"].model_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert runs["tracked"].table["value"].tolist() == runs["plain"].table["value"].tolist()
    tracked, plain = config("m", "x", track_every=2, track_examples=8), config("m", "x")
    assert run_fingerprint(tracked, runs["train"], runs["held"]) == run_fingerprint(plain, runs["train"], runs["held"])
    assert not (runs["plain"].out / "tracking").exists()


def test_a_finished_run_without_tracking_is_trained_again_to_track_it(runs, tiny):
    """Same fingerprint, but the finished run did not track: it is trained again (the same weights), now tracked."""
    again = finetune_to_dir(config(tiny, runs["plain"].out, track_every=4), runs["train"], runs["held"],
                            tracker=finetune_tracker)
    assert not again.reused
    assert sorted(read_table(again.out / "tracking", "track_representation_similarity").step.unique()) == [0, 4, 8]
    same = finetune_to_dir(config(tiny, runs["plain"].out, track_every=4), runs["train"], runs["held"],
                           tracker=finetune_tracker)
    assert same.reused  # tracked as asked: reused


def test_an_interrupted_tracked_run_resumes_and_keeps_its_rows(runs, tiny, tmp_path):
    cfg = config(tiny, tmp_path / "cut", track_every=2, save_every=4)

    def stop(step: int) -> None:
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune_to_dir(cfg, runs["train"], runs["held"], tracker=finetune_tracker, on_step=stop)
    folder = tmp_path / "cut" / "tracking"
    assert json.loads((folder / "manifest.json").read_text())["status"] == "running"  # left as it was, released
    assert sorted(read_table(folder, "track_representation_similarity").step.unique()) == [0, 2, 4, 6]
    run = finetune_to_dir(cfg, runs["train"], runs["held"], tracker=finetune_tracker)
    assert json.loads((run.out / "manifest.json").read_text())["summary"]["resumed_from_step"] == 4
    rs = read_table(folder, "track_representation_similarity")
    assert sorted(rs.step.unique()) == [0, 2, 4, 6, 8]
    assert not rs.duplicated(["step", "layer_base", "layer_tuned", "metric"]).any()
    grads = read_table(folder, "track_gradient_norms")
    assert sorted(grads.step) == sorted(read_table(runs["tracked"].out / "tracking", "track_gradient_norms").step)
    a = load_file(str(runs["tracked"].model_dir / "model.safetensors"))
    b = load_file(str(run.model_dir / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the resumed rows equal the uninterrupted run's (same base, same replayed steps)
    full = read_table(runs["tracked"].out / "tracking", "track_representation_similarity")
    key = ["step", "layer_base", "layer_tuned", "metric"]
    merged = pd.merge(full, rs, on=key, suffixes=("_full", "_cut"))
    assert len(merged) == len(full)
    assert merged.value_full.to_numpy() == pytest.approx(merged.value_cut.to_numpy(), abs=1e-6)


def test_gradient_norms_are_written_at_checkpoints_not_every_step(runs, tiny, tmp_path, monkeypatch):
    """Rewriting the growing gradient table every step made long runs' I/O quadratic: it is written with the
    analyses' tables, at each checkpoint (so a process killed after one has every row up to it) and at the end."""
    from bertology.integrations.folder import TrackWriter

    writes: list[str] = []
    write = TrackWriter.write
    monkeypatch.setattr(TrackWriter, "write", lambda self, name, table: (writes.append(name), write(self, name, table)))
    folder = tmp_path / "ck" / "tracking"
    on_disk: dict[int, list[int]] = {}

    def look(step: int) -> None:  # after the step's evaluation and checkpoint
        path = folder / "tables" / "track_gradient_norms.parquet"
        on_disk[step] = sorted(read_table(folder, "track_gradient_norms").step.unique()) if path.exists() else []

    cfg = config(tiny, tmp_path / "ck", track_every=4, save_every=3)
    finetune_to_dir(cfg, runs["train"], runs["held"], tracker=finetune_tracker, on_step=look)
    assert on_disk[1] == on_disk[2] == []  # steps 1 and 2: no event to write at
    assert on_disk[3] == [1, 2, 3] and on_disk[6] == list(range(1, 7))  # checkpoints at 3 and 6
    assert on_disk[4] == [1, 2, 3, 4]  # written with the analyses at step 4
    assert on_disk[5] == [1, 2, 3, 4]  # not rewritten for step 5 alone
    # 8 steps: written at the checkpoint of 3, the analyses of 4, the checkpoint of 6, the analyses (and the final
    # checkpoint) of 8 and the end: never more than once per event, against 8 times before
    assert 3 <= writes.count("gradient_norms") <= 5
    assert sorted(read_table(folder, "track_gradient_norms").step.unique()) == list(range(1, 9))


def test_track_every_without_a_tracker_is_one_clear_error(tiny, tmp_path):
    with pytest.raises(BertologyError, match="track_every"):
        finetune_to_dir(config(tiny, tmp_path / "x", track_every=2), polarity(8), polarity(4, seed=5))
    with pytest.raises(BertologyError, match="--track-every"):
        config(tiny, tmp_path / "y", track_every=-1)
    with pytest.raises(BertologyError, match="--track-analyses"):
        config(tiny, tmp_path / "y", track_analyses=("probe",))


def test_the_flag_from_the_command_line(tiny, tmp_path):
    import bertology.cli  # noqa: F401  (registers every command)
    from typer.testing import CliRunner

    from bertology.cli.app import app

    data = tmp_path / "train.tsv"
    corpus = polarity(12)
    pd.DataFrame({"sentence": [e.text for e in corpus], "label": [e.label for e in corpus]}).to_csv(data, sep="\t", index=False)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["finetune", "--model", str(tiny), "--data", str(data), "--epochs", "1",
                                      "--batch-size", "3", "--max-length", "16", "--track-every", "1",
                                      "--track-analyses", "representation_similarity", "--track-examples", "4",
                                      "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    assert "tracked against the base every 1 steps" in result.output
    tables = json.loads((out / "tracking" / "manifest.json").read_text())["tables"]
    assert tables == ["track_gradient_norms", "track_representation_similarity"]
    rs = read_table(out / "tracking", "track_representation_similarity")
    assert sorted(rs.step.unique()) == list(range(0, 4))  # 12 x 0.8 = 9 training examples / 3 = 3 steps
    help_text = CliRunner().invoke(app, ["finetune", "--help"]).output
    assert "--track-every" in help_text and "--track-examples" in help_text


def test_the_report_and_the_notebook_api_draw_the_tracked_tables(runs):
    """``bertology report RUN/tracking`` has the tracking section with one figure per tracked table, and
    ``Run.plot`` draws the same figures."""
    from bertology.api import load_run
    from bertology.report.render import render_report

    folder = runs["tracked"].out / "tracking"
    html = render_report(folder).read_text(encoding="utf-8")
    section = html[html.index('<section id="tracking"'):]
    section = section[:section.index("</section>")]
    for name in ("track_representation_similarity", "track_attention_change", "track_gradient_norms"):
        assert f'id="fig-{name}"' in section, name
    assert "Steps tracked" in section
    run = load_run(folder)
    assert "track_representation_similarity" in run.figures()
    assert run.plot("track_gradient_norms").axes  # a matplotlib Figure with panels
