"""Corpora: reading them, tokenising them, and aligning sub-words to words."""
from bertology.data.corpus import Corpus, Example
from bertology.data.loaders import load_corpus

__all__ = ["Corpus", "Example", "load_corpus"]
