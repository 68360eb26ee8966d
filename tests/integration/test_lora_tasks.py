"""LoRA for every task head (issue 34): a tagger, a QA model and a biaffine parser trained with ``--method lora``
save an adapter folder (the head in ``modules_to_save``; the parser's head beside the adapter) that loads back as the
trained model (its outputs are those of the ``--lora-merge`` model), knows its labels, and is ablated and compared as
a full run's model is."""
import json

import pandas as pd
import pytest
import torch

from bertology.models.loading import load_model
from bertology.models.parser import HEAD_CONFIG, HEAD_WEIGHTS, BiaffineParser
from bertology.testing import SENTENCES, save_tiny_bert, save_tiny_qa, squad_fixture, tiny_tokenizer
from cli_checks import invoke
from test_parsing_cli import TREES, write_conllu
from test_tagging_cli import _conllu

peft = pytest.importorskip("peft")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
LORA = ("--method", "lora", "--lora-rank", "4", "--lora-merge", "--no-report")
QA_FLAGS = ("--max-length", "40", "--doc-stride", "12")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("loratasks")


@pytest.fixture(scope="module")
def base(root):
    return save_tiny_bert(root / "base", initializer_range=0.3)


def _finetune(out, *args):
    res = invoke("finetune", *args, "--epochs", "1", "--batch-size", "8", "--lr", "1e-2", *LORA, "--out", out)
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["method"] == "lora"
    model_dir = out / "model"
    assert (model_dir / "adapter_config.json").is_file() and not (model_dir / "config.json").exists()
    return manifest["result"]["lora"], model_dir


def _same_outputs(adapted, merged, inputs):
    """The adapter loaded as a model gives the merged model's outputs (every output tensor)."""
    with torch.inference_mode():
        got, want = adapted(**inputs), merged(**inputs)
    names = [k for k in ("logits", "start_logits", "end_logits") if getattr(want, k, None) is not None]
    assert names
    for k in names:
        torch.testing.assert_close(getattr(got, k), getattr(want, k), atol=1e-5, rtol=1e-5)


def _inputs():
    return dict(tiny_tokenizer()(SENTENCES[:4], padding=True, return_tensors="pt"))


def test_a_lora_tagger_loads_with_its_tags_and_is_ablated(root, base):
    data = _conllu(root / "tags.conllu")
    lora, model_dir = _finetune(root / "tagger", "--model", base, "--data", data)
    assert lora["task_type"] == "TOKEN_CLS" and lora["modules_to_save"] == ["classifier"]
    adapted, merged = load_model(model_dir), load_model(root / "tagger" / "model-merged")
    assert type(adapted.model).__name__ == "BertForTokenClassification" and adapted.is_classifier
    assert adapted.model.config.label2id == merged.model.config.label2id
    assert sorted(adapted.model.config.label2id) == ["ADJ", "DET", "NOUN", "PUNCT", "VERB"]
    assert adapted.model.config.bertology_tag_field == "upos"
    _same_outputs(adapted.model, merged.model, _inputs())
    res = invoke("ablate", "--model", model_dir, "--data", data, "--out", root / "tagger-ablate", "--bootstrap", "20",
                 "--no-report")
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(root / "tagger-ablate" / "tables" / "ablation.parquet")
    assert set(table["task"]) == {"tagging"} and "accuracy" in set(table["metric"])


def test_a_lora_qa_model_loads_and_is_ablated(root):
    qa_base = save_tiny_qa(root / "qa-base", qa_head=False)
    data = root / "squad.json"
    data.write_text(json.dumps(squad_fixture("v2.0", copies=3)))
    lora, model_dir = _finetune(root / "qa", "--task", "qa", "--model", qa_base, "--data", data, *QA_FLAGS)
    assert lora["task_type"] == "QUESTION_ANS" and lora["modules_to_save"] == ["qa_outputs"]
    adapted, merged = load_model(model_dir), load_model(root / "qa" / "model-merged")
    assert type(adapted.model).__name__ == "BertForQuestionAnswering"
    _same_outputs(adapted.model, merged.model, _inputs())
    res = invoke("ablate", "--model", model_dir, "--data", data, *QA_FLAGS, "--out", root / "qa-ablate",
                 "--bootstrap", "20", "--max-examples", "10", "--no-report")
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(root / "qa-ablate" / "tables" / "ablation.parquet")
    assert set(table["metric"]) == {"f1", "exact_match", "loss"} and set(table["task"]) == {"qa"}


def test_a_lora_parser_saves_its_head_beside_the_adapter_and_loads_as_the_parser(root, base):
    data = write_conllu(root / "trees.conllu", TREES * 6)
    lora, model_dir = _finetune(root / "parser", "--task", "parsing", "--model", base, "--data", data)
    assert lora["task_type"] == "FEATURE_EXTRACTION" and lora["modules_to_save"] == ["head"]
    assert (model_dir / HEAD_WEIGHTS).is_file() and (model_dir / HEAD_CONFIG).is_file()
    adapted, merged = load_model(model_dir), load_model(root / "parser" / "model-merged")
    assert isinstance(adapted.model, BiaffineParser) and isinstance(merged.model, BiaffineParser)
    assert adapted.is_classifier and adapted.model.labels == merged.model.labels
    inputs = {k: v for k, v in _inputs().items()}
    _same_outputs(adapted.model, merged.model, inputs)
    plain = load_model(base)
    with torch.inference_mode():
        tuned_hidden = adapted.model.encoder(**inputs).last_hidden_state
        base_hidden = plain.model(**inputs).last_hidden_state
    assert not torch.allclose(tuned_hidden, base_hidden, atol=1e-4)  # the encoder's adapters were trained and kept
    res = invoke("ablate", "--model", model_dir, "--data", data, "--out", root / "parser-ablate", "--bootstrap", "20",
                 "--no-report")
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(root / "parser-ablate" / "tables" / "ablation.parquet")
    assert {"uas", "las"} <= set(table["metric"]) and set(table["task"]) == {"parsing"}
    res = invoke("compare", "--base", base, "--tuned", model_dir, "--data", data, "--out", root / "parser-compare",
                 "--analyses", "attention_change", "--no-report")
    assert res.exit_code == 0, res.output
    info = json.loads((root / "parser-compare" / "manifest.json").read_text())["models"]["tuned"]
    assert info["class"] == "BiaffineParser" and info["adapter"]["shares_base_weights"]["shared_tensors"] > 0


def test_a_lora_parser_checkpoint_restores_its_head(base, tmp_path):
    from bertology.config import FinetuneConfig
    from bertology.models.parser import ParserConfig
    from bertology.training.lora import load_adapter_weights, save_adapter, wrap_lora

    encoder = load_model(base).model
    parser = BiaffineParser(encoder, ParserConfig(labels=("det", "root"), hidden_size=encoder.config.hidden_size,
                                                  arc_dim=8, label_dim=4))
    run = wrap_lora(parser, FinetuneConfig(model=str(base), method="lora", lora_rank=2), "parsing")
    assert run.record["trainable_parameters"] == (sum(p.numel() for p in parser.parameters() if p.requires_grad))
    assert all(p.requires_grad for p in parser.head.parameters())
    torch.nn.init.normal_(parser.head.arc.weight)
    save_adapter(run, tiny_tokenizer(), tmp_path)
    saved = parser.head.arc.weight.detach().clone()
    torch.nn.init.zeros_(parser.head.arc.weight)
    load_adapter_weights(run, tmp_path)  # resuming: the adapter and the head come back
    torch.testing.assert_close(parser.head.arc.weight.detach(), saved, rtol=0, atol=0)
