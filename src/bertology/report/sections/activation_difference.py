"""The activation-difference lens: the mean of tuned - base by layer, the tokens that moved most, and the readouts
through the models' own heads (Minder et al. 2025)."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import sortable
from bertology.report.sections.base import Section, SectionInput

#: Tokens listed per layer, and vocabulary items per layer of the masked-LM readout.
SHOWN_TOKENS, SHOWN_ITEMS = 5, 8


def token_rows(tokens: pd.DataFrame | None) -> list[list]:
    """Each layer's tokens that moved most: layer, rank, token, distance, context."""
    if tokens is None or tokens.empty:
        return []
    part = tokens[tokens["rank"] < SHOWN_TOKENS].sort_values(["layer", "rank"])
    return [[int(r["layer"]), int(r["rank"]) + 1, str(r["token"]), r["distance"],
             str(r["context"]) if "context" in part else str(r["token"])] for _, r in part.iterrows()]


def readout_rows(readout: pd.DataFrame | None) -> list[list]:
    """The classifier's labels (every one) and the masked-LM head's top items per layer, best first."""
    if readout is None or readout.empty:
        return []
    read = readout[readout["note"].isna()] if "note" in readout else readout
    keep = read[(read["readout"] == "classifier") | (read["rank"] < SHOWN_ITEMS)]
    keep = keep.sort_values(["readout", "vector", "layer", "rank"])
    return [[str(r["readout"]), str(r["vector"]), int(r["layer"]), int(r["rank"]) + 1, str(r["label_or_token"]),
             r["score"]] for _, r in keep.iterrows()]


def activation_difference_section(inp: SectionInput) -> dict | None:
    """The norm-by-layer figure, the facts (largest layer, what each readout did), the token and readout tables."""
    from bertology.viz.activation_difference import difference_by_layer

    table = inp.table("activation_difference")
    if table is None or table.empty:
        return None
    figure = inp.figures.make("activation_difference_by_layer", lambda: difference_by_layer(table),
                              "Left: the norm of the mean activation difference tuned - base at each layer, relative "
                              "to the base's root mean squared activation norm, over content tokens and by position. "
                              "Right: its cosine to the base's mean activation (near 1: the tuned model scales what "
                              "the base already writes).", "Activation difference by layer")
    record = (inp.manifest.get("analyses") or {}).get("activation_difference") or {}
    content = table[table["position"] == "content"]
    facts = []
    if not content.empty:
        top = content.loc[content["relative_norm"].idxmax()]
        facts.append(("Largest difference", f"layer {int(top['layer'])}: norm {top['norm']:.3g} "
                      f"({top['relative_norm']:.1%} of the base's RMS), cosine to the base mean "
                      f"{top['cosine_to_base_mean']:.2f}"))
    for name, note in (record.get("readouts") or {}).items():
        facts.append((f"Readout: {name}", str(note)))
    readout = inp.table("activation_difference_readout")
    rows = readout_rows(readout)
    head = [r for r in rows if r[0] == "classifier" and r[1] == "content" and r[3] == 1]
    if head:
        inp.derived.append({"label": "Label the difference pushes toward", "text": head[0][4],
                            "note": "the mean last-layer difference through the tuned classifier's head"})
    tokens = sortable([("layer", "Layer", "num"), ("rank", "Rank", "num"), ("token", "Token", "text"),
                       ("distance", "||tuned - base||", "num"), ("context", "context", "text")],
                      token_rows(inp.table("activation_difference_tokens")))
    reads = sortable([("readout", "Readout", "text"), ("vector", "Vector", "text"), ("layer", "Layer", "num"),
                      ("rank", "Rank", "num"), ("item", "Label or token", "text"), ("score", "logit change", "num")],
                     rows)
    return {"figures": [f for f in (figure,) if f], "facts": facts, "tokens": tokens, "readout": reads}


SECTION = Section(
    id="activation-difference",
    title="Activation-difference lens",
    tables={"activation_difference": ("layer", "position", "norm", "cosine_to_base_mean", "relative_norm"),
            "activation_difference_tokens": ("layer", "rank", "token", "distance"),
            "activation_difference_readout": ("layer", "readout", "vector", "label_or_token", "score", "rank")},
    build=activation_difference_section,
    template="sections/activation_difference.html.j2",
)
