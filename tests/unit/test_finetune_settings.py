"""``bertology finetune``'s settings are declared once (FinetuneConfig's fields): its flags, their help and
defaults, the checks Python and the command line share, and a study's ``[lab]`` keys are generated from them."""
from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from bertology.config import FINETUNE_DATA_SETTINGS, DataConfig, FinetuneConfig
from bertology.errors import BertologyError
from bertology.settings import Setting, declared_fields, field_settings

DECLARED = [("finetune", s) for s in field_settings(FinetuneConfig)] + [("data", s) for s in FINETUNE_DATA_SETTINGS]


def invoke(args: list[str], **kw):
    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    return CliRunner().invoke(app, ["finetune", *args], **kw)


def test_every_declared_setting_is_a_flag_in_help_with_its_default_once():
    from bertology.cli.finetune import finetune_settings
    from bertology.cli.generated import _help

    generated = [s for _, group in finetune_settings() for s in group]
    assert sorted(s.name for s in generated) == sorted(s.name for _, s in DECLARED)  # each once, none left out
    help_text = invoke(["--help"], env={"COLUMNS": "200"}).output
    shown = " ".join(help_text.replace("│", " ").split())  # the help's words, without the panels' borders
    for _, s in DECLARED:
        assert s.cli_flag in shown and " ".join(_help(s).split()) in shown, s.name
        shows_default = not (s.default is None or s.default is False or s.default == ())
        assert _help(s)[len(s.help):].count("(default:") == shows_default, s.name  # once, from the declaration
    assert shown.count("[default:") == 2  # typer's own, of the two hand-written flags with defaults (--model, --out)
    for flag in ("--lr", "--eval-slices", "--early-stopping", "--drop-layers", "--exclude-words", "--max-examples",
                 "--text-column", "--freeze-embeddings", "--trust-remote-code", "--objective", "--qa-split"):
        assert flag in shown  # every flag the command had keeps its name


def _bad(s: Setting):
    """A value outside the declaration: not one of the choices, or below the minimum (as the command line types it)."""
    if s.choices:
        return "bogus"
    low = (s.minimum - 1) if s.kind is int else float(s.minimum - 1)
    return type(low)(-1) if s.zero_is_none and low == 0 else low  # 0 means "not set": the next one down is invalid


CHECKED = [(owner, s) for owner, s in DECLARED if s.choices or s.minimum is not None]


