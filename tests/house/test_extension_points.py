"""Each extension point takes the files ``docs/development.md`` says it takes, and no other.

For each, a toy is registered the documented way (its module on the path, its one registry line by monkeypatch) and
shown to work end to end with no file of the package edited; where another test already does that, it is named in
:data:`PROOFS` and this file checks the named test still exists (so the page's claim cannot outlive its proof).
The toys live in ``tests/house/toys/``.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pandas as pd
import pytest

from bertology.results import write_table

ROOT = Path(__file__).resolve().parents[2]
TOYS = Path(__file__).parent / "toys"
DEVELOPMENT = ROOT / "docs" / "development.md"

#: extension point -> the files it takes (as the page names them), after this change
FILES = {
    "analysis": ("analyses/<name>.py", "analyses/catalog.py"),
    "experiment": ("experiments/<name>.py", "experiments/catalog.py"),
    "intervention": ("experiments/interventions.py",),
    "attention measure": ("activations/contributions.py", "config.py"),
    "family": ("models/adapters/families.py", "testing"),
    "task": ("tasks/<name>.py", "tasks/catalog.py"),
    "report section": ("report/sections/<name>.py", "report/sections/__init__.py"),
    "command": ("commands/<name>.py", "cli/<name>.py", "cli/__init__.py", "api.py", "__init__.py"),
}

#: extension points whose toy runs in another test: (test file, test function)
PROOFS = {
    "analysis": [("tests/house/test_registries.py", "test_a_toy_analysis_is_one_module_and_one_registry_line"),
                 ("tests/house/test_declared_reach.py", "test_a_declared_table_gets_seed_noise_verdicts_in_a_toy_study")],
    "intervention": [("tests/unit/test_interventions.py", "test_a_toy_intervention_runs_through_the_sweep_summary_and_report")],
    "command": [("tests/unit/test_command_base.py", "test_run_writes_tables_and_a_finished_manifest")],
}


def _section(point: str) -> str:
    """The text of the page's section ``### Adding <a/an> <point>``."""
    text = DEVELOPMENT.read_text(encoding="utf-8")
    found = re.search(rf"^### Adding an? {point}\n(.*?)(?=^#{{2,3}} )", text, re.S | re.M)
    assert found, f"docs/development.md has no section 'Adding a(n) {point}'"
    return found.group(1)


@pytest.mark.parametrize("point", sorted(FILES))
def test_the_page_names_exactly_the_files_each_extension_point_takes(point):
    section = _section(point)
    takes = re.search(r"^Takes: (.*)$", section, re.M)
    assert takes, f"the section on {point} has no 'Takes:' line"
    named = tuple(re.findall(r"`([^`]+)`", takes.group(1)))
    assert named == FILES[point], (point, named)
    for file in named:  # every file named exists (a <name> one: its folder does; a module may be a package)
        path = ROOT / "src" / "bertology" / file
        assert (path.parent if "<name>" in file else path).exists() or path.with_suffix(".py").exists(), file


@pytest.mark.parametrize("point", sorted(PROOFS))
def test_the_proof_named_for_an_extension_point_still_exists(point):
    for file, test in PROOFS[point]:
        source = (ROOT / file).read_text(encoding="utf-8")
        assert f"def {test}(" in source, f"{file} lost {test}, the proof that {point} takes {FILES[point]}"
        assert file.rsplit("/", 1)[-1] in _section(point), f"the section on {point} does not name {file}"


@pytest.fixture()
def toys(monkeypatch):
    monkeypatch.syspath_prepend(str(TOYS))


def test_a_report_section_is_one_module_and_one_registry_line(toys, tmp_path):
    from bertology.report.render import render_report
    from bertology.report.sections import SECTIONS, _MODULES, sections_of

    assert sections_of(_MODULES) == SECTIONS  # the registry is its list of modules
    run = tmp_path / "run"
    write_table(run, "toy_counts", pd.DataFrame({"word": ["good", "<bad>"], "count": [3, 4]}))
    page = render_report(run, sections=sections_of((*_MODULES, "toy_report_section"))).read_text(encoding="utf-8")
    assert '<section id="toy_section"><h2>Toy counts</h2>' in page and "7 counted" in page
    assert "<li>&lt;bad&gt;: 4</li>" in page  # the inline template is escaped as the package's are
    assert 'href="#toy_section"' in page  # and listed in the table of contents
    assert "toy_section" not in render_report(run).read_text(encoding="utf-8")  # without its line: not on the page


def test_an_experiment_is_one_module_and_one_registry_line(toys, identical_pair, tmp_path):
    import bertology as bt
    from bertology.experiments.catalog import EXPERIMENTS
    from bertology.testing import SENTENCES

    with EXPERIMENTS.added("toy_weight_distance", "toy_experiment"):
        run = bt.compare(str(identical_pair[0]), str(identical_pair[1]), list(SENTENCES[:4]),
                         analyses=["toy_weight_distance"], out=tmp_path / "run", toy_power=1)
    table = run.tables["toy_weight_distance"]
    assert table["value"].tolist() == [0.0] and table["n_tensors"].iloc[0] > 0  # identical weights: distance 0
    manifest = (tmp_path / "run" / "manifest.json").read_text(encoding="utf-8")
    assert '"toy_power"' in manifest  # its setting reached the manifest from its declaration


def test_a_task_is_one_module_and_one_registry_line(toys, monkeypatch):
    import numpy as np
    import torch

    from bertology.tasks import catalog

    monkeypatch.setitem(catalog.TASKS, "toy_classification", "toy_task")  # the one registry line
    task = catalog.get_task("toy_classification")
    assert type(task).__name__ == "ToyClassification" and task in catalog.all_tasks()
    assert catalog.higher_is_better()["accuracy"] is True
    logits, y = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]), np.array([0, 1, 1])  # the third one wrong
    assert task.point_scores(task.record(logits, torch.tensor(y)), y)["accuracy"] == pytest.approx(2 / 3)


def test_a_family_is_one_registration(monkeypatch, identical_pair):
    from bertology.models.adapters import base as adapters
    from bertology.models.adapters.families import BERT
    from bertology.models.loading import load_model

    monkeypatch.delitem(adapters._REGISTRY, "bert")  # as if BERT were not yet a family: restored after the test
    toy = adapters.register_adapter(dataclasses.replace(BERT, family="ToyBERT"))  # the one call families.py takes
    model = load_model(identical_pair[0], kind="encoder").model
    assert adapters.adapter_for(model) is toy and len(toy.block_list(model)) == model.config.num_hidden_layers


def test_the_package_names_no_toy():
    names = ("toy_weight_distance", "toy_report_section", "toy_section", "toy_classification", "ToyBERT")
    for path in (ROOT / "src" / "bertology").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not any(n in text for n in names), path
