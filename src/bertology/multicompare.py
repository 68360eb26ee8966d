"""One base against many tuned models in one run: ``bertology compare --tuned NAME=PATH --tuned NAME=PATH ...``.

The base model runs once per length batch and its activations are shared by every tuned model;
each pair still gets a complete run folder of its own (``OUT/pairs/<slug>/``, the same tables as
``compare --tuned PATH`` alone), and ``OUT/tables/`` holds every pair table stacked with ``tuned``,
``task`` and ``seed`` columns first.

Memory: every model's weights stay resident for the whole streaming pass (the base forward can only be
shared by models that are loaded), while per batch at most two models' activations are alive, the
base's and one tuned model's (:func:`bertology.activations.extract.run_shared_analyses`). Activations
are what grows with the data (attention maps are ``[batch, heads, T, T]`` per layer); weights are a
fixed cost of one model file each. docs/results/benchmarks.md has the time and peak memory measured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bertology.activations.extract import TunedConsumers, run_shared_analyses
from bertology.config import CompareConfig
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError, safe_name
from bertology.metrics.similarity import reused_signatures
from bertology.models.loading import load_model
from bertology.models.pair import ModelPair
from bertology.experiments.catalog import EXPERIMENTS
from bertology.experiments.registry import ExperimentContext
from bertology.commands.compare import CompareRun, Inputs, PairJob, in_dtype, prepare_inputs, progress_bar, resolve_settings
from bertology.results import Result, read_table, write_table
from bertology.commands.base import hold
from bertology.runs import RunDirectory, manifest_header
from bertology.runs import fingerprint as run_fingerprint

#: ``task/sN`` names give the task and the seed (``sst2/s0``: task sst2, seed 0).
TASK_SEED = re.compile(r"^(?P<task>[^/]+)/s(?P<seed>\d+)$")
#: Characters kept in a pair's folder name; every other one becomes ``_`` (``/`` becomes ``~`` first).
UNSAFE = re.compile(r"[^A-Za-z0-9._~+=-]")
#: Columns that lead every combined table.
KEYS = ("tuned", "task", "seed")


@dataclass(frozen=True)
class TunedModel:
    """One fine-tuned model of a many-model run: its unique name, where it is, and its task and seed when known."""

    name: str  # e.g. "sst2/s0" or "mnli"; unique in a run
    path: str  # hub id, folder, or built-in name
    task: str | None = None  # parsed from "task/sN" names when not given
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.path:
            raise BertologyError(f"A tuned model needs a name and a path (got name {self.name!r}, path {self.path!r}).")
        for part in self.name.split("/"):  # "task/s0" is one name; each of its parts names part of a folder
            try:
                safe_name("tuned model name", part)
            except BertologyError as err:
                raise BertologyError(f"Tuned model {self.name!r}: {err}") from None
        m = TASK_SEED.match(self.name)
        if m and self.task is None and self.seed is None:
            object.__setattr__(self, "task", m["task"])
            object.__setattr__(self, "seed", int(m["seed"]))

    @property
    def slug(self) -> str:
        """The pair's folder name under ``pairs/``: ``/`` as ``~``, other unsafe characters as ``_``."""
        slug = UNSAFE.sub("_", self.name.replace("/", "~"))
        return "_" + slug if slug in ("", ".", "..") else slug


def parse_tuned(values: Sequence[str]) -> list[TunedModel]:
    """``--tuned`` values as models: ``NAME=PATH``, or a plain ``PATH`` (named ``tuned`` when it is the only one).

    A value that is an existing folder is a plain path even if it holds ``=``. Several plain paths are
    named by their last path component. Names must be unique (checked here, before anything loads).
    """
    values = list(values)
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or Path(value).expanduser().exists():
            name, path = ("tuned" if len(values) == 1 else Path(value.rstrip("/\\")).name or value), value
        elif not name.strip() or not path.strip():
            raise BertologyError(f"--tuned {value!r}: write NAME=PATH (e.g. sst2/s0=runs/sst2-s0/model) or a plain PATH.")
        out.append(TunedModel(name.strip(), path.strip()))
    check_names(out)
    return out