@pytest.mark.parametrize(("owner", "setting"), CHECKED, ids=[s.name for _, s in CHECKED])
def test_a_bad_value_is_the_same_one_line_from_python_and_the_command_line(owner, setting, tmp_path):
    s, bad = setting, _bad(setting)
    # Python: making the config, and a config changed afterwards, refused by the library before any model loads
    make = (lambda: DataConfig(**{s.name: bad})) if owner == "data" else (lambda: FinetuneConfig(**{s.name: bad}))
    with pytest.raises(BertologyError) as made:
        make()
    line = str(made.value)
    assert line.startswith(f"{s.cli_flag} ({s.name}) must be ") and line.endswith(f", not {bad!r}.") and "\n" not in line
    from bertology.training.finetune import finetune
    from bertology.data.corpus import Corpus

    config = FinetuneConfig(model=str(tmp_path / "no-model"), out=str(tmp_path / "x"))
    group, attr = (None, s.name) if owner == "data" else next((g, a) for g, a, d in declared_fields(FinetuneConfig)
                                                             if d.name == s.name)
    target = config.data if owner == "data" else getattr(config, group) if group else config
    object.__setattr__(target, attr, bad)  # a group's setting lives in its frozen group (config.lora.rank)
    with pytest.raises(BertologyError) as later:
        finetune(config, Corpus.from_list(["a b", "c d"], labels=["x", "y"]))
    assert str(later.value) == line
    # the command line: exit 2, the same one line, before the data or the model is read (neither exists)
    result = invoke(["--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "no-data.csv"),
                     "--out", str(tmp_path / "run"), s.cli_flag, str(bad)])
    assert result.exit_code == 2, result.output
    errors = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert errors == [f"error: {line}"], result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize(("args", "line"), [
    (["--epochs", "0"], "--epochs (epochs) must be above 0, not 0.0."),
    (["--lr", "0"], "--lr (learning_rate) must be above 0, not 0.0."),
    (["--warmup-ratio", "1"], "--warmup-ratio (warmup_ratio) must be below 1, not 1.0."),
    (["--temperature", "0"], "--temperature (temperature) must be above 0, not 0.0."),
    (["--max-examples", "1"], "--max-examples (max_examples) must be at least 2, or 0 for all, not 1."),
    (["--drop-layers", "x"], "--drop-layers (drop_layers) takes a comma list of layer numbers (1-based), not 'x'."),
    (["--exclude-words", ","], "--exclude-words (exclude_words) is empty: give words as a comma list or @FILE, not ','."),
])
def test_bounds_one_declaration_cannot_state_are_one_line_too(args, line, tmp_path):
    result = invoke(["--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.csv"), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2 and [x for x in result.output.splitlines() if x.startswith("error:")] == [f"error: {line}"]


def test_command_line_text_and_python_values_make_the_same_config():
    from bertology.cli.finetune import make_config

    given = {"drop_layers": "3, 1,3", "exclude_words": "Woman, girl", "slice_words": "man", "objective": "classification",
             "max_examples": 0, "max_length": 64, "learning_rate": 1e-3}
    cli = make_config("d.csv", "m", "o", None, given)
    py = FinetuneConfig(model="m", out="o", data=DataConfig(path="d.csv", max_examples=None, max_length=64, overlong="truncate"),
                        drop_layers=(1, 3), exclude_words=("woman", "girl"), slice_words=("man",), learning_rate=1e-3)
    assert cli == py and cli.objective == "supervised"  # the old name of the objective is the same setting


def _spec(tmp_path, lab: str):
    from bertology.studies.spec import load_spec

    (tmp_path / "train.tsv").write_text("sentence\tlabel\nfine day\tgood\nbad day\tbad\n", encoding="utf-8")
    (tmp_path / "shared.txt").write_text("one sentence .\n", encoding="utf-8")
    (tmp_path / "STUDY.toml").write_text(
        f'base = "minilm"\nseeds = [0]\n[lab]\n{lab}\n[[task]]\nname = "t"\ndata = "train.tsv"\n'
        '[compare]\ndata = "shared.txt"\n', encoding="utf-8")
    return load_spec(tmp_path / "STUDY.toml")


@pytest.mark.parametrize(("line", "message"), [
    ("epochs = -1", "[lab]: --epochs (epochs) must be above 0, not -1."),
    ("freeze_layers = -1", "[lab]: --freeze-layers (freeze_layers) must be at least 0, not -1."),
    ('objective = "mlm"', "[lab]: --objective (objective) must be one of supervised, contrastive, not 'mlm'."),
    ('dtype = "float8"', "[lab]: --dtype (dtype) must be one of float32, bfloat16, float16, not 'float8' (did you mean float32?)."),
    ("batch_size = 8.5", "[lab]: --batch-size (batch_size) must be a whole number, not 8.5."),
    ("max_length = 1", "[lab]: --max-length (max_length) must be at least 2, not 1."),
    ('drop_layers = [2]', "[lab]: drop_layers cannot be a study setting: a study compares every fine-tune with its base"),
    ("lr = 1e-3\nlearning_rate = 1e-3", "[lab]: lr is given twice (lr and learning_rate are one setting)."),
    ("seed = 3", "Unknown key 'seed' in [lab]; allowed: epochs, batch_size, lr,"),
    ("track_every = 5", "[lab]: track_every: a study cannot track while training yet;"),
])
def test_a_bad_lab_value_is_refused_when_the_spec_is_read(tmp_path, line, message):
    with pytest.raises(BertologyError) as err:
        _spec(tmp_path, line)
    assert str(err.value).startswith(message)


def test_any_declared_setting_in_lab_reaches_the_job_and_its_fingerprint(tmp_path):
    from bertology.studies.jobs import finetune_jobs

    spec = _spec(tmp_path, 'lr = 1e-3\nfreeze_layers = 1\nexclude_words = ["woman"]\nmax_examples = 10')
    assert spec.lab == {"lr": 1e-3, "freeze_layers": 1, "exclude_words": ("woman",), "max_examples": 10}
    job = finetune_jobs(spec, tmp_path / "out")[0]
    config = job.config()
    assert (config.learning_rate, config.surgery.freeze_layers, config.words.exclude) == (1e-3, 1, ("woman",))
    assert config.data.max_examples == 10 and config.task == "auto" and config.seed == 0
    # the long and the short name are one setting, one job; a setting left at its default is not in the fingerprint
    same = finetune_jobs(_spec(tmp_path, 'learning_rate = 1e-3\nfreeze_layers = 1\n'
                                         'exclude_words = ["woman"]\nmax_examples = 10'), tmp_path / "out")[0]
    assert same.fingerprint == job.fingerprint
    plain = finetune_jobs(_spec(tmp_path, "lr = 1e-3"), tmp_path / "out")[0]
    assert plain.fingerprint != job.fingerprint and dict(plain.lab) == {"lr": 1e-3}


def test_the_declarations_follow_the_papers_and_output_only_settings_are_not_fingerprinted():
    declared = {s.name: s for s in field_settings(FinetuneConfig)}
    assert declared["temperature"].default == 0.05 and declared["temperature"].paper == "Gao et al. 2021"
    assert declared["learning_rate"].paper == declared["warmup_ratio"].paper == "Devlin et al. 2019"
    assert [n for n, s in declared.items() if not s.changes_numbers] == ["save_every", "track_every", "track_analyses",
                                                                           "track_examples"]
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    groups = {g for g, _, _ in declared_fields(FinetuneConfig) if g is not None}  # their settings are declared flat
    # the command's own flags, and the record of what the task's recipe filled in: not settings
    assert fields - set(declared) - groups == {"model", "data", "out", "eval_data", "recipe"}
