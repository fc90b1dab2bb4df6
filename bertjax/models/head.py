"""What a fine-tuning task puts on an encoder, described without naming the task: a family builds it.

A task (finetuning/tasks/) supplies its `Head`; a family (models/<family>/heads.py) builds the body and this output
layer, and its hf.py exports them as transformers' `<Family>For<hf_class>`. So adding a task is its file and its
registry line, with no edit in any family, as long as its head is one of these shapes.
"""

from __future__ import annotations

import dataclasses

READS = ("pooled", "tokens")


@dataclasses.dataclass(frozen=True)
class Head:
    reads: str  # pooled: one vector an example (the family's pooling: BERT's pooler, ModernBERT's cls or mean); tokens
    outputs: int  # the output layer's features: the labels, 1 for a regression, 2 for a span's start and end
    hf_class: str  # transformers' class suffix: <Family>For<hf_class> (SequenceClassification, ...)
    name: str = "classifier"  # the output layer's parameters, named as in that class
    dropout: bool = True  # dropout before the output layer (BERT's run_squad.py has none before qa_outputs)

    def __post_init__(self):
        if self.reads not in READS:
            raise ValueError(f"Head.reads={self.reads!r} is not one of {list(READS)}.")
        if self.outputs < 1:
            raise ValueError(f"Head.outputs={self.outputs} must be ≥ 1 (no head: the encoder alone).")
