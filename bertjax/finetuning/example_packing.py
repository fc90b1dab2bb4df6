"""Fine-tuning rows without padding: several examples in a row, the same examples in every step.

Short-text tasks pad most of each row (SST-2's sentences average ~25 tokens at seq 128). `PackedBatches`
serves what `ArrayBatches` would, packed: each batch holds the same examples, drawn in the same order (the
permutation of (seed, epoch)), but placed best-fit decreasing (packing.assign_rows) into a fixed number of
rows, `Layout.rows`: the most that any batch of the run needs, so one compiled step serves them all. The loss
is a mean over the same examples, so the gradients, the learning-rate schedule (it counts examples) and exact
resume are those of padded rows; only the compute spent on padding is gone. Evaluation batches are packed the
same way in input order, and `unpack` turns the outputs back into one padded row per example, in input order,
for the scores and predictions.

A packed row (the layout of pre-training's packed records, data/pretraining/packing.py):
  input_ids, segment_ids [seq]   the examples one after another, then padding (0)
  input_mask [seq]               the example each token belongs to, 1..k; 0 for padding: attention stays
                                 within an example (bertjax.models.attention)
  position_ids [seq]             each token's position within its example, from 0
  cls_positions, cls_weights [k] where each example's [CLS] stands; 1 for a slot in use
  label [k]                      sequence_classification: each example's label
  label_ids, label_weights [seq] token_classification: each token's tag and weight, moved with its example
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional

import numpy as np

from bertjax.finetuning import arrays as arrays_lib
from bertjax.data.pretraining import packing as packing_lib
from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT

PACKED_KEYS = ("position_ids", "cls_positions", "cls_weights")
_TOKEN_KEYS = ("input_ids", "segment_ids", "label_ids", "label_weights")  # moved with their example


@dataclasses.dataclass(frozen=True)
class Layout:
    """The shape of every packed batch on one process: `rows` rows of `seq_len` tokens, at most `slots`
    examples a row."""

    rows: int
    slots: int
    seq_len: int


def example_lengths(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Each example's tokens ([CLS] to its last [SEP]): the padded rows' input_mask."""
    return (arrays["input_mask"] > 0).sum(axis=1)


def assign(lengths: np.ndarray, seq_len: int, max_slots: int) -> list[list[int]]:
    """Positions in `lengths` per row, best-fit decreasing (packing.assign_rows; rows in input order)."""
    if not len(lengths):
        return []
    cfg = packing_lib.PackingConfig(seq_len, max_slots or seq_len, 1)
    return packing_lib.assign_rows(lengths, np.zeros(len(lengths), np.int64), cfg)


def plan_layout(
    batches: arrays_lib.ArrayBatches,
    lengths: np.ndarray,
    seq_len: int,
    max_slots: int,
    num_batches: int,
    row_multiple: int = 1,
) -> Layout:
    """The layout that fits every one of the first `num_batches` batches of every process: rows and slots
    are the most any of them needs (rows rounded up to `row_multiple`, so the mesh and micro-batches can
    split them)."""
    rows = slots = 1
    for epoch, position in _batch_numbers(batches, num_batches):
        for process in range(batches.process_count):
            index = batches.indices(epoch, position, process)
            groups = assign(lengths[index], seq_len, max_slots)
            rows = max(rows, len(groups))
            slots = max(slots, max((len(g) for g in groups), default=1))
    return Layout(math.ceil(rows / row_multiple) * row_multiple, slots, seq_len)


def _batch_numbers(batches: arrays_lib.ArrayBatches, num_batches: int) -> Iterator[tuple[int, int]]:
    for n in range(num_batches):
        yield divmod(n, batches.batches_per_epoch)


def pack(
    arrays: dict[str, np.ndarray], index: np.ndarray, groups: list[list[int]], layout: Layout, lengths: np.ndarray
) -> dict[str, np.ndarray]:
    """The examples `index[g]` of each group `g` in one row each: a batch of `layout.rows` rows (rows no
    group uses are empty: padding)."""
    if len(groups) > layout.rows or any(len(g) > layout.slots for g in groups):
        raise ValueError(
            f"a batch needs {len(groups)} packed rows of up to {max(map(len, groups))} examples, more "
            f"than the layout's {layout.rows} rows of {layout.slots}: plan the layout over every batch."
        )
    rows, seq, k = layout.rows, layout.seq_len, layout.slots
    out = {key: np.zeros((rows, seq), arrays[key].dtype) for key in _TOKEN_KEYS if key in arrays}
    out.update(
        input_mask=np.zeros((rows, seq), np.int32),
        position_ids=np.zeros((rows, seq), np.int32),
        cls_positions=np.zeros((rows, k), np.int32),
        cls_weights=np.zeros((rows, k), np.float32),
    )
    if "label" in arrays:
        out["label"] = np.zeros((rows, k), arrays["label"].dtype)
    for r, group in enumerate(groups):
        start = 0
        for slot, position in enumerate(group):
            i, n = index[position], int(lengths[index[position]])
            span = slice(start, start + n)
            for key in _TOKEN_KEYS:
                if key in out:
                    out[key][r, span] = arrays[key][i, :n]
            out["input_mask"][r, span] = slot + 1
            out["position_ids"][r, span] = np.arange(n)
            out["cls_positions"][r, slot] = start
            out["cls_weights"][r, slot] = 1.0
            if "label" in out:
                out["label"][r, slot] = arrays["label"][i]
            start += n
    # Every row counts as computed (an unused one holds no example: its cls_weights and label_weights are 0),
    # so the log's examples/s, real tokens/s and padding count the rows the step really runs.
    out[EXAMPLE_WEIGHT] = np.ones(rows, np.float32)
    return out


