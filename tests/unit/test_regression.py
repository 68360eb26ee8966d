"""Regression as a task (issue 15): choosing it, its targets and errors, and every scoring experiment on a
regressor — the ablation table against a direct recomputation with scipy, cached == naive sweep, head
importance from the MSE gradient, the degenerate check."""
import numpy as np
import pytest
import scipy.stats as st
import torch

from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.ablation import HeadScoring, SweepPlan, run_ablation, summary
from bertology.experiments.head_importance import PruningPlan, run_head_importance
from bertology.models.loading import load_model
from bertology.tasks.catalog import choose_task, get_task, task_of_model
from bertology.testing import SENTENCES, save_tiny_bert


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    folder = save_tiny_bert(tmp_path_factory.mktemp("reg"), classifier=True, num_labels=1,
                            problem_type="regression", initializer_range=0.3)
    return load_model(folder)


@pytest.fixture(scope="module")
def data(reg):
    rng = np.random.default_rng(0)
    # distinct inputs (each sentence and its words reversed): duplicates would tie in one forward and not in
    # another (padding changes float32 rounding), and Spearman would rank them differently
    texts = SENTENCES + [" ".join(reversed(s.split())) for s in SENTENCES]
    scores = [f"{v:.3f}" for v in rng.uniform(0, 5, len(texts))]
    corpus = Corpus.from_list(texts, labels=scores)
    return corpus, encode_corpus(corpus, reg.tokenizer)


@pytest.mark.parametrize("labels,task", [
    (["0.000", "3.800", "5.000"], "regression"),  # GLUE STS-B
    ([str(i) for i in range(30)], "regression"),  # many whole numbers
    (["1", "2", "3", "4", "5"], "classification"),  # a star rating stays a class
    (["-1", "1"], "classification"),
    (["entailment", "neutral", "1.5"], "classification"),
])
def test_auto_chooses_regression_for_decimal_or_many_numeric_labels(labels, task):
    chosen, why = choose_task("auto", labels)
    assert chosen.name == task and why.startswith("auto:")
    assert choose_task("regression", ["a"])[0].name == "regression"  # an explicit choice is kept


def test_regression_targets_name_the_value_that_is_not_a_number(reg, tmp_path):
    task = task_of_model(reg.model)
    assert task.name == "regression"
    bad = Corpus.from_list(["a", "b"], labels=["1.5", "high"])
    with pytest.raises(BertologyError, match=r"label 'high' \(example 2\), which is not a number"):
        task.targets(bad, reg.model)
    with pytest.raises(BertologyError, match="no regression head"):
        task.check_model(load_model(save_tiny_bert(tmp_path, classifier=True, num_labels=2)).model)


def _direct_predictions(model, encoded) -> np.ndarray:
    """The regressor's outputs one example at a time, with no bertology code in between."""
    out = np.empty(len(encoded.items))
    with torch.inference_mode():
        for i, it in enumerate(encoded.items):
            ids = torch.from_numpy(it.input_ids)[None]
            out[it.index] = model(input_ids=ids, token_type_ids=torch.from_numpy(it.token_type_ids)[None]).logits[0, 0].double()
    return out


def test_ablation_table_of_a_regressor_equals_scipy_on_its_own_predictions(reg, data):
    corpus, enc = data
    task = task_of_model(reg.model)
    y = task.targets(corpus, reg.model)
    res = run_ablation(reg.model, enc, y, HeadScoring(batch_size=5), n_bootstrap=200, seed=1)
    t = res.table
    assert set(t["metric"]) == {"pearson", "spearman", "mse"} and set(t["task"]) == {"regression"}
    intact = t[t["target"] == "intact"].set_index("metric")["value"]
    pred = _direct_predictions(reg.model, enc)
    # float32 forward in batches vs one at a time: predictions agree to ~1e-6, so do the statistics
    assert intact["pearson"] == pytest.approx(st.pearsonr(pred, y).statistic, abs=1e-5)
    assert intact["spearman"] == pytest.approx(st.spearmanr(pred, y).statistic, abs=1e-5)
    assert intact["mse"] == pytest.approx(float(np.mean((pred - y) ** 2)), rel=1e-5)
    heads = t[(t["target"] == "head") & (t["metric"] == "pearson")]
    assert len(heads) == 8 and heads["ci_low"].le(heads["delta"]).all() and heads["delta"].le(heads["ci_high"]).all()
    assert res.params["task"] == "regression" and "predicted_range" in res.params["degenerate"]


