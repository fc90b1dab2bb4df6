"""Sequence packing: several instances in one row of max_seq_length, none of them seeing another.

A packed row holds (record features; the names of google-research/bert's where they mean the same):
  input_ids, segment_ids [seq]       the instances one after another, then padding (0)
  input_mask [seq]                   the instance each token belongs to, 1..k; 0 for padding. Attention
                                     stays within an instance (bertjax.models.attention)
  position_ids [seq]                 each token's position within its own instance, from 0
  masked_lm_positions, masked_lm_ids, masked_lm_weights [max_predictions_per_row]
                                     every instance's predictions, positions counted in the row
  next_sentence_positions [max_instances_per_row]   where each instance's [CLS] stands
  next_sentence_labels, next_sentence_weights [max_instances_per_row]
                                     each instance's NSP label, and 1 for a slot in use (0: empty)

Rows are filled best-fit decreasing: the longest instance first, into the open row whose free room fits
it most tightly, within the per-row limits on instances and predictions. On BERT's length mix this
leaves almost no padding (Krell et al. 2021 pack close to optimally with their histogram variant).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data.pretraining import instances

PACKED_FEATURES = ("position_ids", "next_sentence_positions", "next_sentence_weights")


def predictions_per_row(setting: int, max_predictions_per_seq: int, max_instances_per_row: int) -> int:
    """A packed row's prediction slots: `setting`, or when 0 max_predictions_per_seq plus one per
    instance (each instance rounds its 15% up)."""
    return setting or max_predictions_per_seq + max_instances_per_row


@dataclasses.dataclass(frozen=True)
class PackingConfig:
    max_seq_length: int
    max_instances_per_row: int = 3  # NVIDIA's MLPerf BERT packs up to 3 at seq 512
    max_predictions_per_row: int = 20

    def validate(self) -> None:
        for name in ("max_seq_length", "max_instances_per_row", "max_predictions_per_row"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be ≥ 1.")


def assign_rows(lengths: np.ndarray, predictions: np.ndarray, cfg: PackingConfig) -> list[list[int]]:
    """Instance indices per row (ascending, rows ordered by their first), best-fit decreasing under the
    row's token, instance and prediction limits."""
    cfg.validate()
    if np.any(lengths > cfg.max_seq_length) or np.any(predictions > cfg.max_predictions_per_row):
        raise ValueError(
            f"an instance longer than max_seq_length={cfg.max_seq_length} or with more than "
            f"max_predictions_per_row={cfg.max_predictions_per_row} predictions cannot be packed."
        )
    rows: list[list[int]] = []
    room: list[int] = []  # free tokens per row
    budget: list[int] = []  # free prediction slots per row
    open_by_room: list[list[int]] = [[] for _ in range(cfg.max_seq_length + 1)]  # room → open rows
    for i in np.argsort(-lengths, kind="stable").tolist():
        n, p = int(lengths[i]), int(predictions[i])
        chosen = None
        for r in range(n, cfg.max_seq_length + 1):  # the tightest room that fits first
            for row in reversed(open_by_room[r]):
                if budget[row] >= p:
                    chosen = row
                    break
            if chosen is not None:
                open_by_room[r].remove(chosen)
                break
        if chosen is None:
            chosen = len(rows)
            rows.append([])
            room.append(cfg.max_seq_length)
            budget.append(cfg.max_predictions_per_row)
        rows[chosen].append(i)
        room[chosen] -= n
        budget[chosen] -= p
        if len(rows[chosen]) < cfg.max_instances_per_row and room[chosen] > 0:
            open_by_room[room[chosen]].append(chosen)
    # Rows in the order of their first instance, as the instances came: filling longest-first must not
    # leave the long instances' rows at the front of every block.
    return sorted((sorted(row) for row in rows), key=lambda row: row[0])