def check_names(tuned: Sequence[TunedModel]) -> None:
    """One error for an empty list, repeated names, or names whose folders would collide."""
    if not tuned:
        raise BertologyError("No tuned model given: pass --tuned PATH or --tuned NAME=PATH (repeatable).")
    names = [t.name for t in tuned]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BertologyError(f"Tuned model name(s) {', '.join(map(repr, dup))} given more than once; each --tuned NAME must be unique.")
    slugs: dict[str, str] = {}
    for t in tuned:
        if t.slug in slugs:
            raise BertologyError(f"Tuned models {slugs[t.slug]!r} and {t.name!r} would share the folder pairs/{t.slug}; rename one.")
        slugs[t.slug] = t.name


@dataclass
class ManyCompareRun:
    """What ``compare_many`` produced: the run folder, each pair's run by tuned name, the combined tables, the manifest."""

    out: Path
    pairs: dict[str, CompareRun]
    tables: dict[str, pd.DataFrame]
    manifest: dict
    report: Path | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)  # pairs finished by an earlier run, read back
    #: experiments left out for one model (``tuned``, ``experiment``, ``reason``): e.g. a regressor's ablation on
    #: a classification task's labels
    skipped_experiments: list[dict] = dataclasses.field(default_factory=list)


def compare_many(
    config: CompareConfig, tuned: Sequence[TunedModel], *, corpus: Corpus | None = None, overwrite: bool = False,
    progress: bool = False, report: bool = True,
) -> ManyCompareRun:
    """Compare ``config.base`` with every tuned model on one corpus, the base forward shared; write ``config.out``.

    Every bad input (repeated names, a model of another shape or tokenizer, an experiment that cannot
    run) is refused before anything is written. Re-running with the same settings into the same folder
    skips the finished pairs; other settings are refused unless ``overwrite``.
    """
    t0 = time.perf_counter()
    tuned = list(tuned)
    check_names(tuned)
    if config.store:
        raise BertologyError("--store saves one pair's hidden states; run compare with a single --tuned PATH to use it.")
    config, selection, dtype = resolve_settings(config)
    base = load_model(config.base, trust_remote_code=config.trust_remote_code, dtype=dtype)
    pairs = [in_dtype(ModelPair(base, load_model(t.path, trust_remote_code=config.trust_remote_code, dtype=dtype,
                                                  adapter_base=config.base, shared_base=base)), dtype)
             for t in tuned]  # ModelPair checks shape and tokenizer: one error before any work
    inputs = prepare_inputs(config, selection, corpus, base.tokenizer)
    out = Path(config.out).expanduser()
    peers = {t.name: tuple((o.name, p) for o, p in zip(tuned, pairs) if o.name != t.name) for t in tuned}
    skips = plan_experiments(inputs, tuned, pairs, peers)  # a named experiment that runs on no model: refused here
    jobs = [PairJob(own_inputs(inputs, skips[t.name]), pair, out=out / "pairs" / t.slug, overwrite=overwrite,
                    progress=progress, t0=t0, peers=peers[t.name]) for t, pair in zip(tuned, pairs)]
    for t, job in zip(tuned, jobs):
        if by_peers := peer_skips(inputs, job.pair, skips[t.name]):  # not what the pair alone would skip: an
            job.fingerprint = run_fingerprint(job.fingerprint, by_peers)  # earlier run that ran it must not resume
    # no mapping among the parts, so the sorted-key JSON of runs.fingerprint gives the value it always had
    fingerprint = run_fingerprint(config.fingerprint(), [[t.name, t.task, t.seed, j.fingerprint] for t, j in zip(tuned, jobs)])
    with hold(out, "compare_many", fingerprint, overwrite=overwrite, scratch=("pairs",)) as top:
        finished = {t.name: _finished_pair(j, report) for t, j in zip(tuned, jobs)} if top.resumed else {}
        runs = _run_pairs(config, [(t, j) for t, j in zip(tuned, jobs) if finished.get(t.name) is None], report, progress)
        runs = {t.name: runs.get(t.name) or finished[t.name] for t in tuned}
        tables = combine(tuned, runs)
        top.write_tables(tables)
        manifest = {
            **manifest_header("compare_many", fingerprint),
            "status": "complete",
            "base": base.describe(),
            "pairs": [{"tuned": t.name, "task": t.task, "seed": t.seed, "path": t.path, "dir": f"pairs/{t.slug}",
                       "report": f"pairs/{t.slug}/report.html" if runs[t.name].report else None} for t in tuned],
            "slugs": {t.name: t.slug for t in tuned},
            "config": {**config.to_dict(), "tuned": {t.name: t.path for t in tuned}},
            "tables": sorted(tables),
            "skipped_pairs": [n for n, r in finished.items() if r is not None],
            "skipped_experiments": reported_skips(inputs, skips),
            "memory": "all models' weights resident; per batch the activations of the base and one tuned model",
            "wall_time_s": round(time.perf_counter() - t0, 2),
        }
        top.dir.write_manifest(manifest)
        report_path = None
        if report:
            from bertology.report.many import render_many_index

            report_path = render_many_index(top.path, manifest, tables)
        return ManyCompareRun(top.path, runs, tables, manifest, report_path, manifest["skipped_pairs"],
                              manifest["skipped_experiments"])


