"""A data mixture inside tf.data: every source's records shuffled, repeated and cut into blocks of
`mixture_block` rows, each block drawn from the source the draw names, and the draws counted on the host.

The draw is TensorFlow ops (no Python per batch), made for DRAW_CHUNK batches at once: a batch's global blocks
are a stratified draw — each source gets its weight × blocks, give or take one, from an offset that moves by the
golden ratio from batch to batch, at positions a seeded shuffle spreads. Offsets and shuffles are functions of
(seed, batch) alone, so a block's source is a function of (seed, step, position), whatever the number of
processes or restarts. tf.data's choose_from_datasets costs ~1.3 µs an element: a block spreads it over its rows
(`benchmarks/pipeline_throughput.py`'s mixture row: 0.98× the speed of one record set with 8-row blocks).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from bertjax.data.pretraining.record_stream import RecordStream, tf_hidden

log = logging.getLogger(__name__)
DRAW_CHUNK = 16  # draws are made for this many batches at once (fixed: it seeds them)
PARSE_CALLS = 8  # batches a mixture parses at once: with DRAW_CHUNK and the prefetch, what bounds mixture.HORIZON
GOLDEN = (5**0.5 - 1) / 2
SOURCE, MIX_COUNTS = "source", "mix_counts"  # batch keys: each row's source, the global rows per source (taken off)


class Mixing:
    """The sources of one process's training pipeline (`config`: its PipelineConfig), their plan and counts."""

    def __init__(self, streams: Sequence[RecordStream], config: Any):
        self.streams, self.config = list(streams), config
        sizes, units = {}, set()
        for stream in self.streams:
            sizes[stream.label], unit = stream.tokens()
            units.add(unit)
        self.plan = config.mixture.resolve(sizes)
        for note in self.plan.notes:
            log.info("mixture: %s", note)
        if "records" in units and any(s.weight is None for s in config.mixture.sources):
            log.warning("mixture: some sources have no metadata.json token count; auto weights use their record counts")
        self.records = np.array([sum(s.record_counts()) for s in self.streams], np.float64)  # every process's
        for stream, used in zip(self.streams, self.plan.used()):
            if not used:
                log.warning("mixture: source %r has weight 0 at every step; none of its records are read", stream.label)
        self.drawn = np.zeros(len(self.streams), np.int64)  # every process's rows per source since step 0
        self._interval = np.zeros(len(self.streams), np.int64)  # ... since the last metrics()

    # --- tf.data --------------------------------------------------------------------------------------------
    def dataset(self):
        """(serialized rows [blocks, mixture_block], (each of this process's blocks' source, global rows per
        source)) per batch."""
        tf, c = tf_hidden(), self.config
        k, buffer = c.mixture_block, max(1, math.ceil(c.shuffle_buffer / len(self.streams)))  # the process's, shared
        sources = []
        for i, stream in enumerate(self.streams):
            ds = stream.examples(None, shuffle_files=True, seed=c.seed + 2 * i)
            ds = ds.shuffle(buffer, seed=c.seed + 2 * i + 1, reshuffle_each_iteration=True)
            sources.append(ds.batch(k, drop_remainder=True))
        # Two streams of the same draws, one for choose_from_datasets, one zipped to the batches (a tf.data stream
        # has one consumer); each is computed once per DRAW_CHUNK batches.
        plain = tf.autograph.experimental.do_not_convert  # TensorFlow ops only: nothing for autograph to convert
        draws = lambda: tf.data.Dataset.range(2**62).map(plain(self.draws)).unbatch()  # noqa: E731  (per batch)
        choice = draws().map(plain(lambda blocks, counts: blocks)).unbatch()
        mixed = tf.data.Dataset.choose_from_datasets(sources, choice, stop_on_empty_dataset=True)
        return tf.data.Dataset.zip(mixed.batch(c.batch_size // k, drop_remainder=True), draws())

    def draws(self, chunk):
        """The draws of pipeline batches chunk·C … chunk·C + C−1 (C = DRAW_CHUNK): for each, the source of each of
        this process's blocks, and how many rows of the global batch each source gets."""
        tf, c, plan = tf_hidden(), self.config, self.plan
        batch = chunk * DRAW_CHUNK + tf.range(DRAW_CHUNK, dtype=tf.int64)
        starts = tf.constant(c.batch_starts, tf.int64)  # the pipeline's step_of, in TensorFlow ops
        step = tf.where(
            batch < starts[-1],
            tf.searchsorted(starts, batch, side="right", out_type=tf.int64) - 1,
            len(c.batch_starts) - 1 + (batch - starts[-1]) // c.batches_per_step,
        )
        steps, table = tf.constant(plan.steps, tf.int64), tf.constant(plan.weights, tf.float64)
        i = tf.searchsorted(steps, step, side="right", out_type=tf.int64) - 1
        weights = tf.gather(table, i)  # [C, sources]
        if plan.interpolation == "linear" and len(plan.steps) > 1:
            j = tf.minimum(i + 1, len(plan.steps) - 1)
            span = tf.cast(tf.maximum(tf.gather(steps, j) - tf.gather(steps, i), 1), tf.float64)
            done = tf.cast(step - tf.gather(steps, i), tf.float64) / span * tf.cast(j > i, tf.float64)
            weights += (tf.gather(table, j) - weights) * done[:, None]
        blocks = c.batch_size * c.process_count // c.mixture_block
        seed = tf.stack([tf.constant(c.seed, tf.int64) * 2 + 1, chunk])
        # Offsets by the golden ratio from a seeded start: low-discrepancy across batches, so that even a batch of
        # one block keeps each source's share over a few batches, not within a binomial's noise.
        start = tf.random.stateless_uniform([], tf.stack([seed[0], tf.constant(-1, tf.int64)]), dtype=tf.float64)
        offsets = tf.math.floormod(start + tf.cast(batch[:, None], tf.float64) * GOLDEN, 1.0)
        points = (tf.range(blocks, dtype=tf.float64)[None, :] + offsets) / blocks
        chosen = tf.searchsorted(tf.cumsum(weights, axis=1)[:, :-1], points, side="right", out_type=tf.int32)
        counts = tf.reduce_sum(tf.one_hot(chosen, len(plan.names), dtype=tf.int64), axis=1) * c.mixture_block
        order = tf.argsort(tf.random.stateless_uniform([DRAW_CHUNK, blocks], seed + [0, 1]), axis=1)
        chosen = tf.gather(chosen, order, batch_dims=1)
        per_process = c.batch_size // c.mixture_block
        mine = chosen[:, c.process_index * per_process : (c.process_index + 1) * per_process]
        return tf.cast(mine, tf.int64), counts

    # --- The host's counts ---------------------------------------------------------------------------------
    def count(self, rows: np.ndarray) -> None:
        """A batch handed out: its global rows per source."""
        self.drawn += rows
        self._interval += rows

    def metrics(self) -> dict[str, float]:
        """`mix_<name>` (each source's share of the rows drawn since the last call, every process's) and
        `epochs_<name>` (passes over its records so far)."""
        shares = self._interval / max(int(self._interval.sum()), 1)
        self._interval[:] = 0
        out = {f"mix_{n}": float(x) for n, x in zip(self.plan.names, shares)}
        out.update({f"epochs_{n}": float(d / r) for n, d, r in zip(self.plan.names, self.drawn, self.records) if r})
        return out

    def restart(self, drawn: Sequence[int] = ()) -> None:
        """The counts from a restored position (or from zero)."""
        self.drawn[:] = drawn if len(drawn) else 0
        self._interval[:] = 0
