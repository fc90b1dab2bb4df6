"""Corpus → pre-masked TFRecord shards + metadata.json, on local workers or Apache Beam.

Work is split by output shard, planned once from the corpus and the shard count (`plan_shards`).
Raw-text files are cut into byte ranges at document boundaries, so that shard k reads its own k-th
of the bytes however few and large the files are (a single file spreads over all shards); other
sources hand out whole units (TFDS shards, stdlib modules) round-robin, or — when there are fewer
units than shards — every shard reads them all and keeps documents k, k+S, ... Each shard cuts its
documents into blocks of ~BLOCK_CHARS characters; each block is tokenized, turned into instances with
the seed (random_seed, k, block) and written at once, so memory stays flat however large the corpus,
and the records depend on the corpus, the seed and the shard count only: not on the number of
workers, nor on the runner.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import pickle
import queue as queue_lib
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np

from bertjax.data.corpus import sources as corpus_lib
from bertjax.runtime import files
from bertjax.data.pretraining import instances as instances_lib
from bertjax.data.pretraining import packing as packing_lib
from bertjax.data.pretraining import records
from bertjax.data.vocab import tokenization
from bertjax.data.vocab.accents import AccentCounter

log = logging.getLogger(__name__)

# Characters of text per block: ~250k tokens, ~20k instances at dupe_factor 10 (~40 MB of arrays).
BLOCK_CHARS = 1_000_000
# Sentences per tokenizer call: bounds the tokenizer's per-sentence objects (offsets, strings).
ENCODE_BATCH = 4096
SHARD_STATS_SUFFIX = ".stats.json"
COUNT_KEYS = (
    "documents",
    "sentences",
    "tokens",
    "empty_sentences",
    "empty_documents",
    "instances",
    "masked",
    "rows",
    "real_tokens",
    "covered_tokens",
)


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    input_file: str
    output_dir: str
    vocab_file: str
    instance: instances_lib.InstanceConfig
    do_lower_case: bool = True
    random_seed: int = 12345
    num_shards: int = 16
    tfds_data_dir: Optional[str] = None
    tfds_text_feature: str = "text"  # deprecated alias of text_field, used when text_field is "text"
    text_field: str = "text"  # TFDS feature / Parquet column / JSON key holding a document's text
    skip_bad_json_lines: bool = False  # JSON lines that do not parse: skipped and counted, not an error
    block_chars: int = BLOCK_CHARS
    packing: Optional[packing_lib.PackingConfig] = None  # several instances a row (data/pretraining/packing.py)

    @property
    def schema(self) -> records.RecordSchema:
        if self.packing is None:
            return records.RecordSchema(self.instance.max_seq_length, self.instance.max_predictions_per_seq)
        return records.RecordSchema(
            self.instance.max_seq_length, self.packing.max_predictions_per_row, self.packing.max_instances_per_row
        )

    @property
    def staging_dir(self) -> str:
        """Where shards are written until the whole set is committed (records.STAGING_NAME)."""
        return os.path.join(self.output_dir, records.STAGING_NAME)

    def shard_name(self, k: int) -> str:
        return f"records-{k:05d}-of-{self.num_shards:05d}.tfrecord"

    def shard_path(self, k: int) -> str:
        """Where shard k is written: in the staging folder; `commit` moves it beside metadata.json."""
        return os.path.join(self.staging_dir, self.shard_name(k))

    def open_source(self) -> corpus_lib.Source:
        return corpus_lib.open_source(
            self.input_file,
            data_dir=self.tfds_data_dir,
            text_field=self.text_field,
            text_feature=self.tfds_text_feature,
            skip_bad_json_lines=self.skip_bad_json_lines,
        )


@dataclasses.dataclass(frozen=True)
class ShardWork:
    """What shard `shard` reads: `units` in order, keeping documents i with i % stride == shard % stride."""

    shard: int
    units: tuple
    stride: int = 1

    @property
    def reads_whole_corpus(self) -> bool:
        return self.stride > 1


def plan_shards(cfg: PrepareConfig, source: Optional[corpus_lib.Source] = None) -> list[ShardWork]:
    """Each shard's work: a function of the corpus and num_shards only, so any worker can run any shard."""
    source = source or cfg.open_source()
    split = source.split(cfg.num_shards)
    if split is None:  # fewer units than shards: every shard reads all, keeps every num_shards-th document
        units = tuple(source.list_units())
        return [ShardWork(k, units, cfg.num_shards) for k in range(cfg.num_shards)]
    return [ShardWork(k, tuple(units)) for k, units in enumerate(split)]