def plan_experiments(inputs: Inputs, tuned: Sequence[TunedModel], pairs: Sequence[ModelPair],
                     peers: dict[str, tuple[tuple[str, ModelPair], ...]]) -> dict[str, dict[str, str]]:
    """Per tuned model, the selected experiments it cannot run and why (in the context of the other models).

    A model is skipped with its reason while the others run: a regressor among classifiers is not ablated
    on their labels (:func:`bertology.tasks.match.mismatch`). An experiment the user named that can run on
    no model is one refusal naming each model's reason, before anything is written.
    """
    skips: dict[str, dict[str, str]] = {t.name: {} for t in tuned}
    for spec in inputs.selection.experiments:
        for t, pair in zip(tuned, pairs):
            ctx = ExperimentContext(inputs.config, pair, inputs.raw_corpus, Path(inputs.config.out), peers=peers[t.name])
            if (reason := spec.skip_reason(ctx)) is not None:
                skips[t.name][spec.name] = reason
        if spec.name in inputs.selection.named and all(spec.name in s for s in skips.values()):
            reasons = [f"{t.name}: {skips[t.name][spec.name]}" for t in tuned]
            raise BertologyError(spec.refusal(reasons[0].partition(": ")[2] if len(tuned) == 1 else "; ".join(reasons)))
    return skips


def peer_skips(inputs: Inputs, pair: ModelPair, skips: dict[str, str]) -> list[list[str]]:
    """The skips (``[experiment, reason]``) the pair has only because of the other models of the run."""
    ctx = ExperimentContext(inputs.config, pair, inputs.raw_corpus, Path(inputs.config.out))
    return [[name, reason] for name, reason in sorted(skips.items()) if EXPERIMENTS.spec(name).skip_reason(ctx) != reason]


def reported_skips(inputs: Inputs, skips: dict[str, dict[str, str]]) -> list[dict]:
    """The manifest's ``skipped_experiments`` (``tuned, experiment, reason``): the skips a pair's warnings state
    (its experiment has a ``skipped_note``, or the user named it), not those an experiment makes silently."""
    said = {s.name for s in inputs.selection.experiments if s.skipped_note or s.name in inputs.selection.named}
    return [{"tuned": name, "experiment": exp, "reason": reason}
            for name, reasons in skips.items() for exp, reason in reasons.items() if exp in said]


