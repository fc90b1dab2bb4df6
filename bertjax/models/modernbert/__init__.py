"""ModernBERT (AnswerDotAI, transformers' ModernBertForMaskedLM): config.py the architecture (no JAX),
model.py the Flax modules and fine-tuning heads, hf.py transformers directories both ways. The family
contract: models/__init__.py."""
