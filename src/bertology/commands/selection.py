"""What a compare run computes and with which settings: the selection of analyses and experiments, every declared
setting checked and completed, the manifest's settings record, and what the selection refuses before any work.

Split from the command itself (:mod:`bertology.commands.compare`): the CLI, the notebook API, studies and tracking
read the selection and the completed settings without running a compare.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bertology.analyses import per_measure
from bertology.analyses.base import Analysis
from bertology.analyses.catalog import ANALYSES
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.analyses.representation_similarity import OOD_TABLE
from bertology.config import CompareConfig, DataConfig
from bertology.conventions import CONVENTIONS
from bertology.conventions import choose as choose_convention
from bertology.conventions import resolve as resolve_conventions
from bertology.experiments.catalog import EXPERIMENTS
from bertology.experiments.registry import ExperimentContext, ExperimentSpec
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError, each_with_suggestion
from bertology.models.pair import ModelPair
from bertology.settings import Setting, compose, field_settings
from bertology.settings import complete as complete_settings
from bertology.settings import describe as describe_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Selection:
    """What a run computes: the analyses and experiments chosen, and which the user named explicitly.

    ``all`` selects everything; an experiment that cannot run on the given model or data is then
    skipped (with a note), while one the user named is an error.
    """

    analyses: tuple[AnalysisSpec, ...]
    experiments: tuple[ExperimentSpec, ...]
    named: frozenset[str]

    def names(self) -> tuple[str, ...]:
        """The selected names: analyses first, then experiments, each in catalog order."""
        return tuple(s.name for s in (*self.analyses, *self.experiments))


def selectable() -> tuple[str, ...]:
    """Every name ``--analyses`` accepts besides ``all``: the analyses, then the experiments (nothing imported)."""
    return ANALYSES.names() + EXPERIMENTS.names()


def select(names: Sequence[str], *, allow_none: bool = False) -> Selection:
    """The specs behind ``--analyses`` names (``all`` or a list), in catalog order; one error for unknown names.
    ``allow_none``: no name selects nothing (a notebook run of its own analysis objects alone), not an error."""
    names = tuple(n.strip() for n in names if n.strip())
    known = selectable()
    unknown = [n for n in names if n != "all" and n not in known]
    if unknown or not (names or allow_none):
        raise BertologyError(f"Unknown analysis {each_with_suggestion(unknown, ('all', *known)) or '(none)'}; "
                             f"choose from: all, {', '.join(known)}.")
    named = frozenset(n for n in names if n != "all")
    chosen = set(known) if "all" in names else named
    return Selection(tuple(ANALYSES.spec(n) for n in ANALYSES.names() if n in chosen),
                     tuple(EXPERIMENTS.spec(n) for n in EXPERIMENTS.names() if n in chosen), named)


def builtin_names(config: CompareConfig) -> frozenset[str]:
    """Every name an own analysis object may not take: the catalog's analyses and experiments and every table
    they (and the out-of-domain similarity) write with this config's settings."""
    completed = complete_config(config)
    tables = {t for spec in ANALYSES.specs() for t in spec.tables}
    tables |= {t for spec in EXPERIMENTS.specs() for t in spec.tables(completed)}
    return frozenset({*selectable(), *tables, OOD_TABLE})


def own_analyses(objects: Sequence[object], config: CompareConfig) -> list[Analysis]:
    """The notebook's analysis objects (``bt.compare(analyses=[obj, ...])``) checked and wrapped for the extraction
    loop (:class:`bertology.analyses.own.OwnAnalysis`); a name taken by a built-in or given twice refused."""
    from bertology.analyses.own import OwnAnalysis

    taken = set(builtin_names(config))
    wrapped = []
    for obj in objects:
        own = OwnAnalysis(obj, taken)
        taken.add(own.name)  # a second object of the same name is refused as a clash
        wrapped.append(own)
    return wrapped


def declared_settings() -> tuple[dict[str, Setting], dict[str, str]]:
    """Every setting an analysis or experiment declares (``name -> Setting``), and which spec declares it."""
    specs = (*ANALYSES.specs(), *EXPERIMENTS.specs())
    owners: dict[str, str] = {}
    for spec in specs:
        for s in spec.settings:
            owners.setdefault(s.name, spec.name)
    return compose((spec.name, spec.settings) for spec in specs), owners


