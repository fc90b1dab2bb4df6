"""The prepare job (`python -m bertjax.prepare`): inputs checked before any work, an old output directory
cleared only with --overwrite, the shards written by local workers or Apache Beam (data/pretraining/shards.py),
then metadata.json committed with them at once; the one-paragraph summary the command prints."""

from __future__ import annotations

import logging
import os
import time

from bertjax.runtime import files
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.corpus import table as table_corpus
from bertjax.data.pretraining import records
from bertjax.data.pretraining.shards import (
    COUNT_KEYS,
    SHARD_STATS_SUFFIX,
    PrepareConfig,
    Progress,
    load_tokenizer,
    plan_shards,
    run_beam,
    run_local,
)
from bertjax.data.vocab import tokenization
from bertjax.data.vocab.accents import AccentCounter

log = logging.getLogger(__name__)


def check_inputs(cfg: PrepareConfig) -> tokenization.Tokenizer:
    """Fails before any work, in one sentence, on a bad flag, vocab or input."""
    cfg.instance.validate()
    if cfg.num_shards < 1:
        raise ValueError(f"--num_shards={cfg.num_shards} must be ≥ 1.")
    if not files.is_remote(cfg.output_dir) and os.path.isfile(cfg.output_dir):
        raise NotADirectoryError(
            f"--output_dir={cfg.output_dir} is a file; pass a directory for the record shards "
            "(it is created if missing)."
        )
    tokenizer, _ = load_tokenizer(cfg)
    cfg.open_source().list_units()  # a glob that matches nothing, a missing file, an unknown dataset
    return tokenizer


def clear_output_dir(cfg: PrepareConfig, overwrite: bool) -> None:
    """Makes output_dir ready for a new record set. A set already there is refused, or with `overwrite`
    removed; what an unfinished run left (its staging folder, and any shards it had moved) is cleared
    either way. The staging folder is made first, so that training refuses the directory from then on."""
    files.makedirs(cfg.output_dir)
    names = files.listdir(cfg.output_dir)
    unfinished = records.STAGING_NAME in names
    old = [n for n in names if n == records.METADATA_NAME or ".tfrecord" in n]  # .tmp, .stats.json: old leftovers
    if old and not (overwrite or unfinished):
        shards_there = sum(n.endswith(".tfrecord") for n in old)
        raise FileExistsError(
            f"--output_dir={cfg.output_dir} already holds a record set ({shards_there} .tfrecord file(s)"
            f"{' and metadata.json' if records.METADATA_NAME in old else ''}); pass --overwrite to replace it, or "
            "choose an empty directory (mixing two runs' shards would train on both)."
        )
    files.rmtree(cfg.staging_dir)
    files.makedirs(cfg.staging_dir)
    for name in sorted(old, key=lambda n: n != records.METADATA_NAME):  # metadata.json first
        files.remove(os.path.join(cfg.output_dir, name))


def commit(cfg: PrepareConfig, metadata_fields: dict) -> dict:
    """Moves the complete shards beside metadata.json, which is written after them (and returned); the
    staging folder, removed last, marks the set unfinished until then (training refuses a directory that has
    one)."""
    for k in range(cfg.num_shards):
        files.remove(cfg.shard_path(k) + SHARD_STATS_SUFFIX)
        files.rename(cfg.shard_path(k), os.path.join(cfg.output_dir, cfg.shard_name(k)))
    metadata = records.write_metadata(cfg.staging_dir, cfg.schema, **metadata_fields)
    files.rename(
        os.path.join(cfg.staging_dir, records.METADATA_NAME), os.path.join(cfg.output_dir, records.METADATA_NAME)
    )
    files.rmtree(cfg.staging_dir)
    return metadata


