"""Data layer: tokenizers, corpus sources, masked instances, TFRecords and the input pipeline."""