# Loaded once per process: building BERT's normaliser tables takes ~1 s, longer than a small shard.
_TOKENIZERS: dict[tuple[str, bool], tuple[tokenization.Tokenizer, instances_lib.Vocab]] = {}


def load_tokenizer(cfg: PrepareConfig) -> tuple[tokenization.Tokenizer, instances_lib.Vocab]:
    key = (os.path.abspath(cfg.vocab_file), cfg.do_lower_case)
    if key not in _TOKENIZERS:
        tokenizer = tokenization.load(cfg.vocab_file, cfg.do_lower_case)
        _TOKENIZERS[key] = tokenizer, instances_lib.Vocab.from_tokenizer(tokenizer)
    return _TOKENIZERS[key]


def _shard_documents(work: ShardWork, source: corpus_lib.Source, stats: corpus_lib.CorpusStats) -> Iterator[list[str]]:
    documents = source.read(work.units, stats)
    if work.stride == 1:
        return documents
    return itertools.islice(documents, work.shard % work.stride, None, work.stride)


def _blocks(documents: Iterator[list[str]], block_chars: int) -> Iterator[list[list[str]]]:
    block, chars = [], 0
    for doc in documents:
        block.append(doc)
        chars += sum(map(len, doc))
        if chars >= block_chars:
            yield block
            block, chars = [], 0
    if block:
        yield block


def tokenize_block(
    tokenizer: tokenization.Tokenizer,
    documents: list[list[str]],
    counts: dict[str, int],
    accents: Optional[AccentCounter] = None,
) -> instances_lib.TokenizedBlock:
    """Tokenizes a block in batches; sentences and documents left with no tokens are counted and dropped;
    `accents` counts what accent stripping changes."""
    sentences = [s for doc in documents for s in doc]
    if accents is not None:
        accents.add("\n".join(sentences))  # one scan a block
    pieces, lengths = [], []
    for i in range(0, len(sentences), ENCODE_BATCH):
        ids = tokenizer.encode_batch(sentences[i : i + ENCODE_BATCH])
        lengths.append(np.fromiter(map(len, ids), np.int64, len(ids)))
        pieces.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths[-1].sum())))
    del sentences
    sentence_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    doc_of_sentence = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    kept = sentence_lengths > 0
    doc_sentences = np.bincount(doc_of_sentence[kept], minlength=len(documents))
    counts["empty_sentences"] += int((~kept).sum())
    counts["empty_documents"] += int((doc_sentences == 0).sum())
    doc_sentences = doc_sentences[doc_sentences > 0]
    sentence_lengths = sentence_lengths[kept]
    counts["documents"] += len(doc_sentences)
    counts["sentences"] += len(sentence_lengths)
    counts["tokens"] += len(tokens)
    return instances_lib.TokenizedBlock(
        tokens, np.concatenate([[0], np.cumsum(sentence_lengths)]), np.concatenate([[0], np.cumsum(doc_sentences)])
    )


def shard_seed(random_seed: int, shard: int, block: int) -> int:
    return int(np.random.SeedSequence([random_seed, shard, block]).generate_state(1)[0])


