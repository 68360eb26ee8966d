"""LoRA in the lab (``--method lora``): the adapters' targets per family, a run on several families whose saved
adapter loads back as a model with the trained model's logits, the trainable-parameter count against a hand count,
and bad settings refused in one line."""
from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch

from bertology.config import DataConfig, FinetuneConfig
from bertology.errors import BertologyError
from bertology.models.loading import load_model
from bertology.testing import FAMILY_CONFIGS, SENTENCES, save_tiny_family, tiny_tokenizer
from bertology.training.lora import default_targets

peft = pytest.importorskip("peft")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

#: every family's query and value modules by the last part of their names (peft's target_modules)
TARGETS = {"bert": ("query", "value"), "roberta": ("query", "value"), "xlm-roberta": ("query", "value"),
           "electra": ("query", "value"), "distilbert": ("q_lin", "v_lin"), "albert": ("query", "value"),
           "deberta-v2": ("query_proj", "value_proj"), "mpnet": ("q", "v"), "modernbert": ("Wqkv",)}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """model_type -> a saved tiny base model of that family."""
    root = tmp_path_factory.mktemp("lora")
    return {mt: save_tiny_family(root / mt, mt) for mt in FAMILY_CONFIGS}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora_data") / "d.csv"
    pd.DataFrame({"text": [SENTENCES[i % len(SENTENCES)] for i in range(40)], "label": [i % 2 for i in range(40)]}
                 ).to_csv(path, index=False)
    return path


def _run(base, data, out, **settings):
    from bertology.training.finetune import read_data
    from bertology.training.run import finetune_to_dir

    config = FinetuneConfig(model=str(base), data=DataConfig(path=str(data), max_examples=None, overlong="truncate"),
                            out=str(out), epochs=1, batch_size=8, method="lora", **settings)
    train, evaluation = read_data(config)
    return finetune_to_dir(config, train, evaluation)


def test_every_family_gets_its_own_query_and_value_targets(families):
    assert set(TARGETS) == set(FAMILY_CONFIGS)
    for mt, base in families.items():
        model = load_model(str(base), kind="classifier", num_labels=2).model
        assert default_targets(model) == TARGETS[mt], mt


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "deberta-v2", "modernbert"])
def test_a_lora_run_saves_an_adapter_that_loads_with_the_trained_logits(families, data, tmp_path, model_type):
    run = _run(families[model_type], data, tmp_path / "run", lora_merge=True, learning_rate=1e-2)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    lora = manifest["result"]["lora"]
    assert lora["targets"] == list(TARGETS[model_type]) and manifest["config"]["method"] == "lora"
    adapter = manifest["models"]["tuned"]["adapter"]  # in the fields a compare of an adapter records (the report's list)
    assert adapter["r"] == lora["rank"] and adapter["lora_alpha"] == lora["alpha"] and adapter["peft_type"] == "LORA"
    assert adapter["target_modules"] == list(TARGETS[model_type]) and adapter["base"] == lora["base"]
    assert (run.model_dir / "adapter_config.json").is_file() and not (run.model_dir / "config.json").exists()
    adapted, merged = load_model(str(run.model_dir)), load_model(str(tmp_path / "run" / "model-merged"))
    base = load_model(str(families[model_type]), kind="classifier", num_labels=2)
    inputs = tiny_tokenizer()(SENTENCES[:4], padding=True, return_tensors="pt")
    inputs = {k: v for k, v in inputs.items() if k != "token_type_ids" or model_type == "bert"}
    with torch.inference_mode():
        got, want = adapted.model(**inputs).logits, merged.model(**inputs).logits
        hidden = adapted.model.base_model(**inputs).last_hidden_state
        base_hidden = base.model.base_model(**inputs).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # merged from the trained model in memory
    heads = adapted.describe()["adapter"]["modules_to_save"]  # the manifest's record: peft repeats the names it adds
    assert len(heads) == len(set(heads)) and ("classifier" in heads or "score" in heads)
    assert not torch.allclose(hidden, base_hidden, atol=1e-4)  # the adapters were trained and kept


def test_the_trainable_parameters_are_the_adapters_and_the_head(families, data, tmp_path):
    _run(families["bert"], data, tmp_path / "run", lora_rank=4)
    lora = json.loads((tmp_path / "run" / "manifest.json").read_text())["result"]["lora"]
    cfg = json.loads((families["bert"] / "config.json").read_text())
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    adapters = layers * 2 * 4 * (h + h)  # query and value, A (r x h) and B (h x r) each
    head = h * 2 + 2  # the 2-label classifier
    assert lora["trainable_parameters"] == adapters + head
    assert lora["modules_to_save"] == ["classifier"]
    assert 0 < lora["trainable_percent"] < 100


