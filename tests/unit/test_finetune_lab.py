"""The fine-tuning lab on tiny models: layer removal, freezing, excluded words and slices, gradient
accumulation, early stopping, checkpoints and exact resumption."""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file

from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, save_tiny_bert
from bertology.training.data import exclude_examples, mention_mask, parse_word_list, word_pattern
from bertology.training.finetune import finetune
from bertology.training.loop import checkpoints
from bertology.training.run import finetune_to_dir
from bertology.training.surgery import drop_layers, freeze

FILLER = [w for w in TINY_WORDS if w not in {"good", "bad", "woman", "girl", "not", "no", "never"}]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def polarity(n: int = 40, seed: int = 0, n_filler: int = 2, fixed_length: bool = False) -> Corpus:
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        words = rng.sample(FILLER, n_filler)
        words.insert(0 if fixed_length else rng.randrange(n_filler + 1), "good" if label == "pos" else "bad")
        texts.append(" ".join(words))
        labels.append(label)
    return Corpus.from_list(texts, labels=labels)


def config(model, out, **overrides) -> FinetuneConfig:
    params = dict(model=str(model), out=str(out), epochs=2, batch_size=4, learning_rate=2e-3, warmup_ratio=0.0, seed=0)
    params.update(overrides)
    return FinetuneConfig(**params)


