"""ModernBERT (AnswerDotAI, transformers' ModernBertForMaskedLM): config.py the architecture (no JAX),
model.py the Flax modules, heads.py the fine-tuning heads, hf.py transformers directories both ways. The family
contract: models/__init__.py."""
