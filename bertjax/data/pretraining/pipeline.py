"""tf.data input pipeline: record shards → per-process split → shuffle → batch → parse → numpy batches.

Why this order: shuffling serialized records keeps the shuffle buffer, and so the iterator checkpoint,
small (~0.7 kB a record at seq 128); parsing after batching calls `tf.io.parse_example` once per batch,
not once per record. Dynamic masking re-masks whole batches in numpy with a seed derived from
(seed, process, batch index); the index comes from `enumerate`, which is part of the iterator state, so
a restored pipeline masks exactly as an uninterrupted one would, and every epoch masks differently.

Batches are host-local dicts of numpy arrays named as the record features (ints as int32,
`next_sentence_labels` as [batch]) plus `example_weight` [batch] float32: 1 for a real row, 0 for an
eval padding row. The training loop assembles global batches from them (`sharding.global_batch`).

TensorFlow is only the reader: it is kept off GPUs/TPUs so it never takes accelerator memory from JAX.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
from typing import Iterator, Optional

import numpy as np

from bertjax.runtime import files
from bertjax.data.pretraining import instances, mixing, mixture, packing, record_sets, record_stream, records

log = logging.getLogger(__name__)
EXAMPLE_WEIGHT = "example_weight"
_MASKED = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def batch_shapes(
    batch_size: int, max_seq_length: int, max_predictions_per_seq: int, max_instances_per_row: int = 0
) -> dict[str, tuple[tuple[int, ...], type]]:
    """Name → (shape, dtype) of the batches `InputPipeline` yields: the record features (ints as int32;
    unpacked `next_sentence_labels` as [batch]) plus `example_weight`."""
    schema = records.RecordSchema(max_seq_length, max_predictions_per_seq, max_instances_per_row)
    out = {
        name: ((batch_size, n), np.float32 if dtype == "float32" else np.int32)
        for name, (dtype, n) in schema.features().items()
    }
    if not max_instances_per_row:
        out["next_sentence_labels"] = ((batch_size,), np.int32)
    out[EXAMPLE_WEIGHT] = ((batch_size,), np.float32)
    return out


class PipelineMismatch(ValueError):
    """A saved position belongs to a pipeline of another config: a user error, not a damaged file."""


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    files: str | tuple[str, ...]  # glob(s) or comma list, as record_sets.expand_record_files takes
    batch_size: int  # per process
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20  # packed records: prediction slots per row
    max_instances_per_row: int = 0  # packed records (data/pretraining/packing.py); 0: unpacked
    seed: int = 0
    shuffle_buffer: int = 10_000  # records; training only
    training: bool = True  # False (eval): one pass in file order, last batch padded, no shuffle
    process_index: int = 0
    process_count: int = 1
    num_epochs: Optional[int] = None  # training: None repeats forever; eval always makes one pass
    dynamic_masking: bool = False  # re-mask every batch from the restored original tokens
    vocab: Optional[instances.Vocab] = dataclasses.field(default=None, compare=False)  # for dynamic masking
    masking: Optional[instances.InstanceConfig] = None  # None: masked_lm_prob / whole-word from metadata.json
    # dynamic masking's rate when masking is None (None: the records'); or a schedule by step, '0:0.3;9000:0.15'
    masked_lm_prob: Optional[float | str] = None
    vocab_size: Optional[int] = None  # checked against metadata.json; None: vocab.size when a vocab is given
    cycle_length: int = 8  # shards read at once
    # A set in a bucket: bytes of its pieces one process holds on disk at once (0: (2 × cycle + 2) × its largest piece)
    stream_window_bytes: int = 0
    threads: Optional[int] = None  # tf.data threads (None: tf.data's autotuned pool); a number turns autotuning off
    prefetch: int = 2  # batches
    max_batches: Optional[int] = None  # eval: at most this many batches per pass (None: the whole set)
    skip_damaged_records: bool = False  # read each file up to its first damage (scanned at start) instead of failing
    verify_checksums: bool = False  # read every file at start: its CRC32C must equal metadata.json's
    # A data mixture (training): (name, record files) per source, `files` unused, and their weights by step.
    sources: tuple[tuple[str, str], ...] = ()
    mixture: Optional[mixture.Mixture] = dataclasses.field(default=None, compare=False)
    mixture_block: int = 8  # rows drawn from one source together; batch_size must be a multiple
    # Which step a pipeline batch belongs to, for schedules: batch warmup's first batch of each warmup step and
    # the warmup's end (BatchWarmup.batch_starts), after which a step takes batches_per_step; by default batch i is step i.
    batch_starts: tuple[int, ...] = (0,)
    batches_per_step: int = 1

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be ≥ 1.")
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index={self.process_index} must be in [0, process_count={self.process_count}).")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"max_batches={self.max_batches} must be ≥ 1, or None for the whole eval set.")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs={self.num_epochs} must be ≥ 1, or None to repeat forever.")
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer={self.shuffle_buffer} must be ≥ 1 (1 = no shuffling).")
        if self.stream_window_bytes < 0:
            raise ValueError(
                f"config.data.stream_window_bytes={self.stream_window_bytes} must be ≥ 0 (0: sized from the set)."
            )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads} must be ≥ 1, or None for tf.data's autotuned pool.")
        if self.sources and (not self.training or self.mixture is None or self.num_epochs is not None):
            raise ValueError("sources (a mixture) need training=True, a mixture and num_epochs=None (sources repeat).")
        if self.sources and (self.mixture_block < 1 or self.batch_size % self.mixture_block):
            raise ValueError(
                f"config.data.mixture_block={self.mixture_block} rows must divide the batch each process reads "
                f"({self.batch_size} rows); set it to a divisor of {self.batch_size} (1: every row drawn on its own)."
            )
        if self.dynamic_masking and self.vocab is None:
            raise ValueError(
                "dynamic_masking=True needs vocab (an instances.Vocab, e.g. from "
                "instances.Vocab.from_tokenizer(tokenizer)); pass it or turn dynamic masking off."
            )
        if self.vocab is not None and len(self.vocab.is_continuation) != self.vocab.size:
            raise ValueError(
                f"vocab.is_continuation has {len(self.vocab.is_continuation)} entries but "
                f"vocab.size={self.vocab.size}; build the Vocab from one tokenizer."
            )
        m = self.masking
        # Packed rows: the pipeline's predictions are the row's slots, the masking's are each instance's cap.
        if m is not None and (
            m.max_seq_length != self.max_seq_length
            or (not self.max_instances_per_row and m.max_predictions_per_seq != self.max_predictions_per_seq)
        ):
            raise ValueError(
                f"masking has max_seq_length={m.max_seq_length}, max_predictions_per_seq="
                f"{m.max_predictions_per_seq} but the pipeline {self.max_seq_length}, "
                f"{self.max_predictions_per_seq}; make them equal."
            )

    def parallel_calls(self, most: Optional[int] = None) -> Optional[int]:
        """num_parallel_calls of a tf.data stage that runs at most `most` calls at once: AUTOTUNE without fixed
        threads, else that many threads' worth (None for one: tf.data warns when sequential ops get a number)."""
        if self.threads is None:
            return _tf().data.AUTOTUNE
        calls = min(self.threads, most or self.threads)
        return calls if calls > 1 else None


