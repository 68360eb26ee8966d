"""A mistyped name is answered with the closest known one first (``bertology.errors.did_you_mean``), then the list of
every known name as before; a name like none of them gets no suggestion. One test per place that refuses a name."""
from __future__ import annotations

import pandas as pd
import pytest

from bertology.errors import BertologyError, check_choice, did_you_mean, each_with_suggestion


def test_the_closest_known_name_is_suggested():
    assert did_you_mean("epoch", ["batch_size", "epochs", "seed"]) == " (did you mean epochs?)"
    assert did_you_mean("attention_chang", ["attention_change", "attention_patterns"]) == \
        " (did you mean attention_change?)"  # the closer of two close ones
    assert did_you_mean("flaot16", ("float32", "bfloat16", "float16")) == " (did you mean float16?)"


def test_no_suggestion_for_a_name_like_none_of_them():
    assert did_you_mean("nope", ["attention_change", "geometry"]) == ""
    assert did_you_mean("xyz", []) == ""
    assert did_you_mean("epochs", ["epochs"]) == ""  # a known name is not "mistyped"
    assert did_you_mean(3, ["3", "4"]) == ""  # only text is matched (a number for a choice is refused as it was)


def test_several_names_each_get_their_own_suggestion():
    known = ["epochs", "learning_rate", "seed"]
    assert each_with_suggestion(["epoch", "nope", "learning_rat"], known) == \
        "epoch (did you mean epochs?), nope, learning_rat (did you mean learning_rate?)"
    assert each_with_suggestion([], known) == ""


def test_an_unknown_setting_of_a_python_call():
    """``bt.finetune(..., epoch=1)``: the keywords are shared out by ``api._split``, which refuses the rest."""
    from bertology.api import _split
    from bertology.config import DataConfig, FinetuneConfig

    with pytest.raises(BertologyError, match=r"^Unknown setting epoch \(did you mean epochs\?\); known: .*epochs"):
        _split({"epoch": 1}, DataConfig, FinetuneConfig)
    with pytest.raises(BertologyError, match=r"^Unknown setting zzqq; known: "):
        _split({"zzqq": 1}, DataConfig, FinetuneConfig)


def test_an_unknown_compare_setting():
    from bertology.commands.selection import complete_config, make_config

    with pytest.raises(BertologyError, match=r"^Unknown setting rsa_token \(did you mean rsa_tokens\?\) for compare; "
                                             r"known: .*rsa_tokens"):
        complete_config(make_config(rsa_token=3))
    with pytest.raises(BertologyError, match=r"^Unknown settings probe_rnak \(did you mean probe_rank\?\), zzqq for "
                                             r"compare; known: "):
        complete_config(make_config(zzqq=1, probe_rnak=3))


def test_an_unknown_setting_of_a_command_object():
    from bertology.settings import settings_object
    from bertology.experiments.ablation import AblationSettings

    with pytest.raises(BertologyError, match=r"^ablate has no setting max_example \(did you mean max_examples\?\); "
                                             r"its settings are: "):
        settings_object(AblationSettings, {"max_example": 3}, "ablate")


def test_an_unknown_analysis():
    from bertology.commands.selection import select

    with pytest.raises(BertologyError, match=r"^Unknown analysis attention_chang \(did you mean attention_change\?\); "
                                             r"choose from: all, attention_change,"):
        select(["attention_chang"])
    with pytest.raises(BertologyError, match=r"^Unknown analysis nope; choose from: all, "):
        select(["nope"])


def test_a_choice_of_a_setting():
    """Setting.check's refusal (every declared choice: Python and the command line) and check_choice's."""
    from bertology.config import CompareConfig

    with pytest.raises(BertologyError, match=r"^--dtype \(dtype\) must be one of float32, bfloat16, float16, "
                                             r"not 'flaot16' \(did you mean float16\?\)\.$"):
        CompareConfig(dtype="flaot16")
    with pytest.raises(BertologyError, match=r"^--dtype \(dtype\) must be one of float32, bfloat16, float16, "
                                             r"not 'int8'\.$"):
        CompareConfig(dtype="int8")
    with pytest.raises(BertologyError, match=r"^--executor \(executor\) must be one of local, ray, not 'locl' "
                                             r"\(did you mean local\?\)\.$"):
        check_choice("locl", ("local", "ray"), "executor", "--executor")


def test_an_unknown_task_and_convention():
    from bertology.conventions import choose
    from bertology.tasks.catalog import get_task

    with pytest.raises(BertologyError, match=r"^Unknown task 'clasification' \(did you mean classification\?\); "):
        get_task("clasification")
    with pytest.raises(BertologyError, match=r"^Unknown conventions preset 'clark2018' \(did you mean clark2019\?\); "):
        choose("clark2018", "punctuation", None)


def test_an_unknown_table_or_figure_of_a_run():
    """``run.attention_chang`` and ``run.plot("attention_cosin")`` (the figures given, not drawn: only the names
    matter here)."""
    from bertology.api import Run

    tables = {"attention_change": pd.DataFrame({"cosine": [1.0]})}
    run = Run(None, tables, {"kind": "compare"}, _figures={"attention_cosine": (("attention_change",), None, "c")})
    with pytest.raises(AttributeError, match=r"^this compare run has no table 'attention_chang' "
                                             r"\(did you mean attention_change\?\); its tables: attention_change$"):
        run.attention_chang
    with pytest.raises(AttributeError, match=r"^this compare run has no table 'geometry'; its tables: "):
        run.geometry
    with pytest.raises(BertologyError, match=r"^This run has no table 'attention_chang' "
                                             r"\(did you mean attention_change\?\); it has: attention_change\.$"):
        run.table("attention_chang")
    with pytest.raises(BertologyError, match=r"^No figure 'attention_cosin' \(did you mean attention_cosine\?\); "
                                             r"choose from: attention_cosine \(or a table's name\)\.$"):
        run.plot("attention_cosin")
    with pytest.raises(BertologyError, match=r"^No figure 'nope'; choose from: attention_cosine"):
        run.plot("nope")
    assert not hasattr(run, "_repr_png_")  # Jupyter's probes still read as "no such attribute"
