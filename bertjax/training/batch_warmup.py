"""Batch-size warmup (`config.train.batch_warmup_tokens`): the global batch grows from
`batch_warmup_start` rows to `global_batch_size` over the first T tokens, as ModernBERT trains.

One step is compiled, for the full batch of `micro_batches` micro-batches. A smaller batch is the first n of
them with real rows and the rest empty (example weight 0), and the step skips the gradient of an empty
micro-batch (trainer.make_train_step's `skip_empty_micro_batches`), so growing the batch costs no
recompiling and no work on empty rows. The loss takes its denominators from the real rows only, so a step
of n micro-batches is exactly a step of an n-micro-batch batch. The input pipeline reads one micro-batch at
a time and `WarmupBatches` takes n of them a step: the data position a checkpoint saves is in micro-batches,
and the number a step takes is a function of the step alone, so resuming is exact.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from bertjax.data.pretraining import pipeline as pipeline_lib


class BatchWarmup:
    """How many micro-batches step s takes: from start/m to k, linearly in the tokens (rows × sequence length)
    the steps before it took, whole micro-batches, the full batch once `tokens` have gone by."""

    def __init__(self, train: Any, seq_len: int):
        self.micro_batches = train.micro_batches
        self.rows_per_micro_batch = train.global_batch_size // train.micro_batches
        self.first = train.batch_warmup_start // self.rows_per_micro_batch
        self.tokens = train.batch_warmup_tokens
        self.seq_len = seq_len
        self._sizes: list[int] = []  # micro-batches of steps 0, 1, ... while warming up
        self._done_at: Optional[int] = None  # the first step at the full batch

    def micro_batches_at(self, step: int) -> int:
        while self._done_at is None and len(self._sizes) <= step:
            seen = sum(self._sizes) * self.rows_per_micro_batch * self.seq_len
            n = self.first + math.floor((self.micro_batches - self.first) * seen / self.tokens)
            if n >= self.micro_batches:
                self._done_at = len(self._sizes)
            else:
                self._sizes.append(max(n, self.first))
        return self._sizes[step] if step < len(self._sizes) else self.micro_batches

    def rows_at(self, step: int) -> int:
        return self.micro_batches_at(step) * self.rows_per_micro_batch

    def batch_starts(self) -> tuple[int, ...]:
        """The pipeline's first micro-batch of each warmup step, then the warmup's end (after it a step takes
        `micro_batches`): how the input pipeline finds the step of a micro-batch, for its schedules."""
        self.micro_batches_at(10**9)
        return tuple(int(x) for x in np.cumsum([0] + self._sizes))

    def steps(self) -> int:
        """Steps until the full batch."""
        self.micro_batches_at(10**9)
        return len(self._sizes)


def spread(rows: dict[str, np.ndarray], n: int, k: int) -> dict[str, np.ndarray]:
    """n micro-batches' rows (as one batch of n micro-batches takes them: micro-batch i is rows i, i+n, ...) laid
    out as the first n of k micro-batches (micro-batch i of k is rows i, i+k, ...); the others empty."""

    def one(x: np.ndarray) -> np.ndarray:
        per = x.shape[0] // n
        grid = x.reshape((per, n) + x.shape[1:])
        padded = np.zeros((per, k) + x.shape[1:], x.dtype)
        padded[:, :n] = grid
        return padded.reshape((per * k,) + x.shape[1:])

    return {name: one(value) for name, value in rows.items()}


class WarmupBatches:
    """The job's training batches while the batch warms up: step s takes `micro_batches_at(s)` batches of the
    input pipeline (each one micro-batch of this process's rows), spread over the compiled step's micro-batches.
    Checkpoints save and restore the pipeline's position through it."""

    def __init__(self, pipeline: pipeline_lib.InputPipeline, warmup: BatchWarmup, step: int = 0):
        self.pipeline, self.warmup, self.step = pipeline, warmup, step

    def __iter__(self) -> "WarmupBatches":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        n, k = self.warmup.micro_batches_at(self.step), self.warmup.micro_batches
        parts = [next(self.pipeline) for _ in range(n)]
        rows = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        self.step += 1
        return spread(rows, n, k) if n < k else rows

    def rows_at(self, step: int) -> int:
        """Global rows of step `step` (0-based)."""
        return self.warmup.rows_at(step)

    def save_state(self, path: str) -> str:
        return self.pipeline.save_state(path)

    def restore_state(self, path: str) -> None:
        self.pipeline.restore_state(path)

    def reset(self) -> None:
        self.pipeline.reset()
        self.step = 0

    def __getattr__(self, name: str) -> Any:  # damaged, skipped_records, num_examples, ...: the pipeline's
        return getattr(self.pipeline, name)
