"""Pre-training records: instances.py (sentence pairs, truncation, masking), packing.py (several instances a
row), records.py (google-research/bert's TFRecord schema, metadata.json, a record set checked), shards.py
(shards written by local workers or Beam) and pipeline.py (tf.data: shards → per-process numpy batches,
resumable). No JAX: record preparation runs without it."""
