"""Corpus → pre-masked TFRecord shards + metadata.json, on local workers or Apache Beam.

Work is split by output shard. Shard k reads the corpus units (files, TFDS shards, stdlib modules)
k, k+S, k+2S, ... — or, when there are fewer units than shards, every unit keeping documents
k, k+S, ... — and cuts its documents into blocks of ~BLOCK_CHARS characters. Each block is tokenized,
turned into instances with the seed (random_seed, k, block) and written at once, so memory stays flat
however large the corpus, and the records depend on the seed and the shard count only: not on the
number of workers, nor on the runner.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import time
from typing import Callable, Iterator, Optional

import numpy as np

from bertjax.data import corpus as corpus_lib
from bertjax.data import instances as instances_lib
from bertjax.data import records
from bertjax.data import tokenizer as tokenizer_lib

# Characters of text per block: ~500k tokens, ~40k instances at dupe_factor 10 (~150 MB of arrays).
BLOCK_CHARS = 2_000_000
SHARD_STATS_SUFFIX = ".stats.json"


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
    tfds_text_feature: str = "text"
    block_chars: int = BLOCK_CHARS

    def shard_path(self, k: int) -> str:
        return os.path.join(self.output_dir, f"records-{k:05d}-of-{self.num_shards:05d}.tfrecord")

    def open_source(self) -> corpus_lib.Source:
        return corpus_lib.open_source(self.input_file, data_dir=self.tfds_data_dir,
                                      text_feature=self.tfds_text_feature)


def vocab_for_masking(tokenizer: tokenizer_lib.Tokenizer) -> instances_lib.Vocab:
    return instances_lib.Vocab(size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, cls_id=tokenizer.cls_id,
                               sep_id=tokenizer.sep_id, mask_id=tokenizer.mask_id,
                               is_continuation=tokenizer.continuation_mask())


def _shard_documents(cfg: PrepareConfig, source: corpus_lib.Source, units: list[str], k: int,
                     stats: corpus_lib.CorpusStats) -> Iterator[list[str]]:
    if len(units) >= cfg.num_shards:
        yield from source.read(corpus_lib.shard_units(units, k, cfg.num_shards), stats)
        return
    for i, doc in enumerate(source.read(units, stats)):
        if i % cfg.num_shards == k:
            yield doc


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


def tokenize_block(tokenizer: tokenizer_lib.Tokenizer, documents: list[list[str]],
                   counts: dict[str, int]) -> instances_lib.TokenizedBlock:
    """Tokenizes a block in one batch; sentences and documents left with no tokens are counted."""
    ids = tokenizer.encode_batch([s for doc in documents for s in doc])
    tokenized, i = [], 0
    for doc in documents:
        sentences = [x for x in ids[i:i + len(doc)] if x]
        counts["empty_sentences"] += len(doc) - len(sentences)
        i += len(doc)
        if sentences:
            tokenized.append(sentences)
        else:
            counts["empty_documents"] += 1
    counts["documents"] += len(tokenized)
    counts["sentences"] += sum(map(len, tokenized))
    counts["tokens"] += sum(len(s) for doc in tokenized for s in doc)
    return instances_lib.TokenizedBlock.from_documents(tokenized)


def shard_seed(random_seed: int, shard: int, block: int) -> int:
    return int(np.random.SeedSequence([random_seed, shard, block]).generate_state(1)[0])


def process_shard(cfg: PrepareConfig, k: int, progress: Optional[Callable[[dict], None]] = None) -> dict:
    """Writes shard k and its stats file; returns the stats."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker: scale with --num_workers
    tokenizer = tokenizer_lib.load(cfg.vocab_file, cfg.do_lower_case)
    vocab = vocab_for_masking(tokenizer)
    source = cfg.open_source()
    units = source.list_units()
    corpus_stats = corpus_lib.CorpusStats()
    counts = dict(documents=0, sentences=0, tokens=0, empty_sentences=0, empty_documents=0, instances=0,
                  masked=0)
    with records.RecordWriter(cfg.shard_path(k)) as writer:
        for b, block_docs in enumerate(_blocks(_shard_documents(cfg, source, units, k, corpus_stats), cfg.block_chars)):
            block = tokenize_block(tokenizer, block_docs, counts)
            if block.num_documents == 0:
                continue
            arrays = instances_lib.create_instances(block, cfg.instance, vocab, shard_seed(cfg.random_seed, k, b))
            writer.write_block(arrays)
            counts["instances"] += len(arrays["input_ids"])
            counts["masked"] += int(arrays["masked_lm_weights"].sum())
            if progress:
                progress(dict(shard=k, instances=len(arrays["input_ids"]), documents=block.num_documents))
    # With fewer units than shards every shard reads the whole corpus: count the corpus once (shard 0).
    whole_corpus_each = len(units) < cfg.num_shards
    result = dict(shard=k, file=os.path.basename(cfg.shard_path(k)), **counts,
                  corpus=corpus_stats.as_dict() if (k == 0 or not whole_corpus_each) else None)
    with open(cfg.shard_path(k) + SHARD_STATS_SUFFIX, "w") as f:
        json.dump(result, f)
    return result


