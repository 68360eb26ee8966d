"""Weight-space change: how far fine-tuning moved each weight matrix, and whether it grew intruder dimensions.

No data and no forward pass: the two models' weights are read through the family's
:class:`~bertology.models.adapters.base.WeightLayout` and compared unit by unit with
:func:`bertology.metrics.weights.matrix_change` (relative Frobenius change, the difference's stable rank and
leading singular values, intruder dimensions after Shuttleworth et al. 2024).

A **unit** is one weight tensor of one module at one depth: ``layer`` 0 holds what runs before block 1
(embeddings, their norm and projection, relative-position tables), ``1..N`` the blocks, ``N`` also what runs
after the last block (ModernBERT's final norm). ``module`` is a canonical name shared by every family
(``query, key, value, attention_output, attention_norm, ffn_in, ffn_out, ffn_norm``, ...), so tables of two
families line up. The attention projections also get one row per head (``head`` 0-based, null on the
module's own row): rows ``h*d:(h+1)*d`` of query, key and value, columns ``h*d:(h+1)*d`` of the output.

Explicit cases: ALBERT's shared blocks are one unit per distinct block (``layer`` = the first depth that runs
it, ``shared_by`` = how many depths run it), never repeated per depth. Embedding tables whose row counts differ
(a resized vocabulary with the same tokenizer; ``compare`` refuses different tokenizers) compare the rows both
models have (the ids both read) and say so in ``note``; any other shape difference leaves the unit's numbers
null with the reason in ``note``. Biases are compared as ``bias_change`` (relative) beside their weight.
Task heads (a classifier's head, which the base lacks) and the pooler are not compared; every encoder
parameter left out is named in the manifest section.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from torch import nn

from bertology.config import CompareConfig
from bertology.errors import BertologyError
from bertology.extremes import significant_to_tell
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.metrics.weights import MatrixChange, matrix_change, relative_change
from bertology.models.adapters import adapter_for, get_path
from bertology.models.sites import encoder
from bertology.reach import SeedNoise, changes
from bertology.results import Result
from bertology.settings import Setting

TABLE = "weight_change"
#: Modules split per head: by rows (query, key, value) or by columns (the output projection's input).
PER_HEAD = {"query": "rows", "key": "rows", "value": "rows", "attention_output": "columns"}
PAPER = "Shuttleworth et al. 2024"


@dataclass(frozen=True)
class WeightSettings:
    """What changes the numbers: leading singular values listed, intruder ``k`` and ``epsilon``."""

    singular_values: int = 3
    intruder_k: int = 10
    intruder_epsilon: float = 0.5

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Unit:
    """One weight tensor of base and tuned model at one depth (biases beside, None where there is none)."""

    layer: int
    module: str
    base: torch.Tensor
    tuned: torch.Tensor
    base_bias: torch.Tensor | None = None
    tuned_bias: torch.Tensor | None = None
    shared_by: int = 1
    embedding: bool = False  # rows are ids: a different row count is a resized table


# ------------------------------------------------------------------------------------------ finding weights
def _lookup(root: nn.Module, path: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor | None] | None:
    """``(module, weight, bias)`` at ``path`` (``:i/n`` = row chunk ``i`` of ``n``); None when absent or weightless."""
    path, _, chunk = path.partition(":")
    module = get_path(root, path)
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    bias = getattr(module, "bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None
    if chunk:
        i, n = (int(x) for x in chunk.split("/"))
        rows = weight.shape[0] // n
        sl = slice(i * rows, (i + 1) * rows)
        weight, bias = weight[sl], None if bias is None else bias[sl]
    return module, weight, bias


def _distinct_blocks(blocks: list[nn.Module]) -> list[tuple[int, int]]:
    """``(first depth, number of depths)`` per distinct block module (ALBERT runs one module at many depths)."""
    first: dict[int, list[int]] = {}
    for depth, block in enumerate(blocks, 1):
        first.setdefault(id(block), []).append(depth)
    return [(depths[0], len(depths)) for depths in first.values()]


def _units_at(layer: int, roots: tuple[nn.Module, nn.Module], paths: Mapping[str, str], shared_by: int = 1,
              covered: set[int] | None = None) -> Iterator[Unit]:
    """The units of ``paths`` under base and tuned ``roots`` (a module either model lacks is a null row)."""
    for module, path in paths.items():
        found = [_lookup(root, path) for root in roots]
        if found[0] is None and found[1] is None:
            continue
        if found[0] is None or found[1] is None:
            raise BertologyError(f"weight_change: only the {'tuned' if found[0] is None else 'base'} model has "
                                 f"{path} at layer {layer}; the two models do not share one layout.")
        (mod_b, w_b, b_b), (mod_t, w_t, b_t) = found
        if covered is not None:
            covered.update(id(p) for p in (*mod_b.parameters(recurse=False), *mod_t.parameters(recurse=False)))
        yield Unit(layer, module, w_b, w_t, b_b, b_t, shared_by, isinstance(mod_b, nn.Embedding))


def weight_units(base: nn.Module, tuned: nn.Module, covered: set[int] | None = None) -> list[Unit]:
    """Every unit of the pair, in table order (embeddings, blocks 1..N, after the last block).

    ``covered`` (optional) receives the ids of every parameter read, to name those left out.
    """
    ad = adapter_for(base)
    if ad.weights is None:
        raise BertologyError(f"weight_change: no weight layout for the {ad.family} family.")
    layout = ad.weights
    enc = (encoder(base), encoder(tuned))
    units = list(_units_at(0, enc, layout.embeddings, covered=covered))
    blocks = (ad.block_list(enc[0]), ad.block_list(enc[1]))
    for depth, count in _distinct_blocks(blocks[0]):
        pair = (blocks[0][depth - 1], blocks[1][depth - 1])
        units += _units_at(depth, pair, layout.block, count, covered)
    units += _units_at(len(blocks[0]), enc, layout.top, covered=covered)
    return units


def left_out(model: nn.Module, covered: set[int]) -> list[str]:
    """The encoder's parameters no unit read (the pooler, DeBERTa's convolution...), by name."""
    return [name for name, p in encoder(model).named_parameters() if id(p) not in covered]


# ------------------------------------------------------------------------------------------- the numbers
def _aligned(unit: Unit) -> tuple[torch.Tensor, torch.Tensor, str] | str:
    """Base and tuned weights of one shape and a note; or, when they cannot be compared, the reason."""
    b, t = unit.base, unit.tuned
    if b.shape == t.shape:
        return b, t, ""
    if unit.embedding and b.shape[1:] == t.shape[1:]:
        n = min(b.shape[0], t.shape[0])
        return b[:n], t[:n], (f"resized table: {b.shape[0]} vs {t.shape[0]} rows; rows 0-{n - 1} (the ids both "
                              "models read) compared")
    return f"shapes differ ({_shape(b)} vs {_shape(t)}): not compared"


def _shape(w: torch.Tensor) -> str:
    return "x".join(str(d) for d in w.shape)


def _bias_change(b: torch.Tensor | None, t: torch.Tensor | None) -> float | None:
    if b is None or t is None or b.shape != t.shape:
        return None
    return relative_change(b, t)[0]


def _row(unit: Unit, head: int | None, change: MatrixChange | None, shape: str, note: str,
         bias: float | None, settings: WeightSettings) -> dict:
    """One table row (every number null when ``change`` is None)."""
    c = change or MatrixChange(None, float("nan"), float("nan"))
    svs = list(c.singular_values) + [None] * (settings.singular_values - len(c.singular_values))
    return {"layer": unit.layer, "module": unit.module, "head": head, "shape": shape, "shared_by": unit.shared_by,
            "relative_change": c.relative_change, "delta_norm": c.delta_norm, "base_norm": c.base_norm,
            "stable_rank": c.stable_rank, **{f"delta_sv_{i}": v for i, v in enumerate(svs, 1)},
            "intruders": c.intruders, "top_k": c.top_k, "alignment_min": c.alignment_min,
            "bias_change": bias, "note": note}


def _head_slices(unit: Unit, b: torch.Tensor, t: torch.Tensor, num_heads: int) -> Iterator[tuple[int, tuple, tuple]]:
    """``(head, (base, tuned), (base bias, tuned bias))`` per head of a per-head module."""
    by = PER_HEAD[unit.module]
    size = (b.shape[0] if by == "rows" else b.shape[1]) // num_heads
    for h in range(num_heads):
        sl = slice(h * size, (h + 1) * size)
        if by == "rows":
            biases = (None, None) if unit.base_bias is None else (unit.base_bias[sl], unit.tuned_bias[sl])
            yield h, (b[sl], t[sl]), biases
        else:  # the output projection's bias is added after the heads are summed: no per-head bias
            yield h, (b[:, sl], t[:, sl]), (None, None)


def unit_rows(unit: Unit, settings: WeightSettings, num_heads: int) -> list[dict]:
    """The unit's row and, for the attention projections, one row per head."""
    aligned = _aligned(unit)
    if isinstance(aligned, str):
        return [_row(unit, None, None, f"{_shape(unit.base)} vs {_shape(unit.tuned)}", aligned, None, settings)]
    b, t, note = aligned
    opts = dict(n_singular=settings.singular_values, k=settings.intruder_k, epsilon=settings.intruder_epsilon)
    rows = [_row(unit, None, matrix_change(b, t, **opts), _shape(b), note,
                 _bias_change(unit.base_bias, unit.tuned_bias), settings)]
    if unit.module in PER_HEAD and b.ndim == 2:
        for h, (hb, ht), (bb, bt) in _head_slices(unit, b, t, num_heads):
            rows.append(_row(unit, h, matrix_change(hb, ht, **opts), _shape(hb), note, _bias_change(bb, bt), settings))
    return rows


