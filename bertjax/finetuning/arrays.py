"""Batches of in-memory rows: fine-tuning sets are thousands of examples, not billions of tokens.

`ArrayBatches` serves rows already converted to fixed-shape arrays. Training: epoch after epoch, each a
permutation drawn from (seed, epoch), every process taking its own slice of each global batch; its
position is two integers, saved with checkpoints (`save_state` / `restore_state`, as `InputPipeline`),
so a resumed job sees exactly the batches it would have seen. Evaluation: one pass in order, the last
batch padded with rows of `example_weight` 0, the same number of batches on every process.
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterator, Optional

import numpy as np

from bertjax.runtime import files
from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT, PipelineMismatch


class ArrayBatches:
    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        batch_size: int,
        training: bool,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ):
        """`arrays`: name → [rows, …]; `batch_size`: this process's rows per batch."""
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"arrays of different lengths: {lengths}")
        self.arrays, self.rows = arrays, next(iter(lengths.values()))
        if not self.rows:
            raise ValueError("no rows to batch")
        self.batch_size, self.training, self.seed = batch_size, training, seed
        self.process_index, self.process_count = process_index, process_count
        global_batch = batch_size * process_count
        # Training drops the last partial batch of each epoch (its rows come first in another epoch's
        # order); evaluation keeps every row.
        self.batches_per_epoch = max(1, self.rows // global_batch) if training else math.ceil(self.rows / global_batch)
        self.num_batches = self.batches_per_epoch
        self.epoch = self.position = 0
        self._order_cache: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every row in the order of `epoch` (training: a permutation of (seed, epoch); eval: in order)."""
        if not self.training:
            return np.arange(self.rows)
        if self._order_cache[0] != epoch:  # one permutation per epoch, not per batch
            order = np.random.default_rng([self.seed, epoch]).permutation(self.rows)
            need = self.batches_per_epoch * self.batch_size * self.process_count
            self._order_cache = epoch, (np.resize(order, need) if need > self.rows else order)  # too few: repeat
        return self._order_cache[1]

    def indices(self, epoch: int, position: int, process_index: Optional[int] = None) -> np.ndarray:
        """The rows of batch `position` of `epoch` on a process (default: this one); fewer than batch_size
        at the end of an eval pass."""
        process = self.process_index if process_index is None else process_index
        start = position * self.batch_size * self.process_count + process * self.batch_size
        return self.epoch_order(epoch)[start : start + self.batch_size]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.position == self.batches_per_epoch:
            if not self.training:
                raise StopIteration
            self.epoch, self.position = self.epoch + 1, 0
        index = self.indices(self.epoch, self.position)
        self.position += 1
        batch = {name: a[index] for name, a in self.arrays.items()}
        weight = np.ones(len(index), np.float32)
        if len(index) < self.batch_size:  # the end of an eval pass: padding rows count for nothing
            pad = self.batch_size - len(index)
            batch = {name: np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)]) for name, a in batch.items()}
            weight = np.concatenate([weight, np.zeros(pad, np.float32)])
        batch[EXAMPLE_WEIGHT] = weight
        return batch

    def reset(self) -> None:
        self.epoch = self.position = 0

    # --- State, as InputPipeline's: a file per process under a prefix ------------------------------------
    def _fingerprint(self) -> dict:
        return {
            "rows": self.rows,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "training": self.training,
            "process_index": self.process_index,
            "process_count": self.process_count,
        }

    def save_state(self, path: str) -> str:
        files.makedirs(os.path.dirname(path) or ".")
        state = dict(self._fingerprint(), epoch=self.epoch, position=self.position)
        files.write_whole(path + ".pipeline.json", json.dumps(state, sort_keys=True))
        return path

    def restore_state(self, path: str) -> None:
        saved = files.read_json(path + ".pipeline.json")
        mine = self._fingerprint()
        diff = sorted(k for k in mine if saved.get(k) != mine[k])
        if diff:
            raise PipelineMismatch(
                f"{path}.pipeline.json: the saved data position differs in {', '.join(diff)}; "
                "resume with the data and config it was saved with."
            )
        self.epoch, self.position = saved["epoch"], saved["position"]
