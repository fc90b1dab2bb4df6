"""Data: files.py (the one file layer: local paths and object stores, the one place that tells them apart),
corpus/ (where documents come from), pretraining/ (masked instances, packed rows, TFRecords, the input
pipeline) and vocab/ (tokenizers, vocabulary training and checks). Fine-tuning's labelled data is in
finetuning/."""