def unread_settings(settings: dict, selection: Selection, implied: dict | None = None) -> list[str]:
    """A warning for each analysis or experiment setting set away from its default that no selected spec reads
    (``--patterns-cnn`` without ``attention_patterns``): a value the user gave is never ignored without a word.
    ``implied``: values the run chose itself (the conventions preset's), which are not the user's."""
    implied = implied or {}
    chosen = set(selection.names())
    readers: dict[str, list[str]] = {}
    defaults: dict[str, object] = {}
    for spec in (*ANALYSES.specs(), *EXPERIMENTS.specs()):
        for setting in spec.settings:
            readers.setdefault(setting.name, []).append(spec.name)
            defaults.setdefault(setting.name, setting.default)
    out = []
    for name, value in settings.items():
        owners = readers.get(name)
        if (owners and not chosen & set(owners) and value != defaults[name] and value not in (None, (), [])
                and not (name in implied and implied[name] == value)):
            out.append(f"{name.replace('_', '-')} = {value!r} is not used: only {', '.join(owners)} read(s) it, and "
                       f"this run does not run {'it' if len(owners) == 1 else 'them'} (--analyses).")
    return out


def complete_config(config: CompareConfig) -> CompareConfig:
    """``config`` with every declared setting checked (one clear line for a bad or unknown one) and its
    default filled in: what the run, its manifest and its fingerprint use."""
    declared, _ = declared_settings()
    own = [s.name for group in (CompareConfig, DataConfig) for s in field_settings(group)]  # taken by make_config
    values = complete_settings(declared, config.settings, where="compare", also=own)
    # settings added after runs were made stay out of the fingerprint at their default: those runs still resume
    left_out = frozenset(n for n, s in declared.items()
                         if not s.changes_numbers or (s.added and values.get(n) == s.default))
    return dataclasses.replace(config, settings=values, not_fingerprinted=left_out)


def make_config(data: str | DataConfig = "", **values) -> CompareConfig:
    """A CompareConfig from settings by name, as the command line and ``bertology.compare`` take them: the data's
    (``text_column``, ``max_examples``, ...) go to its DataConfig, the others to the run or the specs."""
    data_names = {s.name for s in field_settings(DataConfig)}
    if not isinstance(data, DataConfig):
        data = DataConfig(str(data), **{k: values.pop(k) for k in list(values) if k in data_names})
    return CompareConfig(data=data, **values)


def settings_record(config: CompareConfig) -> dict:
    """The manifest's ``settings``: every setting of the run, its data and each spec, with value, default, flag,
    help and paper, generated from the declarations (the report's settings table reads it)."""
    declared, owners = declared_settings()
    run = {s.name: s for s in field_settings(CompareConfig)}
    data = {s.name: s for s in field_settings(DataConfig)}
    record = {
        **describe_settings(run, {n: getattr(config, n) for n in run}, {n: "run" for n in run}),
        **describe_settings(data, {n: getattr(config.data, n) for n in data}, {n: "data" for n in data}),
        **describe_settings(declared, config.settings, owners),
    }
    for conv in CONVENTIONS:  # declared "not given: the preset's": the default this run had is the preset's choice
        if conv.field in owners:
            record[owners[conv.field]][conv.field]["default"] = choose_convention(config.conventions, conv.field, None)
    return record


def build_analyses(config: CompareConfig, pair: ModelPair, corpus: Corpus, encoded: EncodedCorpus,
                   specs: Sequence[AnalysisSpec] | None = None) -> list[Analysis]:
    """Build the selected analyses (``specs``; default: those ``config.analyses`` selects) for this data."""
    config = resolve_conventions(complete_config(config))
    specs = select(config.analyses, allow_none=bool(config.own_analyses)).analyses if specs is None else specs
    ctx = BuildContext(pair.num_layers, pair.num_heads, pair.tokenizer, corpus, encoded)
    return [per_measure.build(spec, config, ctx) for spec in specs]


def precheck_experiments(config: CompareConfig, selection: Selection, corpus: Corpus) -> None:
    """What the selected experiments can say from the data and the tuned model's ``config.json`` alone, before any
    weights load (e.g. the ablation: data labelled ``0``/``1`` for a classifier of ``-1``/``1``, ``--label-map``
    suggested): an error when the user named the experiment (or gave a setting it cannot honour, such as a label
    map that does not fit), else a warning now that it will be skipped (its note follows in the run's warnings)."""
    specs = [spec for spec in selection.experiments if spec.precheck is not None]
    if not specs or not config.tuned or len(corpus) == 0:
        return
    from bertology.models.loading import read_config

    tuned_config = read_config(config.tuned, trust_remote_code=config.trust_remote_code)
    for spec in specs:
        reason = spec.precheck(config, corpus, tuned_config)
        if reason is None:
            continue
        if spec.name in selection.named:
            raise BertologyError(spec.refusal(reason))
        logger.warning("%s will be skipped: %s.", spec.title[:1].upper() + spec.title[1:], reason)


def refuse_unrunnable(selection: Selection, ctx: ExperimentContext) -> None:
    """Refuse, before any work, an experiment the user named that cannot run on this model or data
    (a classifier's ablation on unlabelled data): not after the streaming pass has run."""
    for spec in selection.experiments:
        if spec.name in selection.named and (reason := spec.skip_reason(ctx)) is not None:
            raise BertologyError(spec.refusal(reason))
