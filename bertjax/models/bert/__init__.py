"""BERT (google-research/bert, transformers' BertForPreTraining): config.py the architecture (no JAX),
model.py the Flax modules, heads.py the fine-tuning heads, hf.py transformers directories both ways, tf1.py
google-research/bert's TF1 checkpoints in. The family contract: models/__init__.py."""