_tf = record_stream.tf_hidden  # TensorFlow, kept off accelerators


class InputPipeline:
    """Host-local numpy batches; an iterator whose position can be saved and restored exactly.

    Files are split across processes when there are at least as many as processes, else every process
    reads them all and keeps every process_count-th record. Eval makes one unshuffled pass of
    `num_batches` batches, the same number on every process (short ones get all-padding batches), so
    collectives never wait on a process that ran out. Training repeats forever unless num_epochs is set;
    then processes may run out at different steps, so stop multi-process training on a step count.
    Iterating a finished pipeline (eval, or finite num_epochs) starts a new pass from the beginning.
    State is per process: give each process its own save_state path.

    With `sources` (a data mixture, training only) each source is its own shuffled, repeating stream and
    each block of rows is drawn from the source `mixing.Mixing.draws` names for its (seed, batch, global
    position); the draws are counted (`mix_metrics`: each source's share since the last call, its epochs so far).
    """

    def __init__(self, config: PipelineConfig):
        config.validate()
        self.config = c = config
        if c.sources:
            self.streams = [record_stream.RecordStream(files, c, name) for name, files in c.sources]
        else:
            self.streams = [record_stream.RecordStream(c.files, c)]
        self.metadata = self.streams[0].metadata
        self.schema = records.RecordSchema(c.max_seq_length, c.max_predictions_per_seq, c.max_instances_per_row)
        self.mixing = mixing.Mixing(self.streams, c) if c.sources else None
        self._rates = mixture.RateSchedule.parse(c.masked_lm_prob) if c.masked_lm_prob is not None else None
        self.masking = self._masking_config() if c.dynamic_masking else None
        self._maskings: dict[float, instances.InstanceConfig] = {}
        self.num_examples: Optional[int] = None  # eval: real rows on this process
        self.num_batches: Optional[int] = None  # eval: batches per pass, the same on every process
        if c.training:
            for stream, used in zip(self.streams, self.plan.used() if self.plan is not None else [True]):
                if used:
                    stream.check_not_empty()
        else:
            self.num_examples, self.num_batches = self.streams[0].eval_counts(c.batch_size, c.max_batches)
        self.dataset = self._build()
        self._iterator = iter(self.dataset)
        self._exhausted = False
        self._position = 0  # eval: batches of the current pass handed out
        self._batches = 0  # training: batches handed out since the start of the run (the saved position)
        self.last_sources: Optional[np.ndarray] = None  # a mixture: the source of each row of the last batch

    # --- One record set, or a mixture's: what the job reads about them -----------------------------------
    @property
    def plan(self) -> Optional[mixture.Plan]:
        """A mixture's weights by step (None without one)."""
        return self.mixing.plan if self.mixing is not None else None

    def mix_metrics(self) -> dict[str, float]:
        """A mixture's `mix_<name>` and `epochs_<name>` (`mixing.Mixing.metrics`); {} without one."""
        return self.mixing.metrics() if self.mixing is not None else {}

    @property
    def files(self) -> list[str]:
        return [f for s in self.streams for f in s.files]

    @property
    def split_by_example(self) -> bool:
        return self.streams[0].split_by_example

    @property
    def damaged(self) -> list[record_sets.FileScan]:
        return [d for s in self.streams for d in s.damaged]

    @property
    def skipped_records(self) -> int:
        return sum(s.skipped_records for s in self.streams)

    def step_of(self, batch: int) -> int:
        """The training step a pipeline batch belongs to (with batch warmup a step takes several)."""
        c = self.config
        if batch < c.batch_starts[-1]:
            return int(np.searchsorted(c.batch_starts, batch, side="right")) - 1
        return len(c.batch_starts) - 1 + (batch - c.batch_starts[-1]) // c.batches_per_step

    # --- Construction ----------------------------------------------------------------------------
    def _masking_config(self, rate: Optional[float] = None) -> instances.InstanceConfig:
        c, md = self.config, self.metadata or {}
        if c.masking is not None:
            return c.masking if rate is None else dataclasses.replace(c.masking, masked_lm_prob=rate)
        # Packed records: the pipeline's predictions are the row's slots; each instance keeps its own cap.
        per_instance = (
            md.get("max_predictions_per_seq", c.max_predictions_per_seq)
            if c.max_instances_per_row
            else c.max_predictions_per_seq
        )
        if rate is None:
            rate = md.get("masked_lm_prob", 0.15) if self._rates is None else self._rates.at(0)
        if rate != md.get("masked_lm_prob", rate):
            log.info(
                "pipeline: dynamic masking masks %g of each sequence (the records were masked at %g)",
                rate,
                md["masked_lm_prob"],
            )
        masking = instances.InstanceConfig(
            max_seq_length=c.max_seq_length,
            max_predictions_per_seq=per_instance,
            masked_lm_prob=rate,
            do_whole_word_mask=md.get("do_whole_word_mask", False),
        )
        masking.validate()
        if masking.cap_warning():
            log.warning(
                "pipeline: dynamic masking: %s (re-run prepare with more prediction slots).", masking.cap_warning("")
            )
        return masking

    def _masking_at(self, batch: int) -> instances.InstanceConfig:
        """Dynamic masking's config for a batch: the scheduled rate at its step."""
        if self._rates is None or self._rates.constant:
            return self.masking
        rate = self._rates.at(self.step_of(batch))
        if rate not in self._maskings:
            self._maskings[rate] = self._masking_config(rate)
        return self._maskings[rate]

    def _build(self):
        tf, c = _tf(), self.config
        if c.sources:
            ds = self.mixing.dataset()
        elif c.training:
            ds = self.streams[0].examples(c.num_epochs, shuffle_files=True)
            ds = ds.shuffle(c.shuffle_buffer, seed=c.seed + 1, reshuffle_each_iteration=True)
            ds = ds.batch(c.batch_size, drop_remainder=True)
        else:
            ds = self.streams[0].examples(1, shuffle_files=False).batch(c.batch_size)
        ds = ds.enumerate()  # the batch index seeds dynamic masking; part of the iterator state
        parse, calls = self._parse, c.parallel_calls()
        if c.sources:  # a bounded lookahead (mixture.HORIZON): at most PARSE_CALLS batches at once, never AUTOTUNE
            parse = lambda i, x: self._parse(i, *x)  # noqa: E731
            calls = c.parallel_calls(mixing.PARSE_CALLS) if c.threads else min(mixing.PARSE_CALLS, os.cpu_count() or 1)
        # Autograph would rewrite parse's Python source at every start (~0.2-0.4 s of a tiny job process's CPU with
        # the other pipeline functions): its branches are on the config, never on a tensor, so there is nothing to convert.
        parse = tf.autograph.experimental.do_not_convert(parse)
        ds = ds.map(parse, num_parallel_calls=calls, deterministic=True if calls else None)
        if not c.training:
            real = math.ceil(self.num_examples / c.batch_size)
            padding = tf.data.Dataset.from_tensors(self._zeros())
            ds = ds.concatenate(padding.repeat(max(0, self.num_batches - real))).take(self.num_batches)
            # Passes follow each other in one iterator: deleting a tf.data iterator while the training
            # pipeline's threads are busy can block for seconds (30 s seen in a 2-core run), per eval.
            ds = ds.repeat()
        options = tf.data.Options()
        options.deterministic = True
        if c.sources:  # no prefetch beyond the pipeline's own (mixture.HORIZON)
            options.experimental_optimization.inject_prefetch = False
        # The numpy masker and chooser are pure functions, and a window's calls only fetch and release files: safe
        # to checkpoint (a restore fetches the files first, restore_state).
        if c.dynamic_masking or c.sources or any(s.remote for s in self.streams):
            options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        if c.threads is not None:
            options.threading.private_threadpool_size = c.threads
            options.threading.max_intra_op_parallelism = 1
            # Nothing left to tune, and no tuning thread: deleting an autotuned iterator waits for that thread, which
            # can miss TF 2.21's cancellation and sleep out its period, up to 60 s (under load on 2 cores, gdb: asleep
            # in Model::OptimizeLoop's timed wait while ~Iterator waited; gc in test teardowns, 12-76 s).
            options.autotune.enabled = False
        return ds.prefetch(c.prefetch).with_options(options)

    def _zeros(self) -> dict:
        tf, c = _tf(), self.config
        return {
            name: tf.zeros(shape, tf.as_dtype(dtype))
            for name, (shape, dtype) in batch_shapes(
                c.batch_size, c.max_seq_length, c.max_predictions_per_seq, c.max_instances_per_row
            ).items()
        }

    def _parse(self, index, serialized, draw=None) -> dict:
        tf, c = _tf(), self.config
        if draw is not None:  # a mixture's: blocks of rows, and the draw they came from
            serialized = tf.reshape(serialized, [c.batch_size])
        parsed = tf.io.parse_example(serialized, self.schema.feature_spec())
        batch = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
        if not c.max_instances_per_row:
            batch["next_sentence_labels"] = tf.reshape(batch["next_sentence_labels"], [-1])
        rows = tf.shape(serialized)[0]
        batch[EXAMPLE_WEIGHT] = tf.ones([rows], tf.float32)
        if draw is not None:  # each row's source, and the global rows per source for the host's counts
            batch[mixing.SOURCE] = tf.repeat(tf.cast(draw[0], tf.int32), c.mixture_block)
            batch[mixing.MIX_COUNTS] = draw[1]
        if c.dynamic_masking:
            out = tf.numpy_function(
                self._remask,
                [index] + [batch[k] for k in ("input_mask",) + _MASKED],
                [tf.int32, tf.int32, tf.int32, tf.float32],
                stateful=False,
            )
            for k, v in zip(_MASKED, out):
                batch[k] = tf.ensure_shape(v, batch[k].shape)
        if not c.training:  # pad the last partial batch with zero rows of weight 0
            pad = [[0, c.batch_size - rows]]
            batch = {
                k: tf.ensure_shape(tf.pad(v, pad + [[0, 0]] * (v.shape.rank - 1)), [c.batch_size] + v.shape[1:])
                for k, v in batch.items()
            }
        return batch

    def _remask(self, index, input_mask, input_ids, positions, ids, weights) -> tuple:
        """Original tokens back, then a fresh 15% / 80-10-10 masking seeded by (seed, process, batch), at the
        rate scheduled for the batch's step."""
        c = self.config
        original = instances.unmask(input_ids, positions, ids, weights)
        if original.size and original.max() >= c.vocab.size:
            raise ValueError(
                f"records hold token id {original.max()} ≥ vocab.size={c.vocab.size}; the vocab "
                "does not belong to these records."
            )
        rng = np.random.default_rng([c.seed, c.process_index, int(index)])
        masking = self._masking_at(int(index))
        if c.max_instances_per_row:
            m = packing.mask_rows(original, input_mask, masking, c.vocab, rng, c.max_predictions_per_seq)
        else:
            m = instances.mask_tokens(original, input_mask, masking, c.vocab, rng)
        return tuple(m[k].astype(np.float32 if k == "masked_lm_weights" else np.int32) for k in _MASKED)

    # --- Iteration ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self._exhausted:  # a finished pass: start again from the beginning
            self.reset()
        return self

    def reset(self) -> None:
        """Back to the beginning (eval: the next pass starts at the first batch)."""
        if self.config.training:  # rebuilt: a seeded shuffle's second iterator would take another order
            self.dataset = self._build()
            self._iterator = iter(self.dataset)
            self._batches = 0
            if self.mixing is not None:
                self.mixing.restart()
        else:  # the iterator repeats the pass: skip what is left of this one
            for _ in range(self.num_batches - self._position if self._position else 0):
                next(self._iterator)
        self._exhausted, self._position = False, 0

    def __next__(self) -> dict[str, np.ndarray]:
        tf = _tf()
        if not self.config.training and self._position == self.num_batches:
            self._exhausted = True
            raise StopIteration
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._exhausted = True
            raise
        except tf.errors.OpError as e:
            failed = self.stream_error()
            if failed is not None:  # a window's fetch failed: its sentence, not TensorFlow's wrapping of it
                raise failed from None
            if isinstance(e, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
                raise self._read_error(e) from None
            raise
        self._position += 1
        out = {k: v.numpy() for k, v in batch.items()}
        if self.mixing is not None:  # the draw of every process, counted once per batch on each
            self.last_sources = out.pop(mixing.SOURCE)
            self.mixing.count(out.pop(mixing.MIX_COUNTS))
        self._batches += 1
        return out

    def stream_error(self) -> Optional[Exception]:
        """A window's failed fetch (a shard gone or changed, the bucket down too long), or None."""
        return next((s.window.error for s in self.streams if s.window and s.window.error), None)

    def _read_error(self, error) -> ValueError:
        """The first damaged file of any source, else what TensorFlow said."""
        damaged = next((e for e in (s.damage() for s in self.streams) if e is not None), None)
        return damaged or self.streams[0].not_records(error)

    # --- State -------------------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        c = self.config
        # Names and sizes, not paths: the same files elsewhere match, a changed one does not.
        out = {
            "files": (  # a mixture's: [name, files] per source, in the mixture's order
                [[s.label, s.fingerprint_files()] for s in self.streams]
                if c.sources
                else self.streams[0].fingerprint_files()
            ),
            "batch_size": c.batch_size,
            "seed": c.seed,
            "training": c.training,
            "process_index": c.process_index,
            "process_count": c.process_count,
            "shuffle_buffer": c.shuffle_buffer,
            "num_epochs": c.num_epochs,
            "dynamic_masking": c.dynamic_masking,
            "max_seq_length": c.max_seq_length,
            "max_predictions_per_seq": c.max_predictions_per_seq,
        }
        if self.plan is not None:
            out["mixture"], out["mixture_block"] = self.plan.to_json(), c.mixture_block
        if self._rates is not None and not self._rates.constant:
            out["masking"] = {"steps": list(self._rates.steps), "values": list(self._rates.values)}
        return out

    def save_state(self, path: str) -> str:
        """Writes the iterator position (shuffle buffer and prefetched batches included) under prefix path."""
        if files.is_remote(path):  # TensorFlow's gs:// is not the file layer's: written locally, then uploaded
            with files.writing_dir(os.path.dirname(path)) as local:
                self.save_state(os.path.join(local, os.path.basename(path)))
            return path
        tf = _tf()
        begun = [s.window.begin_save() if s.window else None for s in self.streams]
        prefix = tf.train.Checkpoint(iterator=self._iterator).write(path)
        failed = self.stream_error()
        if failed is not None:  # the iterator's buffers may hold it now: a position never to commit
            raise failed
        saved = dict(self._fingerprint(), position={"batches": self._batches})
        if any(begun):  # which pieces the iterator may hold open, for the restore to fetch first
            saved["position"]["windows"] = [s.window.end_save(b) if b else None for s, b in zip(self.streams, begun)]
        if self.mixing is not None:
            saved["position"]["drawn"] = self.mixing.drawn.tolist()
        with tf.io.gfile.GFile(path + ".pipeline.json", "w") as f:
            json.dump(saved, f, sort_keys=True)
        return prefix

    def restore_state(self, path: str) -> None:
        """Continues exactly where the pipeline that wrote path stopped; it must have the same config (a
        mixture's or masking rate's schedule may differ after the step it stopped at, never before)."""
        if files.is_remote(path):
            where, stem = os.path.dirname(path), os.path.basename(path)
            with tempfile.TemporaryDirectory(prefix="bertjax-pipeline-") as local:
                for name in files.listdir(where):
                    if name.startswith(stem + "."):
                        files.download(os.path.join(where, name), os.path.join(local, name))
                return self.restore_state(os.path.join(local, stem))
        tf = _tf()
        info = path + ".pipeline.json"
        if not tf.io.gfile.exists(info):
            raise FileNotFoundError(f"{info} not found; path must be a prefix written by save_state.")
        with tf.io.gfile.GFile(info) as f:
            saved = json.load(f)
        position = saved.pop("position", {})
        legacy = bool(saved.get("files")) and isinstance(saved["files"][0], str)
        if legacy != self.streams[0].legacy:  # its iterator state opened files by path: read them so again
            self.streams[0].legacy = legacy
            self.dataset = self._build()
        mine = self._fingerprint()
        self._check_files(info, saved, mine)  # a mixture's sources first: other differences follow from them
        scheduled = ("files", "mixture", "masking")
        diff = sorted(k for k in set(saved) | set(mine) if k not in scheduled and saved.get(k) != mine.get(k))
        if diff:
            raise PipelineMismatch(
                f"{info}: the saved pipeline differs in {', '.join(diff)}; restore with the config it was saved with."
            )
        batches = int(position.get("batches", 0))
        try:
            plan, rates = mixture.resumed(saved, self.plan, self._rates, self.step_of(batches))
        except mixture.MixtureError as e:
            raise PipelineMismatch(f"{info}: {e}.") from None
        if plan is not self.plan or rates is not self._rates:  # the saved schedule until the horizon: rebuilt
            if self.mixing is not None:
                self.mixing.plan = plan
            self._rates, self._maskings = rates, {}
            self.dataset = self._build()
        self._iterator, self._exhausted = iter(self.dataset), False
        for stream, window in zip(self.streams, position.get("windows") or [None] * len(self.streams)):
            if stream.window is not None:
                stream.window.restore(window or {})
        tf.train.Checkpoint(iterator=self._iterator).read(path).assert_consumed()
        self._batches = batches
        if self.mixing is not None:
            self.mixing.restart(position.get("drawn", ()))

    def _check_files(self, info: str, saved: dict, mine: dict) -> None:
        """The same record files (per source, in the same source order, for a mixture) as the saved position's."""
        then, now = saved.get("files", []), mine["files"]
        if ("mixture" in saved) != ("mixture" in mine) or (
            "mixture" in mine and [n for n, _ in then] != [n for n, _ in now]
        ):
            described = [
                ", ".join(n for n, _ in f) if "mixture" in d else "one record set"
                for d, f in ((saved, then), (mine, now))
            ]
            raise PipelineMismatch(
                f"{info}: it was saved reading {described[0]} and this run reads {described[1]}; a run keeps its "
                "mixture's sources (their weights may change from a later step on): restore with them, or start a new "
                "workdir."
            )
        pairs = [(name, a, b) for (name, a), (_, b) in zip(then, now)] if "mixture" in mine else [(None, then, now)]
        for name, a, b in pairs:
            changed = record_sets.files_difference(a, b)
            if changed:
                source = f" of source {name!r}" if name else ""
                raise PipelineMismatch(
                    f"{info}: {changed}{source}; restore with the files it was saved with or start a new workdir."
                )