def test_saving_an_adapter_of_a_named_base_asks_no_hub_and_warns_nothing(families, data, tmp_path, monkeypatch):
    """A base named, not a folder (``minilm``, a hub id): peft would look its config up on the hub to decide whether to
    save the embeddings (never trained here) and warn when it cannot; and wrapping warns of a deprecated question."""
    import peft.utils.save_and_load as save_and_load

    def no_hub(*args, **kwargs):
        raise AssertionError("peft asked the hub for the base's config")

    monkeypatch.setattr(save_and_load, "check_file_exists_on_hf_hub", no_hub)
    monkeypatch.setattr("bertology.training.lora.base_name", lambda model: "a-named-base")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _run(families["bert"], data, tmp_path / "run", save_every=2)
    assert json.loads((run.model_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == "a-named-base"
    noisy = [str(w.message) for w in caught if "is_gradient_checkpointing" in str(w.message)
             or "Could not find a config file" in str(w.message)]
    assert noisy == []


@pytest.mark.parametrize("settings, words", [
    ({"lora_rank": 0}, "--lora-rank"),
    ({"lora_dropout": 1.0}, "--lora-dropout"),
    ({"freeze_layers": 1}, "--freeze-layers"),
    ({"drop_layers": (1,)}, "--drop-layers"),
    ({"objective": "contrastive"}, "contrastive"),
])
def test_bad_lora_settings_are_one_line(settings, words):
    with pytest.raises(BertologyError) as err:
        FinetuneConfig(method="lora", **settings)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_full_run_keeps_its_fingerprint_whatever_the_lora_settings(families, data):
    from bertology.training.finetune import read_data
    from bertology.training.run import run_fingerprint

    def fp(**kw):
        config = FinetuneConfig(model=str(families["bert"]), data=DataConfig(path=str(data), max_examples=None), **kw)
        return run_fingerprint(config, *read_data(config))

    assert fp() == fp(lora_rank=4)
    assert fp() != fp(method="lora") != fp(method="lora", lora_rank=4)


def test_a_study_trains_one_task_with_lora_and_the_other_fully(tmp_path):
    import sys
    from pathlib import Path

    from typer.testing import CliRunner

    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    sys.path.insert(0, str(Path(__file__).parent))
    from study_helpers import tiny_study

    spec = tiny_study(tmp_path, seeds=(0,), extra="report = false\nown_data = false\n")
    text = spec.read_text()
    spec.write_text(text.replace('name = "a"\n', 'name = "a"\nmethod = "lora"\n', 1))
    result = CliRunner().invoke(app, ["study", str(spec)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    a, b = (json.loads((out / f"finetune/{t}/s0/manifest.json").read_text()) for t in "ab")
    assert a["config"]["method"] == "lora" and a["result"]["lora"]["trainable_parameters"] > 0
    assert b["config"]["method"] == "full" and b["result"]["lora"] is None
    assert (out / "finetune/a/s0/model/adapter_config.json").is_file() and (out / "finetune/b/s0/model/config.json").is_file()
    table = pd.read_parquet(out / "tables" / "attention_change.parquet")
    assert set(table["tuned"]) == {"a/s0", "b/s0"}  # the adapter was compared as a model, beside the full fine-tune
    spec.write_text(text.replace('name = "a"\n', 'name = "a"\nmethod = "lora-ish"\n', 1))
    bad = CliRunner().invoke(app, ["study", str(spec)])
    assert bad.exit_code != 0 and "method must be one of full, lora" in bad.output


def test_without_peft_lora_names_the_extra(monkeypatch):
    import sys

    from bertology.errors import BertologyError
    from bertology.training.lora import peft_library

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(BertologyError, match=r"--method lora needs the peft library: pip install 'bertology\[peft\]'"):
        peft_library()


def test_an_adapter_put_on_a_base_other_than_the_one_it_records_is_refused(tmp_path):
    """compare and revert both take the base; an adapter on other weights is another model, said before loading."""
    from bertology.models.loading import check_recorded_base
    from bertology.testing import save_lora_adapter, save_tiny_bert
    from cli_checks import invoke

    base, other = save_tiny_bert(tmp_path / "base"), save_tiny_bert(tmp_path / "other", seed=5)
    copy = save_tiny_bert(tmp_path / "copy")  # the same weights in another folder: accepted
    adapter = save_lora_adapter(base, tmp_path / "adapter", num_labels=2)
    data = tmp_path / "d.csv"
    pd.DataFrame({"text": SENTENCES, "label": [i % 2 for i in range(len(SENTENCES))]}).to_csv(data, index=False)
    assert check_recorded_base("a", str(base), str(copy)) is None
    assert "cannot tell" in check_recorded_base("a", "bert-base-uncased", str(base))
    for args in (["compare", "--base", other, "--tuned", adapter, "--analyses", "attention_change"],
                 ["ablate", "--model", adapter, "--mode", "revert", "--base", other, "--bootstrap", "10"]):
        result = invoke(*args, "--data", data, "--no-report", "--out", tmp_path / args[0])
        assert result.exit_code == 2, result.output
        line = next(x for x in result.output.splitlines() if x.startswith("error:"))
        assert "was trained on" in line and "whose weights differ" in line and str(other) in line
