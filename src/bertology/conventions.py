"""Paper conventions, named and switchable: where bertology and a paper's own code count differently.

Each :class:`Convention` is one setting of :class:`~bertology.config.CompareConfig` with the choices
it takes and the paper each choice reproduces. A preset (``--conventions clark2019``) sets several
at once; a setting the user gives explicitly wins over the preset. :func:`resolve` fills the
settings left open (``None``) from the preset, once, at the start of ``compare``;
:func:`describe` is what the manifest records, so every table can be traced to its conventions.

Each convention names the tables it changes (``tables``), so the manifest and the report can say
which paper's number each table reproduces. Commands that do not build a ``CompareConfig``
(``bertology probe``) pick their conventions with :func:`choose` and record them with :func:`record`.

Only conventions that reproduce the paper's number are offered here. Others the papers differ in
(the smaller details listed in docs/paper-conventions.md) are not yet switchable.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from bertology.config import CompareConfig
from bertology.errors import BertologyError, did_you_mean
from bertology.settings import Setting


@dataclass(frozen=True)
class Convention:
    """One switchable convention: the config field, what it decides, and each choice with its source."""

    field: str
    what: str
    choices: Mapping[str, str]
    default: str
    tables: tuple[str, ...] = ()  # the tables whose numbers the choice changes


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "attention_mode", "how two attention maps are flattened for their cosine (attention_change)",
        {"cropped": "the real tokens' maps only (bertology)",
         "padded": "every example padded to pad_length and the whole map flattened (Kovaleva et al. 2019, their notebook)"},
        "cropped", ("attention_change",),
    ),
    Convention(
        "punctuation", "which tokens count as punctuation (attention_targets)",
        {"unicode": "every token made only of Unicode punctuation (bertology)",
         "clark2019": "the tokens '.' and ',' only (Clark et al. 2019, their released code)"},
        "unicode", ("attention_targets",),
    ),
    Convention(
        "word_categories", "which tokens are a word category's targets, and each target's size (attention_targets)",
        {"bertology": "whole words (the sum over their pieces) by UPOS, UD/spaCy relations and a negation word list",
         "kovaleva2019": "single word pieces matched by string: the pieces of words with their PTB tags, spaCy "
                         "relations and 17 negations found by substring (Kovaleva et al. 2019, their notebook)"},
        "bertology", ("attention_targets",),
    ),
    Convention(
        "probe_punctuation", "which words the structural probes' UUAS and root accuracy leave out (probe)",
        {"upos": "words with UPOS PUNCT (bertology)",
         "hewitt2019": "words with PTB XPOS '' , . : `` -LRB- -RRB- (Hewitt & Manning 2019, their reporter.py)"},
        "upos", ("probe",),
    ),
    Convention(
        "relation_word_attention", "how word pieces' attention becomes word-level attention (relation_heads)",
        {"mean": "to a word = sum over its pieces, from a word = mean over its pieces (Clark et al. 2019, the paper)",
         "clark2019": "maps rounded to float16; to a word = float16 sum over its pieces, from a word = its first "
                      "piece; the word itself a candidate of value 0 (Clark et al. 2019, their released code)"},
        "mean", ("relation_heads",),
    ),
    Convention(
        "entropy_smoothing", "how each attention row's entropy is taken (attention_targets)",
        {"none": "-sum p ln p over the real keys, 0 ln 0 = 0 (bertology)",
         "clark2019": "of 0.9999 p + 0.0001 / n over the n real keys, in nats (Clark et al. 2019, their notebook)"},
        "none", ("attention_targets",),
    ),
    Convention(
        "head_map_distance", "the distance between heads the head map embeds (head_map)",
        {"js_distance": "square root of the mean JS divergence (bits) over query tokens; MDS from a classical start "
                        "(bertology)",
         "js_divergence": "the mean JS divergence (bits) over query tokens; MDS from a classical start",
         "clark2019": "JS divergence (nats) of maps smoothed as 0.999 p + 0.001 / n, summed over query tokens; "
                      "MDS from 5 seeded random starts, 1000 iterations, eps 1e-10 (Clark et al. 2019, their code)"},
        "js_distance", ("head_map", "head_distance"),
    ),
)

#: Preset -> the conventions it sets (the others keep bertology's).
PRESETS: Mapping[str, Mapping[str, str]] = {
    "bertology": {},
    "clark2019": {"punctuation": "clark2019", "relation_word_attention": "clark2019", "entropy_smoothing": "clark2019",
                  "head_map_distance": "clark2019"},
    "kovaleva2019": {"attention_mode": "padded", "word_categories": "kovaleva2019"},
    "hewitt2019": {"probe_punctuation": "hewitt2019"},
}
_BY_FIELD: Mapping[str, Convention] = {c.field: c for c in CONVENTIONS}


def setting(field: str, paper: str | None = None) -> Setting:
    """The declaration of convention ``field`` for the spec that reads it: its choices come from :data:`CONVENTIONS`,
    and its default is None ("the preset's"), so a value given explicitly wins over ``--conventions``."""
    conv = _BY_FIELD[field]
    what = conv.what.split(" (")[0]  # without the analysis it belongs to: the help groups flags by analysis
    return Setting(field, None, f"{what[0].upper()}{what[1:]}: {' or '.join(conv.choices)}; "
                                f"default: the --conventions preset's ({conv.default} in bertology's).",
                   kind=str, choices=tuple(conv.choices), paper=paper)


def choose(preset: str, field: str, value: str | None) -> str:
    """One convention's value: ``value`` if given, else the preset's, else bertology's; one clear error for bad names."""
    if preset not in PRESETS:
        raise BertologyError(f"Unknown conventions preset {preset!r}{did_you_mean(preset, PRESETS)}; "
                             f"choose from: {', '.join(PRESETS)}.")
    conv = _BY_FIELD[field]
    if value is None:
        value = PRESETS[preset].get(field, conv.default)
    if value not in conv.choices:
        raise BertologyError(f"Unknown {field} {value!r}{did_you_mean(value, conv.choices)}; "
                             f"choose from: {', '.join(conv.choices)}.")
    return value


def record(preset: str, values: Mapping[str, str]) -> dict:
    """The manifest's record of ``values`` (field -> value): the preset, and per convention its value, the
    paper that value comes from and the tables it changes."""
    out: dict = {"preset": preset}
    for field, value in values.items():
        conv = _BY_FIELD[field]
        out[field] = {"value": value, "source": conv.choices.get(value, "?"), "tables": list(conv.tables)}
    return out


def resolve(config: CompareConfig) -> CompareConfig:
    """``config`` with every open convention (``None``) set from its preset; one clear error for bad names."""
    changes = {conv.field: choose(config.conventions, conv.field, config.settings.get(conv.field)) for conv in CONVENTIONS}
    return dataclasses.replace(config, **changes)


def preset_values(conventions: str) -> dict:
    """What the preset ``conventions`` gives each convention the user left open."""
    return {conv.field: choose(conventions, conv.field, None) for conv in CONVENTIONS}


def describe(config: CompareConfig) -> dict:
    """The manifest's record: the preset, and each convention's value, the paper it comes from and its tables."""
    return record(config.conventions, {conv.field: config.settings.get(conv.field) for conv in CONVENTIONS})