class OverArrayBatches:
    """Batches made from the indices an `ArrayBatches` (`self.examples`) serves: its order, its size and its
    state (epoch, position), so that a resumed run sees exactly the batches it would have."""

    examples: arrays_lib.ArrayBatches

    @property
    def batches_per_epoch(self) -> int:
        return self.examples.batches_per_epoch

    @property
    def num_batches(self) -> int:
        return self.examples.num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def save_state(self, path: str) -> str:
        return self.examples.save_state(path)

    def restore_state(self, path: str) -> None:
        self.examples.restore_state(path)


class PackedBatches(OverArrayBatches):
    """`ArrayBatches`' examples, batch by batch, packed into `layout`; `placements` says where each example of an
    eval batch went, for `unpack`."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        batch_size: int,
        training: bool,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        *,
        max_slots: int = 0,
        num_batches: Optional[int] = None,
        row_multiple: int = 1,
        layout: Optional[Layout] = None,
    ):
        """`batch_size`: this process's examples per batch; `num_batches`: the batches the run will draw
        (training: its steps; default one epoch), over which the layout is planned unless given."""
        self.arrays = arrays
        self.lengths = example_lengths(arrays)
        n = len(self.lengths)
        self.examples = arrays_lib.ArrayBatches(
            {"index": np.arange(n)}, batch_size, training, seed, process_index, process_count
        )
        self.rows, self.training, self.max_slots = n, training, max_slots
        seq_len = arrays["input_ids"].shape[1]
        self.layout = layout or plan_layout(
            self.examples,
            self.lengths,
            seq_len,
            max_slots,
            num_batches or self.examples.batches_per_epoch,
            row_multiple,
        )
        # Eval: per batch served, each example's (index, row, slot, first token), for `unpack`.
        self.placements: list[np.ndarray] = []

    def __next__(self) -> dict[str, np.ndarray]:
        position = self.examples.position
        batch = next(self.examples)
        index = batch["index"][batch[EXAMPLE_WEIGHT] > 0]
        if self.training:
            return pack(self.arrays, index, self._assign(index), self.layout, self.lengths)
        # Eval: where every process's examples go in the global batch (whose rows predict_step returns).
        placed, groups = [], []
        for process in range(self.examples.process_count):
            theirs = self.examples.indices(0, position, process)
            their_groups = self._assign(theirs)
            if process == self.examples.process_index:
                groups = their_groups  # `index`'s own: the same rows
            for r, group in enumerate(their_groups):
                starts = np.cumsum([0] + [int(self.lengths[theirs[p]]) for p in group])
                placed += [
                    (theirs[p], process * self.layout.rows + r, slot, starts[slot]) for slot, p in enumerate(group)
                ]
        self.placements.append(np.array(placed, np.int64).reshape(-1, 4))
        return pack(self.arrays, index, groups, self.layout, self.lengths)

    def _assign(self, index: np.ndarray) -> list[list[int]]:
        return assign(self.lengths[index], self.layout.seq_len, self.max_slots)

    def reset(self) -> None:
        self.examples.reset()
        self.placements = []

    def unpack(self, outputs: list[np.ndarray], per_token: bool) -> np.ndarray:
        """Eval: the outputs of each global batch served since `reset` (every process's rows, as predict_step
        returns them; per example slot: [rows, slots, ...], `per_token`: [rows, seq, ...]) → one row per
        example, in input order: [examples, ...], or per token [examples, seq, ...] at the padded rows'
        positions (zeros past an example's end)."""
        shape = (self.rows,) + ((self.layout.seq_len,) if per_token else ()) + outputs[0].shape[2:]
        out = np.zeros(shape, outputs[0].dtype)
        for placed, values in zip(self.placements, outputs):
            examples, rows, slots, starts = placed.T
            if not per_token:
                out[examples] = values[rows, slots]
                continue
            for i, r, start in zip(examples, rows, starts):
                n = int(self.lengths[i])
                out[i, :n] = values[r, start : start + n]
        return out

    def padding(self) -> tuple[float, float]:
        """The share of tokens that are padding: (in padded rows, in these packed rows), on average."""
        seq = self.layout.seq_len
        mean = float(self.lengths.mean())
        return 1 - mean / seq, 1 - min(1.0, mean * self.examples.batch_size / (self.layout.rows * seq))
