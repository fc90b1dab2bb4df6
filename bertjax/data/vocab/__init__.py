"""Vocabularies: tokenization.py (WordPiece exactly as BERT's, SentencePiece, any tokenizer.json), training.py
(vocabularies learned reproducibly) and check.py (the vocab, config.model.vocab_size and the records agree)."""
