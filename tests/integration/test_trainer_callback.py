"""BertologyCallback in a real transformers Trainer (tiny BERT, CPU, a few steps).

Checked against independent answers: the trained weights equal a run without the callback (dropout on, so
a shifted random state would show); at step 0 the model is its base (loaded separately from disk), so CKA is
1 and attention change 0 at every layer; the gradient norms equal a hand backward pass on the same batch
(taken before the Trainer's clipping) and their total equals the Trainer's own ``grad_norm``; the scalars
are read back from TensorBoard's event file at the steps they were due (the gradient norms on the Trainer's
logging schedule); ``callback.tables`` names its tables as the run folder's files.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from bertology.errors import BertologyError  # noqa: E402
from bertology.integrations import BertologyCallback  # noqa: E402
from bertology.models.loading import load_model  # noqa: E402
from bertology.testing import save_tiny_bert  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the movie was good", "a bad film", "i liked it a lot", "terrible acting and plot", "great fun",
         "boring", "the plot was clever", "not worth it"]
LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


def _dataset(tokenizer) -> list[dict]:
    enc = tokenizer(TEXTS, padding=True)
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": LABELS[i]}
            for i in range(len(TEXTS))]


def _train(folder: Path, out: Path, *, steps: int, batch: int, callback: dict | None = None, logging_steps: int = 1,
           **args):
    """Train the tiny classifier in ``folder`` for ``steps`` steps; return (model, trainer, callback)."""
    loaded = load_model(folder)
    model, tok = loaded.model, loaded.tokenizer
    ds = _dataset(tok)
    targs = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=batch,
                              logging_steps=logging_steps, report_to=["tensorboard"], use_cpu=True, seed=0,
                              save_strategy="no", learning_rate=1e-2, disable_tqdm=True, **args)
    trainer = Trainer(model=model, args=targs, train_dataset=ds, processing_class=tok)
    cb = BertologyCallback(TEXTS, **callback).attach(trainer) if callback is not None else None
    trainer.train()
    return model, trainer, cb


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny BERT classifier with dropout on (so a disturbed random state would change training)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "model", classifier=True, hidden_dropout_prob=0.1,
                          attention_probs_dropout_prob=0.1)


@pytest.fixture(scope="module")
def with_and_without(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    cb_settings = dict(out=root / "track", base=str(tiny), every_n_steps=2, log_to_trainer=True,
                       analyses=("representation_similarity", "attention_change"))
    model, trainer, cb = _train(tiny, root / "with", steps=4, batch=4, callback=cb_settings)
    plain, plain_trainer, _ = _train(tiny, root / "without", steps=4, batch=4)
    return dict(model=model, trainer=trainer, cb=cb, plain=plain, plain_trainer=plain_trainer, root=root)


def test_training_is_bit_identical_with_and_without_the_callback(with_and_without):
    a, b = with_and_without["model"].state_dict(), with_and_without["plain"].state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h]  # noqa: E731
    assert losses(with_and_without["trainer"]) == losses(with_and_without["plain_trainer"])
    assert len(losses(with_and_without["plain_trainer"])) == 4


def test_at_step_zero_the_model_is_its_base(with_and_without):
    tables = with_and_without["cb"].tables
    rs = tables["track_representation_similarity"]
    diag = rs[(rs.step == 0) & (rs.layer_base == rs.layer_tuned) & (rs.metric == "cka_linear")]
    assert sorted(diag.layer_base) == [0, 1, 2]
    assert diag.value.to_numpy() == pytest.approx(1.0, abs=1e-6)
    ac = tables["track_attention_change"]
    start = ac[ac.step == 0]
    assert len(start) == 2 * 4  # layers x heads
    assert start.cosine.to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert start.js_divergence.to_numpy() == pytest.approx(0.0, abs=1e-6)
    later = rs[(rs.step == 4) & (rs.layer_base == rs.layer_tuned) & (rs.metric == "cka_linear")]
    assert (later.value < 0.999).all()  # learning rate 1e-2: the model has moved away from its base


def _scalars(logdir: Path) -> EventAccumulator:
    events = list(logdir.rglob("events.out.tfevents.*"))
    assert len(events) == 1, events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    return acc


def test_scalars_reach_tensorboard_at_the_expected_steps(with_and_without):
    acc = _scalars(with_and_without["root"] / "with")
    tags = set(acc.Tags()["scalars"])
    steps = lambda tag: [e.step for e in acc.Scalars(tag)]  # noqa: E731
    for layer in (0, 1, 2):
        assert steps(f"train/bertology/cka_linear/layer_{layer}") == [0, 2, 4]
    assert steps("train/bertology/attention_cosine/layer_2") == [0, 2, 4]
    for group in ("layer_0", "layer_1", "layer_2", "other", "total"):
        assert steps(f"train/bertology/grad_norm/{group}") == [1, 2, 3, 4]
    assert steps("train/loss") == [1, 2, 3, 4]  # the Trainer's own lines are still logged
    assert acc.Scalars("train/bertology/cka_linear/layer_1")[0].value == pytest.approx(1.0, abs=1e-6)
    # the total gradient norm is the Trainer's own grad_norm (before clipping), step by step
    ours = [e.value for e in acc.Scalars("train/bertology/grad_norm/total")]
    theirs = [e.value for e in acc.Scalars("train/grad_norm")]
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert not any(t.startswith("train/bertology") for t in _scalars(with_and_without["root"] / "without").Tags()["scalars"])
    assert "train/bertology/anisotropy/layer_1" not in tags  # geometry was not asked for


def test_the_run_folder_is_a_track_run_the_report_renders(with_and_without):
    from bertology.report.render import render_report
    from bertology.results import read_table
    from bertology.viz.track import track_figures

    run = with_and_without["root"] / "track"
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["kind"], manifest["status"]) == ("track", "complete")
    names = ["track_attention_change", "track_gradient_norms", "track_representation_similarity"]
    assert manifest["tables"] == names
    tables = {n.removeprefix("track_"): read_table(run, n) for n in names}
    assert sorted(tables["representation_similarity"].step.unique()) == [0, 2, 4]
    assert sorted(track_figures(tables)) == sorted(tables)
    assert sorted(p.name for p in (run / "figures").glob("*.svg")) == [f"{n}.svg" for n in names]
    html = render_report(run).read_text()
    assert all(n in html for n in names)
    # the callback's tables are the folder's, under the same names
    in_memory = with_and_without["cb"].tables
    assert sorted(in_memory) == names
    for name in names:
        pd.testing.assert_frame_equal(in_memory[name].reset_index(drop=True), read_table(run, name), check_dtype=False)


def test_gradient_norms_are_logged_on_the_trainers_logging_schedule(tiny, tmp_path):
    """logging_steps=2 over 5 steps: the Trainer logs at 2 and 4, and so do the norms (of those steps), while the
    table keeps every step and the analyses log at their own steps (0 and every 3)."""
    model, trainer, cb = _train(tiny, tmp_path / "out", steps=5, batch=4, logging_steps=2,
                                callback=dict(every_n_steps=3, log_to_trainer=True, analyses=("representation_similarity",)))
    acc = _scalars(tmp_path / "out")
    steps = lambda tag: [e.step for e in acc.Scalars(tag)]  # noqa: E731
    assert steps("train/loss") == [2, 4]
    for group in ("layer_1", "layer_2", "other", "total"):
        assert steps(f"train/bertology/grad_norm/{group}") == [2, 4]
    ours = [e.value for e in acc.Scalars("train/bertology/grad_norm/total")]
    theirs = [e.value for e in acc.Scalars("train/grad_norm")]
    assert ours == pytest.approx(theirs, rel=1e-5)  # the norms of the step logged, not of another one
    assert steps("train/bertology/cka_linear/layer_1") == [0, 3]
    grads = cb.tables["track_gradient_norms"]
    assert sorted(grads.step.unique()) == [1, 2, 3, 4, 5]  # recorded every step, logged every logging step
    logged = [h["step"] for h in trainer.state.log_history if "bertology/grad_norm/total" in h]
    assert logged == [2, 4]
    # the Trainer's own loss lines are not disturbed by the callback's logs
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [2, 4]


def test_gradient_norms_equal_a_hand_backward_pass(tmp_path):
    """One step on the whole probe batch, dropout off, heavy clipping: the norms are the raw ones of a hand pass."""
    folder = save_tiny_bert(tmp_path / "model", classifier=True, seed=3)
    _, _, cb = _train(folder, tmp_path / "out", steps=1, batch=len(TEXTS), max_grad_norm=1e-4,
                      callback=dict(at_start=False, at_evaluate=False))
    ours = cb.tables["track_gradient_norms"].set_index("group")
    loaded = load_model(folder)
    model = loaded.model.train()
    batch = {k: torch.tensor([ex[k] for ex in _dataset(loaded.tokenizer)]) for k in ("input_ids", "attention_mask", "labels")}
    model(**batch).loss.backward()
    squares: dict[str, float] = {}
    for name, p in model.named_parameters():
        if name.startswith("bert.embeddings."):
            key = "layer_0"
        elif name.startswith("bert.encoder.layer."):
            key = f"layer_{int(name.split('.')[3]) + 1}"
        else:
            key = "other"
        squares[key] = squares.get(key, 0.0) + float(p.grad.double().pow(2).sum())
    layers = ours[ours.index == "layer"].set_index("layer")["value"]
    for layer in (1, 2):
        assert layers[layer] == pytest.approx(math.sqrt(squares[f"layer_{layer}"]), rel=1e-5)
    assert ours.loc["embeddings", "value"] == pytest.approx(math.sqrt(squares["layer_0"]), rel=1e-5)
    assert ours.loc["other", "value"] == pytest.approx(math.sqrt(squares["other"]), rel=1e-5)
    assert ours.loc["total", "value"] == pytest.approx(math.sqrt(sum(squares.values())), rel=1e-5)
    assert ours.loc["total", "value"] > 10 * 1e-4  # far above max_grad_norm: these are the norms before clipping
    assert set(cb.tables) == {"track_gradient_norms"}  # no analysis was due


def test_bad_settings_and_a_missing_trainer_get_one_clear_line(tiny, tmp_path):
    with pytest.raises(BertologyError, match="analyses"):
        BertologyCallback(TEXTS, analyses=("probe",))
    with pytest.raises(BertologyError, match="every_n_steps"):
        BertologyCallback(TEXTS, every_n_steps=-1)
    with pytest.raises(BertologyError, match="has no setting"):
        BertologyCallback(TEXTS, every_n_step=2)
    loaded = load_model(tiny)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=loaded.model, args=args, train_dataset=_dataset(loaded.tokenizer),
                      processing_class=loaded.tokenizer, callbacks=[BertologyCallback(TEXTS, log_to_trainer=True)])
    with pytest.raises(BertologyError, match="attach"):
        trainer.train()
