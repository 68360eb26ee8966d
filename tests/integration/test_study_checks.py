"""A study's settings that could only fail inside its jobs are refused before its folder is touched (issue 43).

Each case is one edit of the tiny study's spec; the study command exits 2 with one ``error:`` line naming the
setting, and no study folder (so no job folder) exists afterwards.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bertology.errors import BertologyError
from bertology.studies.checks import check_device, check_study
from bertology.studies.spec import load_spec

sys.path.insert(0, str(Path(__file__).parent))
from study_helpers import tiny_study  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
ANALYSES = 'analyses = ["attention_change", "representation_similarity"]'
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
FEW_CUDA = pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")

#: case -> (text of the tiny spec, its replacement, the fragments of the one error line)
REFUSED = {
    "cuda without CUDA": ('out = "out"', 'out = "out"\ndevice = "cuda"', ("device = 'cuda'", "CUDA is not available")),
    "cuda:7": ('out = "out"', 'out = "out"\ndevice = "cuda:7"', ("device = 'cuda:7'",)),
    "mps without MPS": ('out = "out"', 'out = "out"\ndevice = "mps"',
                        ("device = 'mps'", "MPS (Apple silicon) is not available")),
    "a garbage device": ('out = "out"', 'out = "out"\ndevice = "gpu please"',
                         ("device = 'gpu please'", "Unknown device")),
    "[lab] drop_layers": ("epochs = 1", "epochs = 1\ndrop_layers = [2]",
                          ("[lab]: drop_layers cannot be a study setting", "needs the same architecture")),
    "[lab] freeze_layers beyond the base": ("epochs = 1", "epochs = 1\nfreeze_layers = 5",
                                            ("task 'a': --freeze-layers 5: the model has 2 layers",)),
    "LoRA targets that match no module": ("epochs = 1", 'epochs = 1\nmethod = "lora"\nlora_targets = ["qkv_proj"]',
                                          ("task 'a': --lora-targets qkv_proj: no module of", "query", "value")),
    "[compare] max_length = 0": ("max_length = 16\nanalyses", "max_length = 0\nanalyses",
                                 ("[compare]: --max-length (max_length) must be at least 2, not 0.",)),
    "[compare] negative batch size": ("max_length = 16\nanalyses", "max_length = 16\nbatch_size = -4\nanalyses",
                                      ("[compare]: --batch-size (batch_size) must be at least 1, not -4.",)),
    "[lab] negative batch size": ("batch_size = 8", "batch_size = -4",
                                  ("[lab]: --batch-size (batch_size) must be at least 1, not -4.",)),
    "the probes without treebanks": (ANALYSES, 'analyses = ["attention_change", "probe"]',
                                     ("[compare] analyses: Cannot run the structural probes", "--probe-train")),
    "an ablation on a corpus without labels": (
        f'data = "shared.tsv"\ntext_column = "sentence"\nmax_examples = 10\nmax_length = 16\n{ANALYSES}',
        'data = "shared.txt"\nmax_examples = 10\nmax_length = 16\nanalyses = ["ablation"]',
        ("[compare] analyses: Cannot run", "shared.txt has no labels", "label_column in [compare]")),
}
MARKS = {"cuda without CUDA": NO_CUDA, "cuda:7": FEW_CUDA, "mps without MPS": NO_MPS}


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    spec = tiny_study(tmp_path)
    (tmp_path / "shared.txt").write_text("the good film .\nthe fun plot .\nthe bad end .\n", encoding="utf-8")
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new, 1))
    return spec


@pytest.mark.parametrize("case", [pytest.param(c, marks=MARKS.get(c, ())) for c in REFUSED])
def test_a_setting_that_would_fail_every_job_is_one_line_before_the_folder_exists(tmp_path, case):
    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    old, new, fragments = REFUSED[case]
    spec = _edited(tmp_path, old, new)
    result = CliRunner().invoke(app, ["study", str(spec)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    line = " ".join(result.output.split())  # the one line, as the terminal folded it
    for fragment in fragments:
        assert fragment in line, line
    assert not (tmp_path / "out").exists()  # no study folder, so no job folder either


def test_the_same_settings_within_bounds_pass(tmp_path):
    """The checks refuse what the jobs would refuse, not more: a base's layers frozen, LoRA on its query and value,
    an ablation on the labelled shared corpus."""
    spec = _edited(tmp_path, "epochs = 1", 'epochs = 1\nfreeze_layers = 2')
    check_study(load_spec(spec))
    spec = _edited(tmp_path / "lora", "epochs = 1", 'epochs = 1\nmethod = "lora"\nlora_targets = ["query", "value"]')
    check_study(load_spec(spec))
    spec = _edited(tmp_path / "ablation", ANALYSES, 'analyses = ["attention_change", "ablation"]')
    check_study(load_spec(spec))
    assert not any((tmp_path / d / "out").exists() for d in (".", "lora", "ablation"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_on_ray_a_device_this_machine_lacks_is_the_workers_but_a_garbage_name_is_refused():
    check_device("cuda", here=False)  # the workers' GPUs are not this machine's
    check_device("cuda:7", here=False)
    with pytest.raises(BertologyError, match=r"^device = 'gpu please': Unknown device"):
        check_device("gpu please", here=False)
    with pytest.raises(BertologyError, match=r"^device = 'cuda': .*CUDA is not available"):
        check_device("cuda")