# --- Runners -------------------------------------------------------------------------------------

class Progress:
    """Rate and ETA on stderr, at most every `interval` seconds."""

    def __init__(self, total_shards: int, interval: float = 2.0, stream=sys.stderr):
        self.total, self.interval, self.stream = total_shards, interval, stream
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
        return (f"prepare: shards {self.shards_done}/{self.total}, {self.documents:,} documents, "
                f"{self.instances:,} instances, {self.instances / elapsed:,.0f} instances/s, "
                f"elapsed {elapsed:.0f}s, ETA {eta}")


_QUEUE = None


def _init_worker(queue) -> None:
    global _QUEUE
    _QUEUE = queue


def _worker(args: tuple[PrepareConfig, int]) -> dict:
    cfg, k = args
    result = process_shard(cfg, k, progress=_QUEUE.put)
    _QUEUE.put(dict(shard_done=1))
    return result


def run_local(cfg: PrepareConfig, num_workers: int, progress: Progress) -> list[dict]:
    if num_workers <= 1:
        results = []
        for k in range(cfg.num_shards):
            results.append(process_shard(cfg, k, progress=progress.update))
            progress.update(dict(shard_done=1))
        return results
    # spawn: workers start clean, never forking a parent that holds TensorFlow or tokenizer threads.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(queue,)) as pool:
        pending = pool.map_async(_worker, [(cfg, k) for k in range(cfg.num_shards)], chunksize=1)
        while not pending.ready() or not queue.empty():
            try:
                progress.update(queue.get(timeout=0.2))
            except Exception:  # queue.Empty
                pass
        return pending.get()