def prepare(
    cfg: PrepareConfig,
    num_workers: int = 1,
    runner: str = "local",
    beam_args: tuple[str, ...] = (),
    progress_stream=None,
    overwrite: bool = False,
) -> dict:
    """Runs the whole job; returns (and writes) the metadata. The set appears at once: shards are staged,
    then moved beside metadata.json (`commit`); a failed run leaves nothing a record glob matches."""
    if runner not in ("local", "beam"):
        raise ValueError(f"--runner={runner!r} is not one of local, beam.")
    if num_workers < 1:
        raise ValueError(f"--num_workers={num_workers} must be ≥ 1.")
    tokenizer = check_inputs(cfg)
    if cfg.instance.cap_warning():
        log.warning("prepare: %s.", cfg.instance.cap_warning())
    clear_output_dir(cfg, overwrite)
    try:
        start = time.monotonic()
        progress = Progress(cfg.num_shards, stream=progress_stream)
        plan = plan_shards(cfg)
        if runner == "local":
            results = run_local(cfg, num_workers, progress, plan)
        else:
            results = run_beam(cfg, list(beam_args), plan)
        seconds = time.monotonic() - start
        metadata = job_metadata(cfg, tokenizer, sorted(results, key=lambda r: r["shard"]), seconds, runner, num_workers)
        metadata = commit(cfg, metadata)
    except BaseException:  # a full disk, an error, Ctrl-C: free what was written (a kill leaves it to the rerun)
        files.rmtree(cfg.staging_dir)
        raise
    return metadata


def job_metadata(
    cfg: PrepareConfig,
    tokenizer: tokenization.Tokenizer,
    results: list[dict],
    seconds: float,
    runner: str,
    num_workers: int,
) -> dict:
    """metadata.json's fields: the settings, every shard (name, bytes, crc32c, records) and the counts."""
    totals = {key: sum(r[key] for r in results) for key in COUNT_KEYS}
    accents = AccentCounter()
    for r in results:
        accents.update(r.get("accents_stripped", {}))
    corpus = corpus_lib.CorpusStats()
    for r in results:
        if r["corpus"]:
            corpus = corpus + corpus_lib.CorpusStats(**r["corpus"])
    inst = cfg.instance
    metadata = dict(
        created_by="bertjax.prepare",
        input_file=cfg.input_file,
        vocab_file=files.resolved(cfg.vocab_file)
        if files.is_remote(cfg.vocab_file)
        else os.path.abspath(cfg.vocab_file),
        vocab_size=tokenizer.vocab_size,
        vocab_hash=tokenizer.vocab_hash(),
        tokenizer=type(tokenizer).__name__,
        do_lower_case=cfg.do_lower_case,
        strip_accents=tokenizer.strip_accents,
        do_whole_word_mask=inst.do_whole_word_mask,
        next_sentence_prediction=inst.next_sentence_prediction,
        masked_lm_prob=inst.masked_lm_prob,
        short_seq_prob=inst.short_seq_prob,
        dupe_factor=inst.dupe_factor,
        random_seed=cfg.random_seed,
        num_shards=cfg.num_shards,
        text_field=cfg.text_field,
        files=[
            {
                "file": r["file"],
                "records": r["rows"],
                "instances": r["instances"],
                "bytes": r["bytes"],
                "crc32c": r["crc32c"],
            }
            for r in results
        ],
        counts=totals,
        corpus=corpus.as_dict(),
        skipped={  # everything not turned into instances, and why
            "short_documents": corpus.short_documents,
            "empty_files": corpus.empty_files,
            "unparsable_files": corpus.unparsable_files,
            "empty_sentences": totals["empty_sentences"],
            "empty_documents": totals["empty_documents"],  # then Parquet / JSON Lines rows with no text, if any rows
            **({k: getattr(corpus, k) for k in table_corpus.SKIPPED_ROW_COUNTERS} if corpus.rows else {}),
        },
        replaced={
            "non_utf8_lines": corpus.replaced_lines,
            "over_long_lines_cut": corpus.over_long_lines,
            "long_lines_split_into_sentences": corpus.split_lines,
            "characters_accent_stripped": accents.total,
        },
        accents_stripped_by_script=accents.by_script(),
        accents_warning=accents.warning(
            "prepare",
            f'train the vocab with --strip_accents=false, or write {{"strip_accents": false}} into '
            f"{tokenization.TOKENIZER_CONFIG} beside {cfg.vocab_file} if it was trained so",
        ),
        seconds=round(seconds, 2),
        instances_per_second=round(totals["instances"] / max(seconds, 1e-9), 1),
        runner=runner,
        num_workers=num_workers,
    )
    if totals["instances"] == 0:  # no metadata.json: empty shards must not look like a finished data set
        skipped = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in metadata["skipped"].items() if v)
        raise ValueError(
            f"{cfg.input_file} yielded no training instances ({totals['documents']:,} documents; "
            f"skipped {skipped or 'nothing'}): "
            + (
                f"check that --text_field={cfg.text_field!r} names the field holding the text."
                if corpus.rows
                else "point --input_file at plain text, one sentence per line and a blank line between documents."
            )
        )
    metadata["padding_fraction"] = round(1 - totals["real_tokens"] / max(totals["rows"] * inst.max_seq_length, 1), 4)
    # The corpus's tokens that some instance keeps (in any of the dupe_factor passes): pairs truncated to
    # max_seq_length lose a few (each pass cuts elsewhere), sentences far longer than an instance most.
    metadata["tokens_kept_share"] = round(totals["covered_tokens"] / max(totals["tokens"], 1), 4)
    if cfg.packing is not None:
        metadata.update(
            max_predictions_per_seq=inst.max_predictions_per_seq,
            instances_per_row=round(totals["instances"] / max(totals["rows"], 1), 3),
        )
    return metadata