def own_inputs(inputs: Inputs, skips: dict[str, str]) -> Inputs:
    """``inputs`` for one pair: the experiments it skips no longer count as named (a skip with its note, not an error)."""
    if not skips:
        return inputs
    selection = dataclasses.replace(inputs.selection, named=inputs.selection.named - set(skips))
    return dataclasses.replace(inputs, selection=selection)


def _finished_pair(job: PairJob, report: bool) -> CompareRun | None:
    """The pair's earlier run read back, when it finished with this pair's fingerprint (else None: run it).

    A finished pair without a report (an earlier ``--no-report`` run) gets one when ``report`` asks for it.
    """
    run_dir = RunDirectory(job.config.out)
    manifest = run_dir.read_manifest() if run_dir.path.is_dir() else None
    if not manifest or manifest.get("status") != "complete" or manifest.get("fingerprint") != job.fingerprint:
        return None
    if not all(run_dir.has_table(n) for n in manifest.get("tables", [])):
        return None
    results = {n: Result(n, read_table(run_dir.path, n)) for n in manifest.get("tables", [])}
    page = run_dir.path / "report.html"
    if report and not page.exists():
        from bertology.report.render import render_report

        render_report(run_dir.path)
    return CompareRun(run_dir.path, results, manifest, page if page.exists() else None, list(results))


def _run_pairs(config: CompareConfig, todo: list[tuple[TunedModel, PairJob]], report: bool,
               progress: bool) -> dict[str, CompareRun]:
    """Open every pair's folder, stream the corpus once through the shared base and each tuned model, finish each pair."""
    if not todo:
        return {}
    with contextlib.ExitStack() as stack:
        for _, job in todo:
            stack.enter_context(job.open())
        streaming = [(t, j) for t, j in todo if j.todo]
        if streaming:
            encoded = streaming[0][1].inputs.encoded
            label = f"extracting (base + {len(streaming)} tuned)"
            with progress_bar(label, len(encoded.items), progress) as on_batch:
                run_shared_analyses(
                    streaming[0][1].pair.base.model, [TunedConsumers(j.pair.tuned.model, j.todo) for _, j in streaming],
                    streaming[0][1].pair.tokenizer.pad_token_id or 0, encoded,
                    batch_size=config.batch_size, device=config.device, on_batch=on_batch)
        # the base's RSA signatures are the same for every pair: computed once (the base's and one pair's layers kept)
        with reused_signatures(2 * (todo[0][1].pair.num_layers + 1)):
            return {t.name: job.finish(report=report) for t, job in todo}


def combine(tuned: Sequence[TunedModel], runs: dict[str, CompareRun]) -> dict[str, pd.DataFrame]:
    """Every pair table stacked, with ``tuned``, ``task`` and ``seed`` first (task and seed null when unknown).

    Tables are in the order they first appear; a table some pairs lack (an experiment skipped for one
    model) holds the rows of those that have it. A pair table's own column of one of those names (the
    geometry table's sampling ``seed``) is kept as ``<table>_<column>`` (``geometry_seed``).
    """
    names: list[str] = []
    for t in tuned:
        names += [n for n in runs[t.name].results if n not in names]
    out = {}
    for name in names:
        parts = []
        for t in tuned:
            res = runs[t.name].results.get(name)
            if res is None:
                continue
            df = res.table.copy()
            keys = pd.DataFrame({"tuned": [t.name] * len(df), "task": pd.Series([t.task] * len(df), dtype="string"),
                                 "seed": pd.array([t.seed] * len(df), dtype="Int64")}, index=df.index)
            df = df.rename(columns={c: f"{name}_{c}" for c in KEYS if c in df.columns})
            parts.append(pd.concat([keys, df], axis=1))
        out[name] = pd.concat(parts, ignore_index=True)
    return out