def state_of(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------------------------- layers


def test_dropped_layers_reload_with_the_right_depth_and_the_kept_weights(tmp_path):
    base = save_tiny_bert(tmp_path / "m3", num_hidden_layers=3)
    original = load_model(base).model.state_dict()
    # drop the middle block, freeze everything that is left of the encoder: the saved blocks must be
    # exactly the original blocks 1 and 3, renumbered 0 and 1; only the new head trains
    cfg = config(base, tmp_path / "run", drop_layers=(2,), freeze_layers=2, freeze_embeddings=True, epochs=1)
    result = finetune(cfg, polarity(24))
    assert result.details["layers"] == {"before": 3, "dropped": [2], "kept": [1, 3], "after": 2}

    reloaded = load_model(result.model_dir)
    assert reloaded.model.config.num_hidden_layers == 2
    assert len(reloaded.encoder.encoder.layer) == 2
    saved = reloaded.model.state_dict()
    assert not any(k.startswith("bert.encoder.layer.2.") for k in saved)
    for new, old in ((0, 0), (1, 2)):
        for name, tensor in original.items():
            prefix = f"encoder.layer.{old}."
            if name.startswith(prefix):
                assert torch.equal(saved["bert." + name.replace(prefix, f"encoder.layer.{new}.")], tensor), name
    # the reloaded model computes what the trained one predicted
    preds = result.predictions
    enc = reloaded.tokenizer(list(preds["text"]), padding=True, return_tensors="pt")
    with torch.inference_mode():
        ids = reloaded.model(**enc).logits.argmax(-1).tolist()
    assert [reloaded.model.config.id2label[i] for i in ids] == list(preds["predicted"])


def test_drop_layers_in_place_and_its_errors(tmp_path):
    model = load_model(save_tiny_bert(tmp_path / "m", num_hidden_layers=4)).model
    blocks = [b for b in model.encoder.layer]
    assert drop_layers(model, [4, 2]) == (1, 3)
    assert list(model.encoder.layer) == [blocks[0], blocks[2]]
    assert model.config.num_hidden_layers == 2
    assert [b.attention.self.layer_idx for b in model.encoder.layer] == [0, 1]
    out = model(input_ids=torch.tensor([[2, 20, 21, 3]]), output_hidden_states=True)
    assert len(out.hidden_states) == 3
    with pytest.raises(BertologyError, match="layers 1..2"):
        drop_layers(model, [3])
    with pytest.raises(BertologyError, match="keep at least one"):
        drop_layers(model, [1, 2])


# ---------------------------------------------------------------------------------------------- freezing


def test_frozen_parameters_stay_bit_identical(tmp_path):
    base = save_tiny_bert(tmp_path / "m")
    before = load_model(base).model.state_dict()
    result = finetune(config(base, tmp_path / "run", freeze_layers=1, freeze_embeddings=True), polarity(24))
    after = state_of(result.model_dir)
    frozen = [n for n in before if n.startswith(("embeddings.", "encoder.layer.0."))]
    trained = [n for n in before if n.startswith("encoder.layer.1.")]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(after["bert." + name], before[name]), name
    assert sum(not torch.equal(after["bert." + n], before[n]) for n in trained) >= len(trained) // 2
    params = result.details["frozen"]["parameters"]
    assert params["frozen"] == sum(before[n].numel() for n in frozen)
    assert params["trainable"] + params["frozen"] == params["total"]


def test_freeze_errors(tmp_path):
    model = load_model(save_tiny_bert(tmp_path / "m")).model
    with pytest.raises(BertologyError, match="has 2 layers"):
        freeze(model, 3)
    names = freeze(model, 2, embeddings=True)
    assert all(n.startswith(("embeddings.", "encoder.")) for n in names)


# ---------------------------------------------------------------------------------------------- excluded words


def test_word_matching_is_whole_word_case_insensitive_and_covers_both_texts(tmp_path):
    words = parse_word_list("Women, woman,girl,,woman")
    assert words == ("women", "woman", "girl")
    pat = word_pattern(words)
    corpus = Corpus([
        Example("A Woman sits ."),                               # case
        Example("the man reads", text_pair="a GIRL runs"),      # second text of a pair
        Example("womanhood and superwoman"),                     # not whole words
        Example("the woman's bag"),                              # apostrophe ends a word
        Example("girls play", text_pair="boys play"),            # plural not listed
        Example("women-only event"),                             # hyphen ends a word
    ])
    assert mention_mask(corpus, words).tolist() == [True, True, False, True, False, True]
    assert pat.search("WOMEN") and not pat.search("girlfriend")
    kept, info = exclude_examples(corpus, words)
    assert [ex.text for ex in kept] == ["womanhood and superwoman", "girls play"]
    assert (info["n_before"], info["n_dropped"], info["n_after"]) == (6, 4, 2)
    assert info["dropped_per_word"] == {"women": 1, "woman": 2, "girl": 1}
    listed = tmp_path / "words.txt"
    listed.write_text("# bias words\nwomen woman\ngirl,girls\n")
    assert parse_word_list(f"@{listed}") == ("women", "woman", "girl", "girls")
    with pytest.raises(BertologyError, match="does not exist"):
        parse_word_list(f"@{tmp_path / 'missing.txt'}")


def test_excluded_words_drop_training_examples_and_slice_the_eval_set(tmp_path):
    base = save_tiny_bert(tmp_path / "m")

    def make(n, seed):
        r = random.Random(seed)
        texts, pairs, labels = [], [], []
        for i in range(n):
            lab = "pos" if i % 2 == 0 else "neg"
            extra = "woman" if i % 3 == 0 else ("Girl" if i % 5 == 0 else r.choice(FILLER))
            texts.append(f"{'good' if lab == 'pos' else 'bad'} {r.choice(FILLER)}")
            pairs.append(f"{extra} {r.choice(FILLER)}")
            labels.append(lab)
        return Corpus.from_list(texts, pairs=pairs, labels=labels)
    train, held = make(30, 1), make(20, 2)
    expected_drop = sum(1 for i in range(30) if i % 3 == 0 or i % 5 == 0)
    result = finetune(config(base, tmp_path / "run", exclude_words=("woman", "girl"), epochs=1), train, held)
    ex = result.details["excluded_words"]
    assert (ex["n_before"], ex["n_dropped"], ex["n_after"]) == (30, expected_drop, 30 - expected_drop)
    assert result.n_train == 30 - expected_drop
    with_n = sum(1 for i in range(20) if i % 3 == 0 or i % 5 == 0)
    assert (ex["eval_with_words"], ex["eval_without_words"]) == (with_n, 20 - with_n)

    table = result.table
    assert "slice" in table.columns
    last = table.query(f"split == 'eval' and step == {table.step.max()}")
    assert set(last["slice"]) == {"all", "with_words", "without_words"}
    n = last.query("metric == 'n_eval'").set_index("slice")["value"]
    assert (n["with_words"], n["without_words"]) == (with_n, 20 - with_n)
    # slice accuracies agree with the saved predictions
    preds = result.predictions
    for name in ("with_words", "without_words"):
        acc = last.query(f"metric == 'accuracy' and slice == '{name}'")["value"].item()
        assert acc == pytest.approx(preds.loc[preds["slice"] == name, "correct"].mean())
        assert result.metrics["slices"][name]["accuracy"] == pytest.approx(acc)
    with pytest.raises(BertologyError, match="nothing is left"):
        finetune(config(base, tmp_path / "x", exclude_words=("woman",)),
                 Corpus.from_list(["the woman"] * 4, labels=["a", "b"] * 2), Corpus.from_list(["x"], labels=["a"]))


# ---------------------------------------------------------------------------------------------- hygiene


def test_accumulated_micro_batch_gradients_equal_the_big_batch_gradient(tmp_path):
    """Three micro-batches of 2 give the gradient of one batch of 6, to float32 rounding.

    Compared on the gradients themselves: after a few Adam steps the weights are not a fair test, since
    Adam divides by the root of the second moment and so magnifies rounding in near-zero gradients.
    """
    import numpy as np
    from transformers import BertForSequenceClassification

    from bertology.data.encode import encode_corpus
    from bertology.testing import tiny_tokenizer
    from bertology.tasks.catalog import get_task
    from bertology.training.finetune import HeadTask
    from bertology.training.heads import Batching
    from bertology.training.loop import accumulate_gradients

    base = save_tiny_bert(tmp_path / "m")  # dropout 0: the same function whatever the batching
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2, attn_implementation="eager").train()
    tokenizer = tiny_tokenizer()
    corpus = polarity(6, fixed_length=True)  # one length: no padding in either batching
    enc = encode_corpus(corpus, tokenizer, max_length=32, overlong="truncate")
    y = np.array([int(ex.label == "pos") for ex in corpus], dtype=np.int64)
    task = HeadTask(get_task("classification"), tokenizer, (enc, y), (enc, y), Batching(6, 0, True, torch.device("cpu")))

    def gradients(micro: int) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, task, list(range(6)), micro)
        return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_small, small = gradients(2)
    loss_big, big = gradients(6)
    assert loss_small == pytest.approx(loss_big, rel=1e-6)
    assert small.keys() == big.keys() and len(big) > 10
    # float32 sums taken in another order: relative error of order 1e-6 per term over a few hundred terms,
    # so 1e-4 relative, and 1e-5 of the largest gradient for components that nearly cancel
    scale = max(float(g.abs().max()) for g in big.values())
    for name in big:
        torch.testing.assert_close(small[name], big[name], rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_gradient_accumulation_takes_one_optimiser_step_per_effective_batch(tmp_path):
    base = save_tiny_bert(tmp_path / "m")
    corpus = polarity(24, fixed_length=True)
    held = polarity(6, seed=9)
    small = finetune(config(base, tmp_path / "acc", batch_size=2, grad_accum=3, epochs=1, learning_rate=1e-3), corpus, held)
    big = finetune(config(base, tmp_path / "big", batch_size=6, grad_accum=1, epochs=1, learning_rate=1e-3), corpus, held)
    assert small.details["steps"] == big.details["steps"] == 4
    a = state_of(small.model_dir)
    base_state = load_model(base).model.state_dict()
    assert not torch.equal(a["bert.encoder.layer.1.output.dense.weight"], base_state["encoder.layer.1.output.dense.weight"])
    # and not the same as 3 micro-batches taken as separate steps
    steps = finetune(config(base, tmp_path / "sep", batch_size=2, epochs=1, learning_rate=1e-3), corpus, held)
    assert steps.details["steps"] == 12


def _interrupt_at(step_to_stop: int):
    def on_step(step: int) -> None:
        if step == step_to_stop:
            raise KeyboardInterrupt
    return on_step


def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(tmp_path):
    # dropout on: the RNG state must be restored too, not only the weights and the optimiser
    base = save_tiny_bert(tmp_path / "m", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    corpus, held = polarity(20), polarity(6, seed=5)
    common = dict(epochs=2, save_every=2, grad_accum=2, batch_size=2, warmup_ratio=0.2)
    full = finetune(config(base, tmp_path / "full", **common), corpus, held)
    assert full.details["steps"] == 10

    cfg = config(base, tmp_path / "cut", **common)
    with pytest.raises(KeyboardInterrupt):
        finetune_to_dir(cfg, corpus, held, on_step=_interrupt_at(5))
    manifest = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["error"].startswith("KeyboardInterrupt")
    assert [s for s, _ in checkpoints(tmp_path / "cut" / "checkpoints")] == [2, 4]
    assert not (tmp_path / "cut" / "model").exists()

    run = finetune_to_dir(cfg, corpus, held)
    manifest = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert manifest["status"] == "done"
    assert manifest["summary"]["resumed_from_step"] == 4
    a, b = state_of(full.model_dir), state_of(run.model_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    cols = ["step", "split", "metric", "value", "slice"]
    assert full.table[cols].equals(run.table[cols])
    # checkpoints along the way are loadable model folders
    steps = [s for s, _ in checkpoints(tmp_path / "cut" / "checkpoints")]
    assert steps == [2, 4, 6, 8, 10]
    assert load_model(tmp_path / "cut" / "checkpoints" / "step-6").is_classifier

    # a different seed in the same folder does not resume from these checkpoints
    other = finetune(config(base, tmp_path / "cut", seed=1, **common), corpus, held)
    assert other.details["checkpoints"]["resumed_from_step"] is None


def test_early_stopping_restores_the_best_weights(tmp_path):
    base = save_tiny_bert(tmp_path / "m")
    corpus, held = polarity(24), polarity(8, seed=4)
    # a learning rate too small to move accuracy: no evaluation after the first one improves on it
    cfg = config(base, tmp_path / "es", learning_rate=1e-9, epochs=3, eval_every=1, early_stopping=2, save_every=1)
    result = finetune(cfg, corpus, held)
    es = result.details["early_stopping"]
    assert es["stopped_early"] and es["best_step"] == 1
    assert result.details["steps_done"] == 3
    saved, best = state_of(result.model_dir), state_of(tmp_path / "es" / "checkpoints" / "step-1")
    for name in saved:
        assert torch.equal(saved[name], best[name]), name
    with pytest.raises(BertologyError, match="is not a metric of the classification task"):
        finetune(config(base, tmp_path / "bad", early_stopping=1, early_stopping_metric="bleu"), corpus, held)


def test_bad_settings_are_clear_errors(tmp_path):
    base = save_tiny_bert(tmp_path / "m")
    corpus = polarity(12)
    for field, value, match in (("grad_accum", 0, "grad_accum"), ("freeze_layers", -1, "freeze_layers"),
                                ("save_every", 0, "save_every"), ("drop_layers", (5,), "layers 1..2")):
        with pytest.raises(BertologyError, match=match):
            finetune(config(base, tmp_path / "x", **{field: value}), corpus)
    with pytest.raises(BertologyError, match=r"--objective \(objective\) must be one of supervised, contrastive, not 'regression'\."):
        finetune(config(base, tmp_path / "x", objective="regression"), corpus)
    assert not (tmp_path / "x" / "model").exists()


@pytest.mark.parametrize("name", ["objective", "task", "tag_column", "qa_split", "contrastive", "pooling"])
def test_the_library_refuses_a_setting_outside_its_choices_naming_it_and_its_flag(name, tmp_path):
    """The choices are checked by the library, so Python and the CLI give the same one-line error."""
    from bertology.training.common import flag

    with pytest.raises(BertologyError, match=f"^{flag(name)} \\({name}\\) must be one of .*, not 'bogus'\\.$"):
        finetune(config(tmp_path / "m", tmp_path / "x", **{name: "bogus"}), polarity(8))
    assert not (tmp_path / "x").exists()


def test_the_old_objective_name_is_the_same_run_and_contrastive_auto_is_decided_by_the_data(tmp_path):
    from bertology.training.common import resolve_config
    from bertology.training.run import run_fingerprint

    base = save_tiny_bert(tmp_path / "m")
    corpus = polarity(8)
    old, new = config(base, tmp_path / "x", objective="classification"), config(base, tmp_path / "x")
    assert resolve_config(old).objective == "supervised" == new.objective
    assert run_fingerprint(old, corpus) == run_fingerprint(new, corpus)
    pairs = Corpus.from_list(["a b", "c d"], labels=["entailment", "contradiction"], pairs=["b a", "d c"])
    simcse = config(base, tmp_path / "x", objective="contrastive")
    assert simcse.simcse.mode == "auto"
    assert resolve_config(simcse, pairs).simcse.mode == "supervised"
    assert resolve_config(simcse, corpus).simcse.mode == "unsupervised"


def test_read_data_chooses_the_reader_the_task_needs(tmp_path):
    from bertology.config import DataConfig
    from bertology.data.squad import SquadData
    from bertology.testing import squad_fixture
    from bertology.training.finetune import read_data

    path = tmp_path / "squad.json"
    path.write_text(json.dumps(squad_fixture("v2.0")))
    train, held = read_data(config("m", tmp_path / "x", task="qa", data=DataConfig(path=str(path))))
    assert isinstance(train, SquadData) and held is None
    with pytest.raises(BertologyError, match="pass --task qa"):
        read_data(config("m", tmp_path / "x", data=DataConfig(path=str(path))))


def test_slice_words_slice_the_eval_set_without_dropping_training_examples(tmp_path):
    base = save_tiny_bert(tmp_path / "m")
    train = Corpus.from_list(["good woman", "bad man", "good cat", "bad girl"] * 3, labels=["pos", "neg"] * 6)
    held = Corpus.from_list(["good woman", "bad dog", "the girl is good"], labels=["pos", "neg", "pos"])
    result = finetune(config(base, tmp_path / "s", slice_words=("woman", "girl"), epochs=1), train, held)
    assert result.n_train == 12 and result.details["excluded_words"] is None
    assert result.details["eval_slices"] == {"words": ["woman", "girl"], "with_words": 2, "without_words": 1}
    assert result.metrics["slices"]["with_words"]["n_eval"] == 2
    assert list(result.predictions["slice"]) == ["with_words", "without_words", "with_words"]


def test_a_model_that_does_not_beat_chance_is_said_to(tmp_path):
    import pandas as pd

    from bertology.training.run import chance_warnings

    def preds(labels, predicted):
        return pd.DataFrame({"label": labels, "predicted": predicted})

    constant = chance_warnings(preds(["pos", "neg"] * 10, ["pos"] * 20))
    assert len(constant) == 1 and "predicts one class for every eval example" in constant[0]
    assert "accuracy 0.500, 95% CI [0.299, 0.701], n=20; majority-class rate 0.500" in constant[0]
    noisy = chance_warnings(preds(["pos", "neg"] * 10, ["pos", "neg"] * 6 + ["neg", "pos"] * 4))  # 12 of 20
    assert len(noisy) == 1 and "is not shown to beat chance" in noisy[0]
    assert chance_warnings(preds(["pos", "neg"] * 20, ["pos", "neg"] * 20)) == []  # 40 of 40: above chance
    assert chance_warnings(None) == [] and chance_warnings(pd.DataFrame({"x": [1]})) == []
    # end to end: a learning rate too small to learn anything
    base = save_tiny_bert(tmp_path / "m")
    run = finetune_to_dir(config(base, tmp_path / "run", learning_rate=1e-9, epochs=1), polarity(16), polarity(8, seed=3))
    assert any(w.startswith("The fine-tuned model ") for w in run.warnings)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["warnings"] == run.warnings
