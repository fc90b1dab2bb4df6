"""Corpus sources: where documents come from. base.py what every source shares (Source, CorpusStats,
sentence splitting, globs), sources.py text files, TFDS and builtin:pydocs and `open_source(spec)` that picks
one, table.py Parquet / JSON Lines / Arrow, hf_datasets.py `hf:DIR`, text_checks.py files that are not text.
Adding a source: a Source subclass in its own module, and its spec in sources.open_source."""
