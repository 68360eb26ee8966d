"""Every streaming analysis, one line each: its name and the module that ends with its ``SPEC``."""
from __future__ import annotations

from bertology.analyses.registry import AnalysisSpec
from bertology.catalog import Catalog

#: In the order the analyses are fed during extraction and listed to the user.
ANALYSES: Catalog[AnalysisSpec] = Catalog("analysis", {
    "attention_change": "bertology.analyses.attention_change",
    "attention_patterns": "bertology.analyses.attention_patterns",
    "representation_similarity": "bertology.analyses.representation_similarity",
    "attention_targets": "bertology.analyses.attention_targets",
    "relation_heads": "bertology.analyses.relation_heads",
    "head_map": "bertology.analyses.head_map",
    "geometry": "bertology.analyses.geometry",
    "pca_views": "bertology.analyses.pca_views",
}, AnalysisSpec)