@contextlib.contextmanager
def one_torch_thread() -> Iterator[int]:
    """Torch's intra-op threads set to 1 inside the block (restored after); yields the count it found.

    Why: LAPACK's SVD split over threads is slower than one thread per matrix on small and mid-sized
    matrices (measured on 2 shared cores: a 768 x 768 SVD 0.11 s on one thread, 0.5-0.8 s on two; a 64 x 768
    head slice 2.5 ms vs 100 ms), so :func:`weight_change_table` runs one matrix per thread, several at once,
    and each unit's numbers do not depend on the machine's core count.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield before
    finally:
        torch.set_num_threads(before)


def weight_change_table(base: nn.Module, tuned: nn.Module, settings: WeightSettings = WeightSettings(),
                        on_unit: Callable[[], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """The ``weight_change`` table of two models of one family, and its manifest facts (what was left out).

    Units are computed side by side, one single-threaded SVD each (:func:`one_torch_thread`), as many at once
    as torch had threads; ``on_unit`` (optional) is called after each unit (a progress bar's ``advance``).
    """
    covered: set[int] = set()
    units = weight_units(base, tuned, covered)
    heads = int(base.config.num_attention_heads)

    def rows_of(unit: Unit) -> list[dict]:
        with torch.inference_mode():
            return unit_rows(unit, settings, heads)

    rows: list[dict] = []
    with one_torch_thread() as threads, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for out in pool.map(rows_of, units):
            rows += out
            if on_unit is not None:
                on_unit()
    table = pd.DataFrame(rows)
    table["head"] = table["head"].astype("Int64")
    for col in ("intruders", "top_k"):
        table[col] = table[col].astype("Int64")
    info = {"n_units": len(units), "not_compared": left_out(base, covered),
            "shared_blocks": bool((table["shared_by"] > 1).any()),
            "notes": sorted({n for n in table["note"] if n})}
    return table, info


# ------------------------------------------------------------------------------------- inside compare
def settings_from(config: CompareConfig) -> WeightSettings:
    """The weight comparison's settings inside ``compare``."""
    return WeightSettings(config.weight_singular_values, config.intruder_k, config.intruder_epsilon)


def skip_reason(ctx: ExperimentContext) -> str | None:
    """Weights in a narrower dtype than float32 were rounded on loading by as much as fine-tuning moves them."""
    dtype = next(ctx.pair.base.model.parameters()).dtype
    if dtype != torch.float32:
        return (f"the models run in {str(dtype).replace('torch.', '')} here, and rounding the weights to it moves them "
                "about as much as fine-tuning does; run with --dtype float32")
    if adapter_for(ctx.pair.base.model).weights is None:
        return f"the {adapter_for(ctx.pair.base.model).family} family has no weight layout"
    return None


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """The table from the pair's weights (a progress bar over units when asked)."""
    from bertology.progress import BarText, progress_bar

    settings = settings_from(ctx.config)
    base, tuned = ctx.pair.base.model, ctx.pair.tuned.model
    total = len(weight_units(base, tuned))
    with progress_bar("weight change", total, ctx.progress, text=BarText(unit="matrices")) as advance:
        table, info = weight_change_table(base, tuned, settings, on_unit=advance)
    section = {"settings": settings.to_dict(), **info,
               "unit": "one weight tensor of one module at one depth; attention projections also per head"}
    return ExperimentOutcome({TABLE: Result(TABLE, table, settings.to_dict())}, jsonable(section))


def module_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The units' own rows (no per-head rows) that were compared."""
    return table[table["head"].isna() & table["relative_change"].notna()]


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """The matrices that moved most, and how many intruder dimensions the tuned model has."""
    t = module_rows(tables[TABLE])
    if t.empty:
        return None
    ranked = t[t["relative_change"] > 0].sort_values("relative_change", ascending=False)
    n = significant_to_tell(ranked["relative_change"].tolist(), 3)  # each pick told from the next one
    largest = ", ".join(f"L{r.layer} {r.module} ({r.relative_change:.{n}g})" for r in ranked.head(3).itertuples()) or "none"
    matrices = t.dropna(subset=["intruders"])
    k = int(matrices["top_k"].max()) if len(matrices) else 0
    return (f"weight change: largest relative change {largest}; intruder dimensions "
            f"{int(matrices['intruders'].sum())} in {int((matrices['intruders'] > 0).sum())} of {len(matrices)} matrices "
            f"(among each one's top {k} singular vectors)")


SETTINGS = (
    Setting("weight_singular_values", 3, "Leading singular values of each weight difference listed in the table.",
            minimum=1),
    Setting("intruder_k", 10, "Intruder dimensions are counted among the tuned matrix's top k singular vectors.",
            minimum=1, paper=PAPER),
    Setting("intruder_epsilon", 0.5, "A tuned singular vector whose largest |cosine| with every base singular vector "
            "is below this is an intruder dimension.", above=0.0, maximum=1.0, paper=PAPER),
)

SPEC = ExperimentSpec("weight_change", "the weight-space change", lambda config: (TABLE,), settings_from, skip_reason,
                      _run, skipped_note="Weight-space change skipped: {reason}.", summary=summary, settings=SETTINGS,
                      seed_noise=SeedNoise(True, changes.weight_change))
