"""Contrastive pairs without padding: every text of a batch (queries, positives, hard negatives) shares packed rows,
so a 10-token query and a 200-token passage cost their own tokens, not 2 × max_seq_length.

`PackedPairs` serves what `ArrayBatches` serves of the pair arrays (tasks/retrieval.py), the same pairs in the same
order, packed: the texts of each GradCache chunk (config.train.micro_batches; the pairs c, c + chunks, … of a
process's batch, as contrastive.split_chunks takes them) are placed best-fit decreasing (example_packing.assign)
into that chunk's rows. A batch:
  input_ids [rows, seq]          the texts one after another, then padding (0)
  input_mask [rows, seq]         the text each token belongs to, 1..k (attention stays within a text)
  position_ids [rows, seq]       each token's position within its text
  cls_positions [rows, k]        where each text's first token ([CLS]) stands
  query_slot [pairs]             where each query's embedding is: (row within its chunk, over every process) × k + slot
  document_slot [pairs, 1 + K]   the same for its positive and hard negatives
  document_hash, example_weight  as the padded pairs'
Rows are laid out as the chunks split them (chunk c's j-th row at c + chunks · j), so each chunk's slots index its
own rows. The layout (rows per chunk, slots) is the most any batch of the run needs: one compiled step serves all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from bertjax.data.pretraining.pipeline import EXAMPLE_WEIGHT
from bertjax.finetuning import arrays as arrays_lib
from bertjax.finetuning import example_packing


@dataclasses.dataclass(frozen=True)
class PairLayout:
    """Every packed batch on one process: `chunks` × `rows_per_chunk` rows of `seq_len`, at most `slots` texts
    a row."""

    chunks: int
    rows_per_chunk: int
    slots: int
    seq_len: int

    @property
    def rows(self) -> int:
        return self.chunks * self.rows_per_chunk


class PackedPairs(example_packing.OverArrayBatches):
    """The pairs of `arrays` (padded, tasks/retrieval.py's rows) batch by batch, packed."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        batch_size: int,
        training: bool,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        *,
        chunks: int = 1,
        row_multiple: int = 1,
        max_slots: int = 0,
        num_batches: Optional[int] = None,
    ):
        """`batch_size`: this process's pairs a batch (a multiple of `chunks`); `row_multiple`: rows per chunk
        round up to it (the devices a process feeds); `num_batches`: the batches the layout must serve."""
        self.arrays, self.chunks, self.max_slots = arrays, chunks, max_slots
        self.query_lengths = (arrays["query_mask"] > 0).sum(axis=1)
        self.document_lengths = (arrays["document_mask"] > 0).sum(axis=2)  # [pairs, 1 + K]
        self.per_pair = self.document_lengths.shape[1]
        self.rows = len(self.query_lengths)  # pairs (ArrayBatches' name)
        self.examples = arrays_lib.ArrayBatches(
            {"index": np.arange(self.rows)}, batch_size, training, seed, process_index, process_count
        )
        seq_len = arrays["document_ids"].shape[2]
        rows, slots = 1, 1
        for n in range(num_batches or self.examples.batches_per_epoch):
            epoch, position = divmod(n, self.examples.batches_per_epoch)
            for process in range(process_count):
                index = self.examples.indices(epoch, position, process)
                for c in range(chunks):
                    groups = self._assign(index[c::chunks], seq_len)
                    rows = max(rows, len(groups))
                    slots = max(slots, max((len(g) for g in groups), default=1))
        self.layout = PairLayout(chunks, math.ceil(rows / row_multiple) * row_multiple, slots, seq_len)

    def _texts(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pair, column, length) of every text of `pairs`: column 0 the query, 1.. its documents."""
        count = len(pairs)
        pair = np.repeat(np.arange(count), 1 + self.per_pair)
        column = np.tile(np.arange(1 + self.per_pair), count)
        lengths = np.concatenate([self.query_lengths[pairs, None], self.document_lengths[pairs]], axis=1).reshape(-1)
        return pair, column, lengths

    def _assign(self, pairs: np.ndarray, seq_len: int) -> list[list[int]]:
        return example_packing.assign(self._texts(pairs)[2], seq_len, self.max_slots)

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self.examples)
        return self.pack(batch["index"], batch[EXAMPLE_WEIGHT])

    def pack(self, index: np.ndarray, weight: np.ndarray) -> dict[str, np.ndarray]:
        """One process's batch of pairs `index` (weight 0: a padding pair, whose texts are not placed)."""
        lay, a = self.layout, self.arrays
        k, seq = lay.slots, lay.seq_len
        out = {
            "input_ids": np.zeros((lay.rows, seq), np.int32),
            "input_mask": np.zeros((lay.rows, seq), np.int32),
            "position_ids": np.zeros((lay.rows, seq), np.int32),
            "cls_positions": np.zeros((lay.rows, k), np.int32),
            "query_slot": np.zeros(len(index), np.int32),
            "document_slot": np.zeros((len(index), self.per_pair), np.int32),
            "document_hash": a["document_hash"][index],
            EXAMPLE_WEIGHT: weight.astype(np.float32),
        }
        first_row = self.examples.process_index * lay.rows_per_chunk  # this process's rows within each chunk
        for c in range(self.chunks):
            positions = np.arange(c, len(index), self.chunks)  # the chunk's pairs in this batch (split_chunks' order)
            real = positions[weight[positions] > 0]
            pair, column, lengths = self._texts(index[real])
            groups = example_packing.assign(lengths, seq, self.max_slots)
            if len(groups) > lay.rows_per_chunk or any(len(g) > k for g in groups):
                raise ValueError(
                    f"a batch's chunk needs {len(groups)} packed rows of up to {max(map(len, groups))} texts, more "
                    f"than the layout's {lay.rows_per_chunk} of {k}: plan the layout over every batch."
                )
            for j, group in enumerate(groups):
                row, start = c + self.chunks * j, 0
                for slot, t in enumerate(group):
                    i, n = index[real[pair[t]]], int(lengths[t])
                    ids = a["query_ids"][i] if column[t] == 0 else a["document_ids"][i, column[t] - 1]
                    span = slice(start, start + n)
                    out["input_ids"][row, span] = ids[:n]
                    out["input_mask"][row, span] = slot + 1
                    out["position_ids"][row, span] = np.arange(n)
                    out["cls_positions"][row, slot] = start
                    flat = (first_row + j) * k + slot
                    if column[t] == 0:
                        out["query_slot"][real[pair[t]]] = flat
                    else:
                        out["document_slot"][real[pair[t]], column[t] - 1] = flat
                    start += n
        return out

    def reset(self) -> None:
        self.examples.reset()

    def padding(self) -> tuple[float, float]:
        """The share of tokens that are padding: (in padded pairs, in these packed rows), on average."""
        a, lay = self.arrays, self.layout
        padded = a["query_mask"].size + a["document_mask"].size
        real = float(self.query_lengths.sum() + self.document_lengths.sum())
        per_batch = real / self.rows * self.examples.batch_size
        return 1 - real / padded, 1 - min(1.0, per_batch / (lay.rows * lay.seq_len))
