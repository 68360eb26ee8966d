"""Settings declared once, for every command whose flags are generated from declarations.

For each command (compare, ablate, probe, track, absa, patterns export / train): every declared setting is a
flag in its ``--help`` with its help and its default, and an invalid value of every setting that has choices
or bounds is refused the same way from the command line (exit 2, one line naming the flag and the field)
and from Python (a :class:`BertologyError` with that line), before any model or data is read (in the spirit
of scikit-learn's ``generate_invalid_param_val`` common test). No model is needed: the paths given are absent.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from bertology.errors import BertologyError, format_bound
from bertology.settings import Setting


def _python_compare(name: str, value: Any) -> None:
    from bertology.commands.selection import complete_config, make_config

    complete_config(make_config("absent.txt", tuned="absent", **{name: value}))


def _declares(cls: type, name: str) -> bool:
    from bertology.settings import field_settings

    return name in {s.name for s in field_settings(cls)}


def _python_ablate(name: str, value: Any) -> None:
    from bertology.commands.ablate import QaOptions, ablate
    from bertology.commands.inputs import Loading

    if _declares(QaOptions, name):
        ablate("absent", "absent.csv", qa=QaOptions(**{name: value}))
    if _declares(Loading, name):
        ablate("absent", "absent.csv", loading=Loading(**{name: value}))
    ablate("absent", "absent.csv", {name: value})


def _python_probe(name: str, value: Any) -> None:
    from bertology.experiments.token_probe import TokenProbeSettings
    from bertology.commands.inputs import Loading
    from bertology.commands.probe import ProbeData, ProbeOptions, probe

    data = ProbeData("absent.conllu", "absent.conllu")
    if _declares(TokenProbeSettings, name):
        probe("absent", data, token={name: value})
    if _declares(ProbeData, name):
        probe("absent", ProbeData("absent.conllu", "absent.conllu", **{name: value}))
    if _declares(ProbeOptions, name):
        probe("absent", data, **vars(ProbeOptions(**{name: value})))
    if _declares(Loading, name):
        probe("absent", data, loading=Loading(**{name: value}))
    probe("absent", data, {name: value})


def _python_track(name: str, value: Any) -> None:
    from bertology.commands.track import track

    track("absent-run", **{name: value})


def _python_absa(name: str, value: Any) -> None:
    from bertology.commands.absa import AbsaConfig, run_absa

    run_absa(AbsaConfig(data="absent.xml", **{name: value}))


def _python_export(name: str, value: Any) -> None:
    from bertology.commands.patterns import ExportSettings, export_patterns

    export_patterns("absent", "absent.txt", ExportSettings(**{name: value}), out="absent-out")


def _python_train(name: str, value: Any) -> None:
    from bertology.experiments.pattern_cnn import TrainSettings
    from bertology.commands.patterns import train_patterns

    train_patterns("absent.csv", TrainSettings(**{name: value}))


def _source(module: str, name: str) -> Callable[[], list]:
    def source() -> list:
        import importlib

        return getattr(importlib.import_module(module), name)()

    return source


#: command words, the arguments it needs besides settings (absent paths), its settings source, the Python call
COMMANDS = {
    "compare": (["compare"], ["--tuned", "absent", "--data", "absent.txt"],
                _source("bertology.cli.commands", "compare_settings"), _python_compare),
    "ablate": (["ablate"], ["--model", "absent", "--data", "absent.csv"],
               _source("bertology.cli.ablate", "ablate_settings"), _python_ablate),
    "probe": (["probe"], ["--train", "absent.conllu", "--test", "absent.conllu"],
              _source("bertology.cli.probe", "probe_settings"), _python_probe),
    "track": (["track"], ["absent-run"], _source("bertology.cli.track", "track_settings"), _python_track),
    "absa": (["absa"], ["--data", "absent.xml"], _source("bertology.cli.absa", "absa_settings"), _python_absa),
    "patterns export": (["patterns", "export"], ["--data", "absent.txt", "--out", "absent-out"],
                        _source("bertology.cli.patterns", "export_settings"), _python_export),
    "patterns train": (["patterns", "train"], ["absent.csv"], _source("bertology.cli.patterns", "train_settings"),
                       _python_train),
}


def invalid_values(s: Setting) -> list[tuple[str, Any, str]]:
    """``(command-line text, Python value, what the error says)`` for each bound or choice ``s`` declares."""
    out: list[tuple[str, Any, str]] = []
    if s.choices is not None:
        value = ("not-a-choice",) if s.kind is tuple else "not-a-choice"
        out.append(("not-a-choice", value, f"must be one of {', '.join(s.choices)}, not 'not-a-choice'."))
    if s.kind is tuple:
        if s.minimum:
            out.append((",", (), f"must name at least {s.minimum:g} item"))
        return out
    number = int if s.kind is int else float
    if s.minimum is not None:
        low = number(s.minimum - 1)
        if s.zero_is_none and low == 0:  # 0 means "not set": the next one down is the invalid one
            low = number(-1)
        zero = f", or 0 for {s.zero_means}" if s.zero_is_none and s.minimum > 0 else ""  # 0 is allowed: say what it is
        out.append((str(low), low, f"must be at least {format_bound(s.minimum)}{zero}, not {low!r}."))
    if s.maximum is not None:
        high = number(s.maximum + 1)
        out.append((str(high), high, f"must be at most {format_bound(s.maximum)}, not {high!r}."))
    if s.above is not None:
        out.append((str(number(s.above)), number(s.above), f"must be above {s.above:g}, not {number(s.above)!r}."))
    if s.below is not None:
        out.append((str(number(s.below)), number(s.below), f"must be below {s.below:g}, not {number(s.below)!r}."))
    return out


def _declared(command: str) -> list[Setting]:
    return [s for _, group in COMMANDS[command][2]() for s in group]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_declared_setting_is_a_flag_with_its_help_and_default(command, runner):
    from bertology.cli import app
    from bertology.cli.generated import _help

    words = COMMANDS[command][0]
    result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.replace("│", " ").split())  # the help's words, without the panels' borders
    declared = _declared(command)
    assert declared
    for s in declared:
        assert s.cli_flag in shown and " ".join(_help(s).split()) in shown, (command, s.name)
        if s.default not in (None, False):
            default = ",".join(map(str, s.default)) if isinstance(s.default, tuple) else s.default
            default = s.cli_flag if default is True else default
            assert f"(default: {default})" in shown, (command, s.name)


def _cases() -> list:
    cases = []
    for command in COMMANDS:
        for s in _declared(command):
            for text, value, what in invalid_values(s):
                cases.append(pytest.param(command, s, text, value, what, id=f"{command}:{s.name}={text}"))
    return cases


@pytest.mark.parametrize("command,setting,text,value,what", _cases())
def test_an_invalid_value_is_refused_from_the_cli_and_from_python_with_one_line(command, setting, text, value, what,
                                                                               runner, tmp_path, monkeypatch):
    from bertology.cli import app

    monkeypatch.chdir(tmp_path)  # the absent paths stay absent; nothing is written anywhere else
    words, required, _, python = COMMANDS[command]
    line = f"{setting.cli_flag} ({setting.name}) {what}"
    result = runner.invoke(app, [*words, *required, f"{setting.cli_flag}={text}"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert said.startswith(f"error: {setting.cli_flag} ({setting.name}) ") and what in said, said
    assert said.count("error:") == 1
    with pytest.raises(BertologyError) as err:
        python(setting.name, value)
    assert str(err.value) == said.removeprefix("error: ") and line.rstrip(".") in str(err.value)
    assert not any(tmp_path.iterdir())  # refused before anything was written