def process_shard(
    cfg: PrepareConfig,
    work: ShardWork | int,
    progress: Optional[Callable[[dict], None]] = None,
    source: Optional[corpus_lib.Source] = None,
) -> dict:
    """Writes one shard and its stats file; returns the stats. `work` may be a shard index (planned here)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker: scale with --num_workers
    source = source or cfg.open_source()
    if isinstance(work, int):
        work = plan_shards(cfg, source)[work]
    k = work.shard
    tokenizer, vocab = load_tokenizer(cfg)
    corpus_stats = corpus_lib.CorpusStats()
    counts = dict.fromkeys(COUNT_KEYS, 0)
    accents = AccentCounter() if tokenizer.strip_accents else None
    with records.RecordWriter(cfg.shard_path(k)) as writer:
        for b, block_docs in enumerate(_blocks(_shard_documents(work, source, corpus_stats), cfg.block_chars)):
            block = tokenize_block(tokenizer, block_docs, counts, accents)
            del block_docs
            if block.num_documents == 0:
                continue
            arrays = instances_lib.create_instances(
                block, cfg.instance, vocab, shard_seed(cfg.random_seed, k, b), counts=counts
            )
            made = len(arrays["input_ids"])
            counts["instances"] += made
            counts["masked"] += int(arrays["masked_lm_weights"].sum())
            counts["real_tokens"] += int(arrays["input_mask"].sum())
            if cfg.packing is not None:
                arrays = packing_lib.pack(arrays, cfg.packing)
            counts["rows"] += len(arrays["input_ids"])
            writer.write_block(arrays)
            if progress:
                progress(dict(shard=k, instances=made, documents=block.num_documents))
            del arrays, block
    # A shard that read the whole corpus to keep its share reports the corpus only as shard 0.
    result = dict(
        shard=k,
        file=cfg.shard_name(k),
        bytes=writer.size,
        crc32c=writer.crc32c,
        **counts,
        corpus=corpus_stats.as_dict() if (k == 0 or not work.reads_whole_corpus) else None,
        accents_stripped=dict(accents.by_char) if accents else {},  # character -> times changed
    )
    with records.open_for_write(cfg.shard_path(k) + SHARD_STATS_SUFFIX) as f:
        f.write(json.dumps(result).encode())
    return result


# --- Runners -------------------------------------------------------------------------------------


class Progress:
    """Rate and ETA on stderr, at most every `interval` seconds."""

    def __init__(self, total_shards: int, interval: float = 2.0, stream=None):
        # sys.stderr looked up now, not at import: a replaced stream (pytest's capture, a notebook) is used
        self.total, self.interval, self.stream = total_shards, interval, stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.instances = self.documents = self.shards_done = 0

    def update(self, event: dict) -> None:
        self.instances += event.get("instances", 0)
        self.documents += event.get("documents", 0)
        self.shards_done += event.get("shard_done", 0)
        now = time.monotonic()
        if now - self.last >= self.interval or self.shards_done == self.total and event.get("shard_done"):
            self.last = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        done = self.shards_done / self.total
        eta = f"{(elapsed / done - elapsed):.0f}s" if 0 < done < 1 else ("0s" if done >= 1 else "?")
        return (
            f"prepare: shards {self.shards_done}/{self.total}, {self.documents:,} documents, "
            f"{self.instances:,} instances, {self.instances / elapsed:,.0f} instances/s, "
            f"elapsed {elapsed:.0f}s, ETA {eta}"
        )


def _take(counter: Any, total: int) -> Optional[int]:
    """The next shard nobody has taken yet, or None: shards go to whichever process is free first."""
    with counter.get_lock():
        i = counter.value
        if i >= total:
            return None
        counter.value = i + 1
        return i


def _die_with_parent(parent_pid: int) -> None:
    """Ends this worker when its parent dies, SIGKILL included (which no handler in the parent can see):
    the kernel's parent-death signal on Linux, and a watcher of the parent's pid everywhere."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="bertjax-prepare-parent-watch").start()


def _worker_main(
    cfg: PrepareConfig,
    plan: list[ShardWork],
    counter: Any,
    events: Any,
    tokenizer: tokenization.Tokenizer,
    parent_pid: int,
) -> None:
    """A spawned worker: takes shards until none are left, reporting on `events`."""
    _die_with_parent(parent_pid)
    try:
        # The parent's tokenizer comes with the spawn arguments (~25 ms) instead of being rebuilt (~1 s).
        _TOKENIZERS[(os.path.abspath(cfg.vocab_file), cfg.do_lower_case)] = (
            tokenizer,
            instances_lib.Vocab.from_tokenizer(tokenizer),
        )
        source = cfg.open_source()
        while (i := _take(counter, len(plan))) is not None:
            events.put(("start", i, os.getpid()))
            events.put(
                (
                    "done",
                    i,
                    process_shard(cfg, plan[i], progress=lambda e: events.put(("progress", i, e)), source=source),
                )
            )
    except BaseException as e:  # noqa: BLE001 (reported to the parent, which raises it)
        try:
            pickle.dumps(e)
        except Exception:  # noqa: BLE001
            e = RuntimeError(f"{type(e).__name__}: {e}")
        events.put(("error", None, e))