def pack(arrays: dict[str, np.ndarray], cfg: PackingConfig) -> dict[str, np.ndarray]:
    """Unpacked instance arrays ([instances, …], as `instances.create_instances` makes) → packed rows."""
    lengths = (arrays["input_mask"] > 0).sum(axis=1)
    weights = arrays["masked_lm_weights"] > 0
    rows = assign_rows(lengths, weights.sum(axis=1), cfg)
    seq, k, budget = cfg.max_seq_length, cfg.max_instances_per_row, cfg.max_predictions_per_row
    out = {
        name: np.zeros((len(rows), seq), np.int64)
        for name in ("input_ids", "segment_ids", "input_mask", "position_ids")
    }
    out.update(
        masked_lm_positions=np.zeros((len(rows), budget), np.int64),
        masked_lm_ids=np.zeros((len(rows), budget), np.int64),
        masked_lm_weights=np.zeros((len(rows), budget), np.float32),
        next_sentence_positions=np.zeros((len(rows), k), np.int64),
        next_sentence_labels=np.zeros((len(rows), k), np.int64),
        next_sentence_weights=np.zeros((len(rows), k), np.float32),
    )
    labels = arrays["next_sentence_labels"].reshape(len(lengths))
    for r, members in enumerate(rows):
        start = slot = 0
        for j, i in enumerate(members):
            n = int(lengths[i])
            span = slice(start, start + n)
            out["input_ids"][r, span] = arrays["input_ids"][i, :n]
            out["segment_ids"][r, span] = arrays["segment_ids"][i, :n]
            out["input_mask"][r, span] = j + 1
            out["position_ids"][r, span] = np.arange(n)
            p = np.flatnonzero(weights[i])
            out["masked_lm_positions"][r, slot : slot + len(p)] = arrays["masked_lm_positions"][i, p] + start
            out["masked_lm_ids"][r, slot : slot + len(p)] = arrays["masked_lm_ids"][i, p]
            out["masked_lm_weights"][r, slot : slot + len(p)] = 1.0
            out["next_sentence_positions"][r, j] = start
            out["next_sentence_labels"][r, j] = labels[i]
            out["next_sentence_weights"][r, j] = 1.0
            start, slot = start + n, slot + len(p)
    return out


def mask_rows(
    input_ids: np.ndarray,
    input_mask: np.ndarray,
    cfg: instances.InstanceConfig,
    vocab: instances.Vocab,
    rng: np.random.Generator,
    max_predictions_per_row: int,
) -> dict[str, np.ndarray]:
    """`instances.mask_tokens` for packed rows (dynamic masking): each instance masked as if it stood alone
    (its own 15%, at most cfg.max_predictions_per_seq), its predictions in the row's slots in instance order."""
    n, length = input_ids.shape
    k = max(int(input_mask.max()) if input_mask.size else 0, 1)
    own = input_mask[:, None, :] == np.arange(1, k + 1)[None, :, None]  # [row, instance, token]
    alone = instances.mask_tokens(
        np.repeat(input_ids, k, axis=0), own.reshape(n * k, length).astype(np.int32), cfg, vocab, rng
    )  # one virtual row per (row, instance), tokens in place
    masked = np.where(own, alone["input_ids"].reshape(n, k, length), 0).sum(axis=1)
    masked = np.where(input_mask > 0, masked, input_ids).astype(np.int32)
    weights = alone["masked_lm_weights"].reshape(n, -1)
    used = (weights > 0).sum(axis=1)
    if used.max(initial=0) > max_predictions_per_row:
        raise ValueError(
            f"a packed row needs {used.max()} prediction slots after re-masking but the records have "
            f"max_predictions_per_row={max_predictions_per_row}; re-run prepare with a larger "
            "--max_predictions_per_row."
        )
    first = np.argsort(weights == 0, axis=1, kind="stable")[:, :max_predictions_per_row]  # used slots first
    # A batch of one-instance rows has fewer slots than the row holds (k × the instance cap): pad with empty ones.
    pad = [(0, 0), (0, max_predictions_per_row - first.shape[1])]
    out = {
        key: np.pad(np.take_along_axis(alone[key].reshape(n, -1), first, axis=1), pad)
        for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
    }
    return dict(input_ids=masked, **out)
