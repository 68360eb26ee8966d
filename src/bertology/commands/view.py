"""``view``: the interactive attention viewer of one model, or of two side by side, as one offline HTML file.

:func:`view` checks the output file before any model is loaded, computes the view
(:func:`bertology.activations.views.view_data`) and saves it (``.html``: the page; ``.json``: the data).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bertology.errors import check_range
from bertology.runs import RunResult


def view_measure(attention_measures: Sequence[str] | str) -> str:
    """The one measure a view shows, checked by ``compare``'s declaration of ``attention_measures`` (the same lines
    for an unknown or repeated name); more than one is refused: the viewer draws one set of maps."""
    from bertology.config import CompareConfig, check_measures_once
    from bertology.settings import field_setting

    setting = field_setting(CompareConfig, "attention_measures")
    measures = setting.check(attention_measures)
    check_measures_once(CompareConfig, measures)
    if len(measures) != 1:
        raise setting.refuse("names one measure for the viewer (it draws one set of maps)", ",".join(measures))
    return measures[0]


@dataclass
class ViewRun(RunResult):
    """A saved view: ``out`` is the file written (None: kept in memory), ``view`` the
    :class:`~bertology.viz.viewer.AttentionView` (renders in a notebook); ``manifest`` says what it shows."""

    view: object = None


def view(
    text: str,
    text_pair: str | None = None,
    *,
    model: str = "minilm",
    compare: str | None = None,
    out: str | Path | None = None,
    max_length: int = 128,
    attention_measures: Sequence[str] | str = ("weights",),
) -> ViewRun:
    """The attention of ``model`` (and ``compare``, shown as 'tuned'; diff = it minus ``model``) on one text or pair.

    ``out`` is the file to write (``.html`` page, or ``.json`` data); None keeps the view in memory.
    ``attention_measures``: ``compare``'s setting (the same declaration and refusals), one measure here: the maps
    shown are the weights or that contribution measure's (a per-layer measure shows one map per layer).
    """
    from bertology.activations.views import view_data
    from bertology.results import cannot_write, check_output_file
    from bertology.viz.viewer import AttentionView

    check_range(max_length, "max_length", "--max-length", minimum=2)
    measure = view_measure(attention_measures)
    if out is not None:
        out = check_output_file(out, "--out", example="view.html")  # before loading any model
    shown = AttentionView(view_data(model, text, text_pair, compare=compare, max_length=max_length,
                                       measure=measure))
    path = None
    if out is not None:
        try:
            path = shown.save(out)
        except OSError as err:  # e.g. the disk filled up while writing
            raise cannot_write(Path(out), "--out", err) from None
    manifest = {"kind": "view", "model": model, "compare": compare, "text": text, "text_pair": text_pair,
                "max_length": max_length}
    if measure != "weights":
        manifest["attention_measures"] = [measure]
    return ViewRun(path, {}, manifest, shown)