def run_local(
    cfg: PrepareConfig, num_workers: int, progress: Progress, plan: Optional[list[ShardWork]] = None
) -> list[dict]:
    """Shards on `num_workers` processes: this one and num_workers - 1 spawned ones. This process
    works too, so that the workers' start-up (imports, ~0.5 s) overlaps with real work."""
    source = cfg.open_source()
    plan = plan or plan_shards(cfg, source)
    num_workers = max(1, min(num_workers, len(plan)))
    if num_workers == 1:
        results = []
        for work in plan:
            results.append(process_shard(cfg, work, progress=progress.update, source=source))
            progress.update(dict(shard_done=1))
        return results
    # spawn: workers start clean, never forking a parent that holds TensorFlow, JAX or tokenizer threads.
    ctx = multiprocessing.get_context("spawn")
    events, counter = ctx.Queue(), ctx.Value("i", 0)
    tokenizer = load_tokenizer(cfg)[0]
    workers = [
        ctx.Process(
            target=_worker_main,
            args=(cfg, plan, counter, events, tokenizer, os.getpid()),
            daemon=True,
            name=f"bertjax-prepare-{w}",
        )
        for w in range(1, num_workers)
    ]
    results: dict[int, dict] = {}
    running: dict[int, int] = {}  # worker pid → shard it is writing

    def handle(event: tuple) -> None:
        kind, i, payload = event
        if kind == "progress":
            progress.update(payload)
        elif kind == "start":
            running[payload] = i
        elif kind == "done":
            results[i] = payload
            progress.update(dict(shard_done=1))
        else:
            raise payload

    def drain(block: bool) -> None:
        while True:
            try:
                handle(events.get(timeout=0.2) if block else events.get_nowait())
            except queue_lib.Empty:
                return
            block = False

    try:
        for w in workers:
            w.start()
        while (i := _take(counter, len(plan))) is not None:
            results[i] = process_shard(
                cfg, plan[i], source=source, progress=lambda e: (progress.update(e), drain(block=False))
            )
            progress.update(dict(shard_done=1))
            drain(block=False)
        while len(results) < len(plan):
            drain(block=True)
            for w in workers:
                if w.exitcode not in (None, 0) and running.get(w.pid) not in results:
                    drain(block=False)  # an error it reported is clearer than its exit code
                    raise RuntimeError(
                        f"prepare worker {w.pid} died (exit code {w.exitcode}; -9 is usually out "
                        f"of memory) while writing shard {running.get(w.pid)}; re-run with fewer "
                        "--num_workers."
                    )
    finally:
        for w in workers:
            if w.pid is None:  # never started: joining would hide the error that stopped us
                continue
            if w.is_alive():
                w.terminate()
            w.join()
    return [results[i] for i in range(len(plan))]


def run_beam(cfg: PrepareConfig, beam_args: list[str], plan: Optional[list[ShardWork]] = None) -> list[dict]:
    """The same `process_shard` as a Beam pipeline; stats come back through the per-shard stats files."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise RuntimeError("--runner=beam needs Apache Beam: pip install 'bertjax[beam]'.") from None
    plan = plan or plan_shards(cfg)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        _ = (
            pipeline
            | "Shards" >> beam.Create(plan)
            | "Spread" >> beam.Reshuffle()
            | "WriteShard" >> beam.Map(_beam_process_shard, cfg)
        )
    return [read_shard_stats(cfg, k) for k in range(cfg.num_shards)]


def _beam_process_shard(work: ShardWork, cfg: PrepareConfig) -> dict:
    return process_shard(cfg, work)


def read_shard_stats(cfg: PrepareConfig, k: int) -> dict:
    return files.read_json(cfg.shard_path(k) + SHARD_STATS_SUFFIX)