MIN_TOKENS_KEPT = 0.95  # below this share of the corpus's tokens in instances, the summary warns


def tokens_kept_warning(metadata: dict) -> str:
    """A warning when the instances keep less than MIN_TOKENS_KEPT of the corpus's tokens, with the cause;
    "" otherwise."""
    share = metadata.get("tokens_kept_share")
    if share is None or share >= MIN_TOKENS_KEPT:
        return ""
    c = metadata["counts"]
    tokens_per_sentence = c["tokens"] / max(c["sentences"], 1)
    limit = metadata.get("schema", {}).get("max_seq_length")
    causes = []
    if metadata["replaced"].get("long_lines_split_into_sentences"):
        causes.append(
            f"{metadata['replaced']['long_lines_split_into_sentences']:,} line(s) too long for one "
            "sentence were cut where no sentence end was near"
        )
    if limit and tokens_per_sentence > limit / 2:
        causes.append(
            f"sentences average {tokens_per_sentence:,.0f} tokens, more than half of max_seq_length="
            f"{limit}, so pairs are truncated: put one sentence per line"
        )
    if not causes and metadata.get("dupe_factor") == 1:
        causes.append(
            "pairs longer than max_seq_length are truncated, and with dupe_factor=1 no other pass keeps what one cut"
        )
    causes = causes or ["pairs longer than max_seq_length are truncated"]
    return (
        f"prepare: warning: the instances keep only {100 * share:.1f}% of the corpus's {c['tokens']:,} "
        f"tokens; {'; '.join(causes)}."
    )


def summary(metadata: dict, accents: bool = True) -> str:
    """prepare's closing lines; `accents=False` leaves out the accent-stripping warning (said elsewhere)."""
    c, s, r = metadata["counts"], metadata["skipped"], metadata["replaced"]
    packed = f" packed into {c['rows']:,} rows" if metadata.get("instances_per_row") else ""
    kept = f", {100 * metadata['tokens_kept_share']:.1f}% of the tokens kept" if "tokens_kept_share" in metadata else ""
    warning = "\n".join(filter(None, [tokens_kept_warning(metadata), accents and metadata.get("accents_warning", "")]))
    by_file = table_corpus.skipped_by_file_note(metadata.get("corpus", {}).get("skipped_by_file", {}))
    return (
        f"prepare: wrote {c['instances']:,} instances{packed} from {c['documents']:,} documents "
        f"({c['sentences']:,} sentences, {c['tokens']:,} tokens{kept}) into {metadata['num_shards']} shards in "
        f"{metadata['seconds']:.1f}s ({metadata['instances_per_second']:,.0f} instances/s; padding "
        f"{100 * metadata['padding_fraction']:.1f}% of the tokens); skipped "
        + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in s.items())
        + "; replaced "
        + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in r.items())
        + (f"; rows skipped by file: {by_file}" if by_file else "")
        + (f"\n{warning}" if warning else "")
    )
