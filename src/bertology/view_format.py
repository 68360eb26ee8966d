"""The attention view: the JSON contract between the code that computes it and the code that draws it.

:mod:`bertology.activations.views` runs the models and writes a *view*; :mod:`bertology.viz.viewer`
draws one (page, fragment, notebook). Both read the contract from here, so neither imports the other.
A view is a plain JSON-serialisable dict, stored by the pipeline as ``views/*.json``::

    {
      "format": "bertology-attention-view", "version": 1,
      "text": str, "text_pair": str | None,
      "tokens": [str, ...],                 # convert_ids_to_tokens, [CLS]/[SEP] included
      "segments": [0 | 1, ...],             # sentence A / B of each token
      "special": [bool, ...],               # special tokens ([CLS], [SEP], <s> ...)
      "n_layers": N, "n_heads": H, "layers": [1, ..., N],
      "models": [{"name": "base", "model": "minilm"}, ...],   # one or two
      "attention": {"base": [[[[w, ...]]]], ...},           # [layer-1][head][query][key]
      "decimals": 4,
      "measure": "norm",                    # only when the maps are a contribution measure's, not the weights
    }

``attention[name][l - 1]`` is attention layer ``l`` (DESIGN §3: layers 1..N, heads 0-based, labels
``L{layer}H{head}``). Weights are rounded to :data:`DECIMALS` decimals, so each stored number costs
about 6-7 bytes of JSON: a view weighs roughly ``models × N × H × n² × 7`` bytes for ``n`` tokens
(MiniLM, 6 × 12 heads, a 12-token sentence: ~70 kB per model; 128 tokens: ~8 MB per model). The diff
(second − first) is computed in the browser and by ``AttentionView.diff``.
"""
from __future__ import annotations

#: The ``format`` field of every view.
FORMAT = "bertology-attention-view"
#: The ``version`` field (and the page's ``data-bertology-view`` attribute).
VERSION = 1
#: Decimals the attention weights are rounded to.
DECIMALS = 4
