"""Models in and out as other tools and earlier runs hold them: a bertjax workdir's checkpoint, a Hugging Face or
TF1 directory, a sentence-transformers directory. Above training (it reads workdirs' checkpoints) and below the
jobs; each family's own file formats and name tables stay with the family (models/<family>/hf.py, tf1.py)."""
