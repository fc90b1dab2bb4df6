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
import re
import tempfile
from typing import Iterator, Optional

import numpy as np

from bertjax.data import files
from bertjax.data.pretraining import instances, packing, record_sets, records

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
    masked_lm_prob: Optional[float] = None  # dynamic masking's rate when masking is None (None: the records')
    vocab_size: Optional[int] = None  # checked against metadata.json; None: vocab.size when a vocab is given
    cycle_length: int = 8  # shards read at once
    threads: Optional[int] = None  # tf.data threads (None: tf.data's autotuned pool)
    prefetch: int = 2  # batches
    max_batches: Optional[int] = None  # eval: at most this many batches per pass (None: the whole set)
    skip_damaged_records: bool = False  # read each file up to its first damage (scanned at start) instead of failing
    verify_checksums: bool = False  # read every file at start: its CRC32C must equal metadata.json's

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


_HIDDEN = False


def _tf():
    """TensorFlow with accelerators hidden, before it first touches a device."""
    global _HIDDEN
    import tensorflow as tf

    if not _HIDDEN:
        for kind in ("GPU", "TPU"):
            try:
                if tf.config.get_visible_devices(kind):
                    tf.config.set_visible_devices([], kind)
            except (RuntimeError, ValueError) as e:  # runtime already initialised by someone else
                log.warning(
                    "pipeline: could not hide %s devices from TensorFlow (%s); it may hold "
                    "accelerator memory. Build the pipeline before other TF use.",
                    kind,
                    e,
                )
        _HIDDEN = True
    return tf


def _tf_message(error) -> str:
    """A TensorFlow error's own words, without the op and function names around them."""
    text = re.sub(r"\{\{[^}]*\}\}|\[Op:[^\]]*\].*$", "", error.message.splitlines()[0] if error.message else "")
    return text.strip() or type(error).__name__