def test_cached_and_naive_sweeps_of_a_regressor_agree(reg, data):
    corpus, enc = data
    y = task_of_model(reg.model).targets(corpus, reg.model)
    a = run_ablation(reg.model, enc, y, HeadScoring(batch_size=4), n_bootstrap=0, sweep=SweepPlan(method="cached")).table
    b = run_ablation(reg.model, enc, y, HeadScoring(batch_size=4), n_bootstrap=0, sweep=SweepPlan(method="naive")).table
    # the cached sweep replays the same float32 operations on cached inputs: agreement to float rounding
    assert np.allclose(a["value"], b["value"], rtol=1e-5, atol=1e-6)


def test_head_importance_of_a_regressor_uses_the_squared_error(reg, data):
    corpus, enc = data
    y = task_of_model(reg.model).targets(corpus, reg.model)
    imp = run_head_importance(reg.model, enc, y, HeadScoring(batch_size=6), pruning=PruningPlan(0.5))
    assert (imp.importance["importance_raw"] > 0).all()
    assert set(imp.curve["metric"]) == {"pearson", "spearman", "mse"}
    # the intact point of the curve is the intact model's MSE
    pred = _direct_predictions(reg.model, enc)
    first = imp.curve[(imp.curve["n_removed"] == 0) & (imp.curve["metric"] == "mse")]["value"].iloc[0]
    assert first == pytest.approx(float(np.mean((pred - y) ** 2)), rel=1e-5)


def test_a_regressor_predicting_one_value_is_degenerate():
    task = get_task("regression")
    const = task.degeneracy(float("nan"), 100, 1, 0.0)
    assert const.flagged and const.constant_predictions and "one value" in const.note
    weak = task.degeneracy(0.1, 100, 100, 0.0)  # Fisher 95% interval [-0.10, 0.29] reaches 0
    assert weak.flagged and not weak.constant_predictions and weak.ci[0] < 0
    good = task.degeneracy(0.8, 100, 100, 0.0)
    assert not good.flagged and good.to_dict()["pearson"] == 0.8 and good.to_dict()["ci_method"] == "fisher z 95%"


def test_the_summary_speaks_the_regression_metrics(reg, data):
    corpus, enc = data
    y = task_of_model(reg.model).targets(corpus, reg.model)
    t = run_ablation(reg.model, enc, y, HeadScoring(batch_size=8), n_bootstrap=50).table
    text = summary({"ablation": t})
    intact_line = next(line for line in text.splitlines() if line.startswith("intact:"))
    assert intact_line.startswith("intact: pearson ") and ", spearman " in intact_line and ", mse " in intact_line
    assert "accuracy" not in text


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_a_fresh_regression_head_starts_at_the_targets_mean(model_type, tmp_path):
    """BERT's head is one Linear (``classifier``); RoBERTa's ends in ``classifier.out_proj`` after a dense layer."""
    from transformers import AutoModelForSequenceClassification

    from bertology.testing import tiny_family_config
    from bertology.testing.tokenizers import tiny_tokenizer
    from bertology.training.finetune import _start_at_the_mean

    kind = {"bert": "wordpiece", "roberta": "bpe", "distilbert": "wordpiece"}[model_type]
    cfg = tiny_family_config(model_type, tiny_tokenizer(kind, tmp_path), num_labels=1, problem_type="regression")
    model = AutoModelForSequenceClassification.from_config(cfg)
    assert _start_at_the_mean(model, 2.75) == 2.75
    ids = torch.tensor([[1, 5, 6, 2]])
    with torch.no_grad():
        heads = [m for n, m in model.named_modules() if n.startswith("classifier") and isinstance(m, torch.nn.Linear)]
        heads[-1].weight.zero_()  # with the last weights at zero the output is the bias alone
        assert model(input_ids=ids).logits.item() == pytest.approx(2.75, abs=1e-6)