def run_beam(cfg: PrepareConfig, beam_args: list[str]) -> list[dict]:
    """The same `process_shard` as a Beam pipeline; stats come back through the per-shard stats files."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise RuntimeError("--runner=beam needs Apache Beam: pip install 'bertjax[beam]'.") from None
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        _ = (pipeline | "Shards" >> beam.Create(list(range(cfg.num_shards)))
             | "Spread" >> beam.Reshuffle()
             | "WriteShard" >> beam.Map(lambda k: process_shard(cfg, k)))
    return [read_shard_stats(cfg, k) for k in range(cfg.num_shards)]


def read_shard_stats(cfg: PrepareConfig, k: int) -> dict:
    import tensorflow as tf

    with tf.io.gfile.GFile(cfg.shard_path(k) + SHARD_STATS_SUFFIX) as f:
        return json.load(f)


# --- The job -------------------------------------------------------------------------------------

def check_inputs(cfg: PrepareConfig) -> tokenizer_lib.Tokenizer:
    """Fails before any work, in one sentence, on a bad flag, vocab or input."""
    cfg.instance.validate()
    if cfg.num_shards < 1:
        raise ValueError(f"--num_shards={cfg.num_shards} must be ≥ 1.")
    tokenizer = tokenizer_lib.load(cfg.vocab_file, cfg.do_lower_case)
    cfg.open_source().list_units()  # a glob that matches nothing, a missing file, an unknown dataset
    return tokenizer


def prepare(cfg: PrepareConfig, num_workers: int = 1, runner: str = "local", beam_args: tuple[str, ...] = (),
            progress_stream=sys.stderr) -> dict:
    """Runs the whole job; returns (and writes) the metadata."""
    tokenizer = check_inputs(cfg)
    os.makedirs(cfg.output_dir, exist_ok=True)
    start = time.monotonic()
    progress = Progress(cfg.num_shards, stream=progress_stream)
    if runner == "local":
        results = run_local(cfg, num_workers, progress)
    elif runner == "beam":
        results = run_beam(cfg, list(beam_args))
    else:
        raise ValueError(f"--runner={runner!r} is not one of local, beam.")
    seconds = time.monotonic() - start
    for k in range(cfg.num_shards):
        os.remove(cfg.shard_path(k) + SHARD_STATS_SUFFIX)
    return write_job_metadata(cfg, tokenizer, sorted(results, key=lambda r: r["shard"]), seconds, runner, num_workers)


def write_job_metadata(cfg: PrepareConfig, tokenizer: tokenizer_lib.Tokenizer, results: list[dict],
                       seconds: float, runner: str, num_workers: int) -> dict:
    totals = {key: sum(r[key] for r in results) for key in
              ("documents", "sentences", "tokens", "empty_sentences", "empty_documents", "instances", "masked")}
    corpus = corpus_lib.CorpusStats()
    for r in results:
        if r["corpus"]:
            corpus = corpus + corpus_lib.CorpusStats(**r["corpus"])
    inst = cfg.instance
    metadata = dict(
        created_by="bertjax.prepare", input_file=cfg.input_file,
        vocab_file=os.path.abspath(cfg.vocab_file), vocab_size=tokenizer.vocab_size,
        vocab_hash=tokenizer.vocab_hash(), tokenizer=type(tokenizer).__name__, do_lower_case=cfg.do_lower_case,
        do_whole_word_mask=inst.do_whole_word_mask, next_sentence_prediction=inst.next_sentence_prediction,
        masked_lm_prob=inst.masked_lm_prob, short_seq_prob=inst.short_seq_prob, dupe_factor=inst.dupe_factor,
        random_seed=cfg.random_seed, num_shards=cfg.num_shards,
        files=[{"file": r["file"], "instances": r["instances"]} for r in results],
        counts=totals, corpus=corpus.as_dict(),
        skipped={  # everything not turned into instances, and why
            "short_documents": corpus.short_documents, "empty_files": corpus.empty_files,
            "unparsable_files": corpus.unparsable_files, "empty_sentences": totals["empty_sentences"],
            "empty_documents": totals["empty_documents"]},
        replaced={"non_utf8_lines": corpus.replaced_lines, "over_long_lines_cut": corpus.over_long_lines},
        seconds=round(seconds, 2), instances_per_second=round(totals["instances"] / max(seconds, 1e-9), 1),
        runner=runner, num_workers=num_workers,
    )
    records.write_metadata(cfg.output_dir, records.RecordSchema(inst.max_seq_length, inst.max_predictions_per_seq),
                           **metadata)
    return metadata


def summary(metadata: dict) -> str:
    c, s, r = metadata["counts"], metadata["skipped"], metadata["replaced"]
    return (f"prepare: wrote {c['instances']:,} instances from {c['documents']:,} documents "
            f"({c['sentences']:,} sentences, {c['tokens']:,} tokens) into {metadata['num_shards']} shards in "
            f"{metadata['seconds']:.1f}s ({metadata['instances_per_second']:,.0f} instances/s); skipped "
            + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in s.items())
            + "; replaced " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in r.items()))