class InputPipeline:
    """Host-local numpy batches; an iterator whose position can be saved and restored exactly.

    Files are split across processes when there are at least as many as processes, else every process
    reads them all and keeps every process_count-th record. Eval makes one unshuffled pass of
    `num_batches` batches, the same number on every process (short ones get all-padding batches), so
    collectives never wait on a process that ran out. Training repeats forever unless num_epochs is set;
    then processes may run out at different steps, so stop multi-process training on a step count.
    Iterating a finished pipeline (eval, or finite num_epochs) starts a new pass from the beginning.
    State is per process: give each process its own save_state path.
    """

    def __init__(self, config: PipelineConfig):
        config.validate()
        self.config = c = config
        tf = _tf()
        all_files = record_sets.expand_record_files(c.files if isinstance(c.files, str) else list(c.files), "record")
        # tf.data and the saved state see names relative to this directory, never paths: a workdir or record
        # set moved elsewhere with the same names resumes (the iterator state holds the names it has open).
        self.base = record_sets.common_dir(all_files)
        self._legacy = False  # restored from a state saved with absolute paths (before names): read by path
        self._sizes: Optional[dict[str, int]] = None  # bytes per file, for the saved fingerprint
        not_records = self._check_headers(all_files)
        for here in record_sets.check_record_set(
            [f for f in all_files if f not in not_records], damaged_ok=c.skip_damaged_records
        ):
            log.warning(
                "pipeline: the record files in %s have no metadata.json listing them (google-research/bert's "
                "records?), so missing, extra or changed shards cannot be detected",
                here,
            )
        if c.verify_checksums:
            record_sets.verify_checksums([f for f in all_files if f not in not_records])
        vocab_size = c.vocab_size if c.vocab_size is not None else (c.vocab.size if c.vocab else None)
        self.metadata = records.check_schema(
            [f for f in all_files if f not in not_records] or all_files,
            c.max_seq_length,
            c.max_predictions_per_seq,
            vocab_size,
            c.max_instances_per_row,
        )
        self.schema = records.RecordSchema(c.max_seq_length, c.max_predictions_per_seq, c.max_instances_per_row)
        self.files, self.split_by_example = record_sets.split_files(all_files, c.process_index, c.process_count)
        # With skip_damaged_records: readable records per file (each file is read up to its first damage).
        self.readable: Optional[dict[str, int]] = None
        self.damaged: list[record_sets.FileScan] = []  # what skip_damaged_records skipped, for the log and metrics
        self.skipped_records = 0  # of them, records lost where metadata.json lists the file's count
        if c.skip_damaged_records:
            self._scan_for_damage(all_files if not c.training else self.files)
        self.masking = self._masking_config() if c.dynamic_masking else None
        self._parallel = tf.data.AUTOTUNE if c.threads is None else (c.threads if c.threads > 1 else None)
        self._deterministic = True if self._parallel else None  # tf.data warns when given to sequential ops
        self.num_examples: Optional[int] = None  # eval: real rows on this process
        self.num_batches: Optional[int] = None  # eval: batches per pass, the same on every process
        if c.training:
            self._check_not_empty()
        else:
            self._count_eval(all_files)
        self.dataset = self._build()
        self._iterator = iter(self.dataset)
        self._exhausted = False
        self._position = 0  # eval: batches of the current pass handed out

    # --- Construction ----------------------------------------------------------------------------
    def _check_headers(self, files: list[str]) -> set[str]:
        """Files whose first bytes are no record header: an error, or (skip_damaged_records) skipped."""
        from concurrent import futures

        with futures.ThreadPoolExecutor(16) as pool:  # one small read a file: many at once on remote storage
            problems = dict(zip(files, pool.map(record_sets.record_header_problem, files)))
        bad = {f: p for f, p in problems.items() if p}
        if bad and not self.config.skip_damaged_records:
            path = next(iter(bad))
            hint = (
                " (it describes the record set: name the shards, or their directory)"
                if os.path.basename(path) == records.METADATA_NAME
                else ""
            )
            raise ValueError(
                f"record file {path} has {bad[path]}{hint}; drop it from the file list, or set "
                "config.data.skip_damaged_records=true to skip unreadable files and records (counted "
                "in the log)."
            )
        return set(bad)

    def _scan_for_damage(self, files: list[str]) -> None:
        """skip_damaged_records: every frame of `files` checked once, so that each is read only up to its
        first damage (TF's reader cannot read past one) and what is lost is known and logged."""
        listed = record_sets.listed_counts(files, self.metadata)
        self.readable = {}
        for scan in map(record_sets.scan_file, files):
            self.readable[scan.path] = scan.records
            if scan.problem:
                self.damaged.append(scan)
                log.warning(
                    "pipeline: skipping the rest of a damaged file (config.data.skip_damaged_records): %s",
                    scan.describe(listed.get(scan.path)),
                )
        if self.config.training:  # files with nothing readable leave the rotation
            self.files = [f for f in self.files if self.readable[f]]
        self.skipped_records = sum(max(listed[d.path] - d.records, 0) for d in self.damaged if d.path in listed)
        if self.damaged:
            log.warning(
                "pipeline: %d of %d record file(s) damaged; %s record(s) skipped where metadata.json lists "
                "them, %s bytes unread",
                len(self.damaged),
                len(files),
                f"{self.skipped_records:,}",
                f"{sum(d.size - d.end for d in self.damaged):,}",
            )

    def _masking_config(self) -> instances.InstanceConfig:
        c, md = self.config, self.metadata or {}
        if c.masking is not None:
            return c.masking
        # Packed records: the pipeline's predictions are the row's slots; each instance keeps its own cap.
        per_instance = (
            md.get("max_predictions_per_seq", c.max_predictions_per_seq)
            if c.max_instances_per_row
            else c.max_predictions_per_seq
        )
        rate = md.get("masked_lm_prob", 0.15) if c.masked_lm_prob is None else c.masked_lm_prob
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

    def _examples(self, epochs: Optional[int], shuffle_files: bool):
        """Serialized records of this process: files (shuffled per epoch) → interleave → split."""
        tf, c = _tf(), self.config
        names, read_file = (
            (self.files, tf.data.TFRecordDataset)
            if self._legacy
            else ([self.name(f) for f in self.files], self._read_name)
        )
        if self.readable is None:
            ds, read = tf.data.Dataset.from_tensor_slices(names), read_file
        else:  # each file up to its first damage
            ds = tf.data.Dataset.from_tensor_slices((names, np.array([self.readable[f] for f in self.files], np.int64)))
            read = lambda name, count: read_file(name).take(count)  # noqa: E731
        if shuffle_files:
            ds = ds.shuffle(len(self.files), seed=c.seed, reshuffle_each_iteration=True)
        if epochs != 1:
            ds = ds.repeat(epochs)
        ds = ds.interleave(
            read,
            cycle_length=min(c.cycle_length, len(self.files)),
            block_length=1,
            num_parallel_calls=self._parallel,
            deterministic=self._deterministic,
        )
        if self.split_by_example:  # every process reads the same stream and keeps every P-th record
            ds = ds.shard(c.process_count, c.process_index)
        return ds

    def name(self, path: str) -> str:
        """A record file's name relative to `base` (the path itself when the files share no directory)."""
        return path[len(self.base) + 1 :] if self.base else path

    def _read_name(self, name):
        """One file's records, by name under `base`. Not tf.data.TFRecordDataset: it opens files through a
        flat_map whose saved state holds the full path, which a moved file set no longer has."""
        tf = _tf()
        path = tf.strings.join([self.base + "/", name]) if self.base else name
        return tf.data.experimental.from_variant(
            tf.raw_ops.TFRecordDataset(filenames=path, compression_type="", buffer_size=256 << 10),
            tf.TensorSpec([], tf.string),
        )

    def _check_not_empty(self) -> None:
        """A process with no records would spin forever on repeat(); say why instead."""
        tf, c = _tf(), self.config
        try:
            empty = not self.files or not any(True for _ in self._examples(1, False).take(1))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise self._read_error(e) from None
        if empty:
            what = (
                f"hold fewer records than process_count={c.process_count}"
                if self.split_by_example
                else f"given to process {c.process_index} ({', '.join(self.files)}) are empty"
                + (" or wholly damaged" if self.damaged else "")
            )
            raise ValueError(
                f"the record files {what}, so process {c.process_index} gets no examples; write "
                f"more records or shards, or use fewer processes."
            )

    def _count_eval(self, all_files: list[str]) -> None:
        c = self.config
        counts = (
            [self.readable[f] for f in all_files]
            if self.readable is not None
            else record_sets.count_records(all_files, self.metadata)
        )
        total, p = sum(counts), c.process_count
        if total == 0:
            raise ValueError(f"the eval files {', '.join(all_files)} hold no records; re-run prepare.")
        if self.split_by_example:
            per_process = [total // p + (i < total % p) for i in range(p)]
        else:
            per_process = [sum(counts[i::p]) for i in range(p)]
        if total < p:
            log.warning(
                "pipeline: %d eval records for %d processes; processes %s get only padding rows.",
                total,
                p,
                [i for i, n in enumerate(per_process) if n == 0],
            )
        self.num_examples = per_process[c.process_index]
        self.num_batches = max(1, math.ceil(max(per_process) / c.batch_size))
        if c.max_batches:
            self.num_batches = min(self.num_batches, c.max_batches)

    def _build(self):
        tf, c = _tf(), self.config
        if c.training:
            ds = self._examples(c.num_epochs, shuffle_files=True)
            ds = ds.shuffle(c.shuffle_buffer, seed=c.seed + 1, reshuffle_each_iteration=True)
            ds = ds.batch(c.batch_size, drop_remainder=True)
        else:
            ds = self._examples(1, shuffle_files=False).batch(c.batch_size)
        ds = ds.enumerate()  # the batch index seeds dynamic masking; part of the iterator state
        ds = ds.map(self._parse, num_parallel_calls=self._parallel, deterministic=self._deterministic)
        if not c.training:
            real = math.ceil(self.num_examples / c.batch_size)
            padding = tf.data.Dataset.from_tensors(self._zeros())
            ds = ds.concatenate(padding.repeat(max(0, self.num_batches - real))).take(self.num_batches)
            # Passes follow each other in one iterator: deleting a tf.data iterator while the training
            # pipeline's threads are busy can block for seconds (30 s seen in a 2-core run), per eval.
            ds = ds.repeat()
        options = tf.data.Options()
        options.deterministic = True
        if c.dynamic_masking:  # the numpy masker is a pure function of its inputs: safe to checkpoint
            options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        if c.threads is not None:
            options.threading.private_threadpool_size = c.threads
            options.threading.max_intra_op_parallelism = 1
        return ds.prefetch(c.prefetch).with_options(options)

    def _zeros(self) -> dict:
        tf, c = _tf(), self.config
        return {
            name: tf.zeros(shape, tf.as_dtype(dtype))
            for name, (shape, dtype) in batch_shapes(
                c.batch_size, c.max_seq_length, c.max_predictions_per_seq, c.max_instances_per_row
            ).items()
        }

    def _parse(self, index, serialized) -> dict:
        tf, c = _tf(), self.config
        parsed = tf.io.parse_example(serialized, self.schema.feature_spec())
        batch = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
        if not c.max_instances_per_row:
            batch["next_sentence_labels"] = tf.reshape(batch["next_sentence_labels"], [-1])
        rows = tf.shape(serialized)[0]
        batch[EXAMPLE_WEIGHT] = tf.ones([rows], tf.float32)
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
        """Original tokens back, then a fresh 15% / 80-10-10 masking seeded by (seed, process, batch)."""
        c = self.config
        original = instances.unmask(input_ids, positions, ids, weights)
        if original.size and original.max() >= c.vocab.size:
            raise ValueError(
                f"records hold token id {original.max()} ≥ vocab.size={c.vocab.size}; the vocab "
                "does not belong to these records."
            )
        rng = np.random.default_rng([c.seed, c.process_index, int(index)])
        if c.max_instances_per_row:
            m = packing.mask_rows(original, input_mask, self.masking, c.vocab, rng, c.max_predictions_per_seq)
        else:
            m = instances.mask_tokens(original, input_mask, self.masking, c.vocab, rng)
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
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise self._read_error(e) from None
        self._position += 1
        return {k: v.numpy() for k, v in batch.items()}

    def _read_error(self, error) -> ValueError:
        """TF names a damaged record by byte offset only: find the file (on this failure path only)."""
        listed = record_sets.listed_counts(self.files, self.metadata)
        for scan in map(record_sets.scan_file, self.files):
            if scan.problem:
                return record_sets.damaged_file_error(scan, listed)
        return ValueError(
            f"reading {', '.join(self.files)} failed: {_tf_message(error)}; these are not BERT "
            "pre-training records of this schema: re-run prepare, or drop the file that is not."
        )

    # --- State -------------------------------------------------------------------------------------
    def _file_sizes(self) -> list[int]:
        """Bytes of each of this process's files, stat'ed once (many at a time: remote storage is slow)."""
        if self._sizes is None:
            from concurrent import futures

            tf = _tf()
            with futures.ThreadPoolExecutor(16) as pool:
                self._sizes = dict(zip(self.files, pool.map(lambda f: tf.io.gfile.stat(f).length, self.files)))
        return [self._sizes[f] for f in self.files]

    def _fingerprint(self) -> dict:
        c = self.config
        # Names and sizes, not paths: the same files elsewhere match, a changed one does not.
        files = self.files if self._legacy else [[self.name(f), n] for f, n in zip(self.files, self._file_sizes())]
        return {
            "files": files,
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

    def save_state(self, path: str) -> str:
        """Writes the iterator position (shuffle buffer and prefetched batches included) under prefix path."""
        if files.is_remote(path):  # TensorFlow's gs:// is not the file layer's: written locally, then uploaded
            with files.writing_dir(os.path.dirname(path)) as local:
                self.save_state(os.path.join(local, os.path.basename(path)))
            return path
        tf = _tf()
        prefix = tf.train.Checkpoint(iterator=self._iterator).write(path)
        with tf.io.gfile.GFile(path + ".pipeline.json", "w") as f:
            json.dump(self._fingerprint(), f, sort_keys=True)
        return prefix

    def restore_state(self, path: str) -> None:
        """Continues exactly where the pipeline that wrote path stopped; it must have the same config."""
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
        legacy = bool(saved.get("files")) and isinstance(saved["files"][0], str)
        if legacy != self._legacy:  # its iterator state opened files by path: read them so again
            self._legacy = legacy
            self.dataset = self._build()
        mine = self._fingerprint()
        diff = sorted(k for k in set(saved) | set(mine) if k != "files" and saved.get(k) != mine.get(k))
        if diff:
            raise PipelineMismatch(
                f"{info}: the saved pipeline differs in {', '.join(diff)}; restore with the config it was saved with."
            )
        changed = record_sets.files_difference(saved.get("files", []), mine["files"])
        if changed:
            raise PipelineMismatch(
                f"{info}: {changed}; restore with the files it was saved with or start a new workdir."
            )
        self._iterator, self._exhausted = iter(self.dataset), False
        tf.train.Checkpoint(iterator=self._iterator).read(path).assert_consumed()
