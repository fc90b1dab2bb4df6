"""One record set as the input pipeline reads it: its files checked (headers, completeness against metadata.json,
checksums, the schema), split over processes, scanned for damage when asked, and this process's serialized records
as a tf.data stream opened by names relative to the set's directory (a moved set resumes).

The pipeline reads one of these, or one per source of a data mixture (pipeline.py, mixture.py).
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Optional

import numpy as np

from bertjax.data import stream_window

from bertjax.runtime import files
from bertjax.data.pretraining import record_sets, records

log = logging.getLogger(__name__)


_HIDDEN = False


def tf_hidden():
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


def tf_message(error) -> str:
    """A TensorFlow error's own words, without the op and function names around them."""
    text = re.sub(r"\{\{[^}]*\}\}|\[Op:[^\]]*\].*$", "", error.message.splitlines()[0] if error.message else "")
    return text.strip() or type(error).__name__


class RecordStream:
    """A record set's files for one process (`config` is the pipeline's PipelineConfig); `label` names it in
    messages (a mixture's source)."""

    def __init__(self, patterns: Any, config: Any, label: str = ""):
        self.config, self.label = config, label
        c = config
        self.all_files = record_sets.expand_record_files(
            patterns if isinstance(patterns, str) else list(patterns), "record"
        )
        # tf.data and the saved state see names relative to this directory, never paths: a workdir or record
        # set moved elsewhere with the same names resumes (the iterator state holds the names it has open).
        self.base = record_sets.common_dir(self.all_files)
        # In a bucket: no copy of the set; this process's pieces stream through a bounded window (data/stream_window.py).
        self.remote = files.is_remote(self.all_files[0])
        if any(files.is_remote(f) != self.remote for f in self.all_files):
            raise ValueError(
                f"the record files of {self.where()} mix gs:// objects and local files; a record set is read from one "
                "place: copy one part to the other."
            )
        self.listing: dict[str, tuple[int, str]] = {}  # in a bucket: each file's (size, generation) when listed
        if self.remote:
            for here in dict.fromkeys(os.path.dirname(f) for f in self.all_files):
                self.listing.update(files.versions(here))
        self.window: Optional[stream_window.ShardWindow] = None
        self.parts = 1  # in a bucket with fewer files than processes: each file read as this many byte ranges
        self.legacy = False  # restored from a state saved with absolute paths (before names): read by path
        self._sizes: Optional[dict[str, int]] = None  # bytes per file, for the saved fingerprint
        self._counts: Optional[list[int]] = None  # records per file of all_files (record_counts)
        not_records = self._check_headers(self.all_files)
        readable = [f for f in self.all_files if f not in not_records]
        for here in record_sets.check_record_set(readable, damaged_ok=c.skip_damaged_records):
            log.warning(
                "pipeline: the record files in %s have no metadata.json listing them (google-research/bert's "
                "records?), so missing, extra or changed shards cannot be detected",
                here,
            )
        if c.verify_checksums and not self.remote:  # in a bucket: each shard as the window fetches it
            record_sets.verify_checksums(readable)
        vocab_size = c.vocab_size if c.vocab_size is not None else (c.vocab.size if c.vocab else None)
        self.metadata = records.check_schema(
            readable or self.all_files, c.max_seq_length, c.max_predictions_per_seq, vocab_size, c.max_instances_per_row
        )
        self.files, self.split_by_example = record_sets.split_files(self.all_files, c.process_index, c.process_count)
        if self.remote and self.split_by_example and c.training:  # a host downloads its byte range of each file
            self.split_by_example, self.parts = False, c.process_count
            log.info(
                "pipeline: %d record file(s) for %d processes: each file is split into %d byte ranges at record "
                "boundaries, and process %d reads range %d of each",
                len(self.all_files),
                c.process_count,
                self.parts,
                c.process_index,
                c.process_index,
            )
        # With skip_damaged_records: readable records per file (each file is read up to its first damage).
        self.readable: Optional[dict[str, int]] = None
        self.damaged: list[record_sets.FileScan] = []  # what skip_damaged_records skipped, for the log and metrics
        self.skipped_records = 0  # of them, records lost where metadata.json lists the file's count
        if c.skip_damaged_records:
            self._scan_for_damage(self.all_files if not c.training else self.files)

    def where(self) -> str:
        return f"source {self.label!r} ({', '.join(self.all_files[:2])}{', …' if len(self.all_files) > 2 else ''})"

    # --- Checks ------------------------------------------------------------------------------------------
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

    def check_not_empty(self) -> None:
        """A process with no records would spin forever on repeat(); say why instead."""
        tf, c = tf_hidden(), self.config
        try:
            if self.remote:  # by the listing (a file with a record header holds a record); ranges: by the window
                empty = not any(self.listing[f][0] for f in self.files)
            else:
                empty = not self.files or not any(True for _ in self.examples(1, False).take(1))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise self.read_error(e) from None
        if empty:
            what = (
                f"hold fewer records than process_count={c.process_count}"
                if self.split_by_example
                else f"given to process {c.process_index} ({', '.join(self.files)}) are empty"
                + (" or wholly damaged" if self.damaged else "")
            )
            source = f" of {self.where()}" if self.label else ""
            raise ValueError(
                f"the record files{source} {what}, so process {c.process_index} gets no examples; write "
                f"more records or shards, or use fewer processes."
            )

    def record_counts(self) -> list[int]:
        """Records in each of all_files (every process's); counted once (without metadata.json, by reading them)."""
        if self._counts is None:
            if self.readable is not None and set(self.readable) >= set(self.all_files):
                self._counts = [self.readable[f] for f in self.all_files]
            else:
                self._counts = record_sets.count_records(self.all_files, self.metadata)
        return self._counts

    def tokens(self) -> tuple[float, str]:
        """The set's size for a mixture's `auto` weight: metadata.json's corpus tokens, in the share of its
        records these files hold; without metadata.json, the records themselves."""
        counts = self.record_counts()
        listed = sum(int(f.get("records", f.get("instances", 0))) for f in (self.metadata or {}).get("files", ()))
        tokens = (self.metadata or {}).get("counts", {}).get("tokens")
        if tokens and listed:
            return tokens * sum(counts) / listed, "tokens"
        return float(sum(counts)), "records"

    def eval_counts(self, batch_size: int, max_batches: Optional[int]) -> tuple[int, int]:
        """Eval: (this process's real rows, batches per pass — the same on every process)."""
        c = self.config
        counts = self.record_counts()
        total, p = sum(counts), c.process_count
        if total == 0:
            raise ValueError(f"the eval files {', '.join(self.all_files)} hold no records; re-run prepare.")
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
        batches = max(1, math.ceil(max(per_process) / batch_size))
        return per_process[c.process_index], min(batches, max_batches) if max_batches else batches

    # --- The stream ----------------------------------------------------------------------------------------
    def examples(self, epochs: Optional[int], shuffle_files: bool, seed: Optional[int] = None):
        """Serialized records of this process: files (shuffled per epoch, by `seed` or the config's) → interleave →
        split."""
        tf, c = tf_hidden(), self.config
        names, read_file = (
            (self.files, tf.data.TFRecordDataset)
            if self.legacy
            else ([self.name(f) for f in self.files], self._read_name)
        )
        counts = None if self.readable is None else np.array([self.readable[f] for f in self.files], np.int64)

        def order():  # the files' order: a pure function of the seed, so the window can iterate it ahead
            ds = tf.data.Dataset.from_tensor_slices(names if counts is None else (names, counts))
            if shuffle_files:
                ds = ds.shuffle(len(self.files), seed=c.seed if seed is None else seed, reshuffle_each_iteration=True)
            return ds.repeat(epochs) if epochs != 1 else ds

        ds = order()
        read = read_file if counts is None else lambda name, count: read_file(name).take(count)  # noqa: E731
        if self.remote:
            ds, read = self._through_window(ds, read, order)
        cycle = min(c.cycle_length, len(self.files))
        parallel = c.parallel_calls(cycle)  # tf.data refuses more parallel reads than files in the cycle
        ds = ds.interleave(
            tf.autograph.experimental.do_not_convert(read),  # TensorFlow ops only, no control flow to convert
            cycle_length=cycle,
            block_length=1,
            num_parallel_calls=parallel,
            deterministic=True if parallel else None,
        )
        if self.split_by_example:  # every process reads the same stream and keeps every P-th record
            ds = ds.shard(c.process_count, c.process_index)
        return ds

    def _through_window(self, ds, read, order):
        """The file-name stream and reader of a set in a bucket: each name waits for its piece in this process's
        window (a blocking call in a tf.data map), and a marker after the piece's last record releases it."""
        tf, window = tf_hidden(), self._window()
        plain = tf.autograph.experimental.do_not_convert
        first = (lambda x: x[0]) if self.readable is not None else (lambda x: x)  # noqa: E731
        quiet = tf.data.Options()
        # No autotuning thread: deleting an autotuned iterator waits out that thread's period (~30 s at every
        # streamed job's exit, seen in gdb), and a list of names has nothing to tune.
        quiet.autotune.enabled = False
        window.set_order(  # iterated in the fetcher's thread
            lambda start: (first(x).decode() for x in order().skip(start).with_options(quiet).as_numpy_iterator())
        )

        def fetch(index, name):
            return window.local(int(index), name.decode()).encode()

        def release(name):
            window.done(name.decode())
            return name

        def wait(index, x):
            name = tf.numpy_function(fetch, [index, x[0] if isinstance(x, tuple) else x], tf.string, stateful=True)
            name = tf.ensure_shape(name, [])
            return (name, x[1]) if isinstance(x, tuple) else name

        def read_and_release(name, *count):
            done = tf.data.Dataset.from_tensors(name).map(
                plain(lambda n: tf.ensure_shape(tf.numpy_function(release, [n], tf.string, stateful=True), []))
            )
            return read(name, *count).concatenate(done.filter(plain(lambda _: False)))

        return ds.enumerate().map(plain(wait)), read_and_release

    def _window(self) -> stream_window.ShardWindow:
        """This process's window onto the set (made once): its pieces, folder and byte budget."""
        if self.window is None:
            c = self.config
            pieces = [
                stream_window.Piece(
                    f, self.name(f), *self.listing[f], part=c.process_index if self.parts > 1 else 0, parts=self.parts
                )
                for f in self.files
            ]
            largest = max(p.byte_range[1] - p.byte_range[0] for p in pieces)
            cycle = min(c.cycle_length, len(pieces))
            budget = c.stream_window_bytes or (2 * cycle + 2) * largest  # the reader's cycle held, as much again ahead
            listed = {e["file"]: e.get("crc32c") for e in (self.metadata or {}).get("files", ())}
            checksums = (
                {
                    p.name: listed[os.path.basename(p.url)]
                    for p in pieces
                    if p.whole and listed.get(os.path.basename(p.url))
                }
                if c.verify_checksums
                else {}
            )
            label = self.label or ("training set" if c.training else "held-out set")
            self.window = stream_window.ShardWindow(
                pieces,
                stream_window.window_folder(self.base, label, c.process_index),
                budget,
                f"{label} {self.base}",
                checksums=checksums,
            )
        return self.window

    def name(self, path: str) -> str:
        """A record file's name relative to `base` (the path itself when the files share no directory)."""
        return path[len(self.base) + 1 :] if self.base else path

    def _read_name(self, name):
        """One file's records, by name under `base`. Not tf.data.TFRecordDataset: it opens files through a
        flat_map whose saved state holds the full path, which a moved file set no longer has."""
        tf = tf_hidden()
        base = self.window.folder if self.window is not None else self.base  # a bucket's set: its window
        path = tf.strings.join([base + "/", name]) if base else name
        return tf.data.experimental.from_variant(
            tf.raw_ops.TFRecordDataset(filenames=path, compression_type="", buffer_size=256 << 10),
            tf.TensorSpec([], tf.string),
        )

    def damage(self) -> Optional[ValueError]:
        """The first damaged file of this process's, as the error naming it, or None (scanned: a failure path)."""
        listed = record_sets.listed_counts(self.files, self.metadata)
        for scan in map(record_sets.scan_file, self.files):
            if scan.problem:
                return record_sets.damaged_file_error(scan, listed)
        return None

    def read_error(self, error) -> ValueError:
        """TF names a damaged record by byte offset only: find the file (on this failure path only)."""
        return self.damage() or self.not_records(error)

    def not_records(self, error) -> ValueError:
        """A reading error with no damaged frame to blame: files of another schema, or not records at all."""
        return ValueError(
            f"reading {', '.join(self.files)} failed: {tf_message(error)}; these are not BERT "
            "pre-training records of this schema: re-run prepare, or drop the file that is not."
        )

    # --- The saved position's fingerprint ------------------------------------------------------------------
    def fingerprint_files(self) -> list:
        """[name, bytes] of this process's files in reading order (paths, for a state saved before names)."""
        if self.legacy:
            return list(self.files)
        if self._sizes is None:  # stat'ed once, many at a time: remote storage is slow
            from concurrent import futures

            if self.remote:
                self._sizes = {f: self.listing[f][0] for f in self.files}
            else:
                with futures.ThreadPoolExecutor(16) as pool:
                    self._sizes = dict(zip(self.files, pool.map(os.path.getsize, self.files)))
        return [[self.name(f), self._sizes[f]] for f in self.files]
