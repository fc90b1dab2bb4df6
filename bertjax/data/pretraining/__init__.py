"""Pre-training records: instances.py (sentence pairs, truncation, masking), packing.py (several instances a
row), records.py (google-research/bert's TFRecord schema, metadata.json), record_sets.py (a set's files checked,
scanned, split over processes), shards.py (shards written by local workers or Beam) and pipeline.py (tf.data:
shards → per-process numpy batches, resumable). No JAX: record preparation runs without it."""
