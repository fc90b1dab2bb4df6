"""Contrastive fine-tuning into a sentence embedder (dense retrieval):

    python -m bertjax.finetune --config=configs/retrieval.py --workdir=W \\
      --config.train.init_from=MODEL --config.data.train_file=PAIRS.jsonl [--config.data.eval_file=DEV.jsonl]

PAIRS.jsonl holds one `{"query": …, "positive": …}` object a line, optionally with `"negatives": [ … ]` (hard
negatives, the same number on every line). MODEL is anything init_from takes: a bertjax workdir, a Hugging Face
directory, a TF1 checkpoint; BERT or ModernBERT. The recipe is ModernBERT's for MS MARCO (sentence-transformers'
MultipleNegativesRankingLoss, scale 20, lr 8e-5, mean pooling, normalised embeddings); every pair's negatives are
the whole global batch's documents, over every device and host, and `train.micro_batches` splits the batch's
activations into chunks (GradCache) so a batch of thousands of pairs fits. `python -m bertjax.export` of the run
writes a directory sentence-transformers loads as it is.

Argument: `configs/retrieval.py:size=tiny` picks the architecture for random initialisation.
"""

import pathlib
import runpy

import ml_collections

_finetune = runpy.run_path(str(pathlib.Path(__file__).with_name("finetune.py")))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = _finetune["get_config"](arg)
    c.task = "retrieval"
    c.data.max_query_length = 32  # queries are short: they never pay for a passage's length
    c.data.max_seq_length = 256  # passages
    c.data.packing = True  # every text of a batch's pairs shares rows: a short query pays for its own tokens only
    c.train.global_batch_size = 128  # pairs a step: each query's negatives are the other 127 positives (and theirs)
    c.train.micro_batches = 1  # > 1: GradCache chunks; the loss and gradient stay the whole batch's
    c.train.num_epochs = 1.0
    c.optim.learning_rate = 8e-5  # ModernBERT's MS MARCO recipe
    c.optim.bias_correction = True  # torch's AdamW, as the recipe's (sentence-transformers') trainer runs it
    c.checkpoint.every_steps = 500
    c.eval.every_steps = 500
    return c
