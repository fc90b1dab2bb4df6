"""The data stage of the main job: corpus → vocab → train and held-out records, when the config asks.

With `config.data.corpus` empty the job trains on existing records (`data.train_files`) and this stage
does nothing. With a corpus (`builtin:pydocs`, a glob of BERT raw-text, Parquet or JSON Lines files,
`hf:DIR[:SPLIT]`, `tfds:NAME[:SPLIT]`; `data.text_field` names the field holding the text) it
splits the documents into train and held-out sets (every `heldout_every`-th document is held out, so
no held-out sentence is ever trained on), trains a WordPiece vocab on the train documents unless
`data.vocab_file` is given, prepares records for both with `bertjax.prepare`, and points the config at
them. Outputs live in `workdir/data` and are reused when present, so a resumed job starts at once.

With `data.mixture` each corpus source is split and prepared the same way under `workdir/data/NAME`, and one
vocab is trained on a sample that follows the mixture's weights; record-set sources are read as they are
(`mixture_sources` names every source's records for the job).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
from typing import Any, Iterator

import numpy as np

import jax

from bertjax.config.schema import ConfigError, JobConfig
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.pretraining import shards
from bertjax.jobs import prepare as prepare_job
from bertjax.data.corpus import table as table_corpus
from bertjax.data.vocab import tokenization, training as vocab_training
from bertjax.runtime import files
from bertjax.runtime.files import is_remote

log = logging.getLogger(__name__)
DONE = "stage.json"


def _document_text(doc: list[str]) -> str:
    """BERT raw-text format: one sentence per line, a blank line after each document."""
    return "\n".join(s.replace("\n", " ") for s in doc) + "\n\n"


def split_corpus(
    spec: str,
    out_dir: str,
    heldout_every: int,
    tfds_data_dir: str | None = None,
    tfds_text_feature: str = "text",
    text_field: str = "text",
    skip_bad_json_lines: bool = False,
    what: str = "config.data.corpus",
) -> tuple[str, str, dict]:
    """Writes train.txt and heldout.txt (disjoint documents) under out_dir; returns their paths and counts.
    `what` names the setting that gave `spec` in its errors.

    Every heldout_every-th document is held out (every 2nd of a corpus with fewer documents). Documents
    stream to the two files: only the first heldout_every are held, to know which of the two rules applies."""
    source = corpus_lib.open_source(
        spec,
        data_dir=tfds_data_dir,
        text_field=text_field,
        text_feature=tfds_text_feature,
        what=what,
        skip_bad_json_lines=skip_bad_json_lines,
    )
    paths = {"train": os.path.join(out_dir, "train.txt"), "heldout": os.path.join(out_dir, "heldout.txt")}
    documents = source.documents()
    head = list(itertools.islice(documents, max(heldout_every, 2)))
    if len(head) < 2:
        raise ValueError(f"{what}={spec} has {len(head)} document(s); a train/held-out split needs at least 2.")
    every = max(2, min(heldout_every, len(head)))
    counts = {"train_documents": 0, "heldout_documents": 0}
    with (
        open(paths["train"] + ".tmp", "w", encoding="utf-8") as train,
        open(paths["heldout"] + ".tmp", "w", encoding="utf-8") as heldout,
    ):
        for i, doc in enumerate(itertools.chain(head, documents)):
            held = i % every == every - 1
            (heldout if held else train).write(_document_text(doc))
            counts["heldout_documents" if held else "train_documents"] += 1
    for path in paths.values():
        os.replace(path + ".tmp", path)
    if rows := table_corpus.skipped_rows_note(source.stats):  # Parquet / JSON Lines: rows without text
        log.info("data: %s: %s", spec, rows)
    return paths["train"], paths["heldout"], counts


def read_sentences(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line.rstrip("\n")


def _recorded(path: str, out: str) -> str:
    """A path as stage.json keeps it: relative to out when under it (so a copied or moved workdir finds its own
    vocab), else absolute (a relative one would be read against out)."""
    if is_remote(path):
        return path
    path = os.path.abspath(path)
    return os.path.relpath(path, out) if path.startswith(out + os.sep) else path


def prepare_data(config: JobConfig, workdir: str) -> JobConfig:
    """Returns config with data.train_files / eval_files / vocab_file pointing at prepared records (a mixture's:
    `mixture_sources` then names them)."""
    d = config.data
    mix = d.mixture_spec()
    corpora = [s for s in mix.sources if not is_record_set(s.spec)] if mix else []
    if mix is not None and not corpora:
        return config  # record sets only: nothing to prepare
    if not d.corpus and not corpora:
        return config
    if corpora and len(corpora) < len(mix.sources) and not d.vocab_file:
        records_named = [s.name for s in mix.sources if s not in corpora]
        raise ValueError(
            f"config.data.mixture mixes record sets ({', '.join(records_named)}) with corpora "
            f"({', '.join(s.name for s in corpora)}): set config.data.vocab_file to the vocab the record sets were "
            "made with, so that the corpora are prepared with it too."
        )
    check_strip_accents(d)
    if config.model.vocab_size and not d.vocab_file and config.model.vocab_size != d.corpus_vocab_size:
        raise ConfigError(
            f"config.model.vocab_size={config.model.vocab_size}, but the job trains its own vocab of "
            f"config.data.corpus_vocab_size={d.corpus_vocab_size} tokens: leave config.model.vocab_size at 0 (the "
            "trained vocab's size) or set config.data.corpus_vocab_size to it."
        )
    out = os.path.join(workdir if is_remote(workdir) else os.path.abspath(workdir), "data")
    done = os.path.join(out, DONE)
    if jax.process_index() == 0 and not files.exists(done):
        check_corpora(config, [(s.name, s.spec) for s in corpora] if mix is not None else [(None, d.corpus)])
        if is_remote(out):
            log.info("data: the stage is built on the local disk, then uploaded to %s (stage.json last)", out)
        with files.writing_dir(out, last=DONE) as built:  # the tokenizer trainer and record writers write locally
            if mix is not None:
                _build_mixture(config, built, mix, corpora)
            else:
                _build(config, built)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("bertjax data stage")
    stage = files.read_json(done)
    if not is_remote(stage["vocab_file"]) and not os.path.isabs(stage["vocab_file"]):  # under data/, wherever it is now
        stage["vocab_file"] = os.path.join(out, stage["vocab_file"])
    if config.model.vocab_size and config.model.vocab_size != stage["vocab_size"]:
        raise ConfigError(
            f"config.model.vocab_size={config.model.vocab_size}, but {stage['vocab_file']} has "
            f"{stage['vocab_size']:,} tokens: leave config.model.vocab_size at 0 (the vocab's size) or set it to "
            f"{stage['vocab_size']}."
        )
    if config.model.vocab_size != stage["vocab_size"]:
        log.info(
            "data: config.model.vocab_size %s → %d, the size of %s",
            config.model.vocab_size or "unset",
            stage["vocab_size"],
            stage["vocab_file"],
        )
    if mix is not None:
        return config.replace(model={"vocab_size": stage["vocab_size"]}, data={"vocab_file": stage["vocab_file"]})
    return config.replace(
        model={"vocab_size": stage["vocab_size"]},
        data={
            "vocab_file": stage["vocab_file"],
            "train_files": os.path.join(out, "train", "*.tfrecord"),
            "eval_files": os.path.join(out, "heldout", "*.tfrecord"),
        },
    )


def check_strip_accents(d: Any) -> None:
    """config.data.strip_accents chooses for the vocab the stage trains; a given vocab_file's own files decide for
    it, so a setting that disagrees with them is refused before any work (the records would not match the export)."""
    if d.strip_accents is None or not d.vocab_file:
        return
    recorded = tokenization.load(d.vocab_file, d.do_lower_case).strip_accents
    if recorded != tokenization.strips_accents(d.do_lower_case, d.strip_accents):
        raise ValueError(
            f"config.data.strip_accents={d.strip_accents} disagrees with the vocab {d.vocab_file}, which "
            f"{'strips' if recorded else 'keeps'} accents (as the {tokenization.TOKENIZER_CONFIG} beside it says, "
            "or BERT's rule when there is none): a given vocab's own files decide, so drop the setting, or write "
            f'{{"strip_accents": {str(d.strip_accents).lower()}}} into {tokenization.TOKENIZER_CONFIG} beside it.'
        )


def is_record_set(spec: str) -> bool:
    """Whether a mixture source names records (a directory holding metadata.json, or .tfrecord files) rather
    than a corpus."""
    if spec.startswith(("builtin:", "hf:", "tfds:")):
        return False
    if re.search(r"\.tfrecords?$", spec.rstrip("/")):
        return True
    return files.isdir(spec) and files.exists(os.path.join(spec, "metadata.json"))


def mixture_sources(config: JobConfig, workdir: str) -> tuple[list[tuple[str, str, str]], str]:
    """A mixture's sources as (name, train records, held-out records or ""), and an eval set for them all ("" when
    each source has its own or there is none). Corpus sources read what the stage prepared; record-set sources
    their spec, and their held-out sets from config.data.eval_files given as name=glob entries."""
    d = config.data
    mix = d.mixture_spec()
    out = os.path.join(workdir if is_remote(workdir) else os.path.abspath(workdir), "data")
    named = _named_eval_files(d.eval_files, mix.names) if "=" in d.eval_files else {}
    shared = "" if named else d.eval_files
    sources = []
    for s in mix.sources:
        if is_record_set(s.spec):
            sources.append((s.name, s.spec, named.get(s.name, "")))
        else:
            here = os.path.join(out, s.name)
            sources.append(
                (s.name, os.path.join(here, "train", "*.tfrecord"), os.path.join(here, "heldout", "*.tfrecord"))
            )
    return sources, shared


def _named_eval_files(text: str, names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, eq, glob = (p.strip() for p in item.partition("="))
        if not eq or name not in names:
            raise ValueError(
                f"config.data.eval_files entry {item!r} names no source of config.data.mixture ({', '.join(names)}); "
                "write NAME=GLOB for a source's held-out records, or one glob for them all."
            )
        out[name] = glob
    return out


def _build(config: JobConfig, out: str) -> None:
    """The stage's outputs into the local directory out; stage.json, its commit, last."""
    d = config.data
    train_txt, heldout_txt, counts = _split(config, d.corpus, out)
    vocab_file = d.vocab_file or _train_vocab(config, read_sentences(train_txt), out)
    counts.update(_prepare_records(config, out, train_txt, heldout_txt, vocab_file))
    _commit(config, out, counts, vocab_file)


def _build_mixture(config: JobConfig, out: str, mix: Any, corpora: list) -> None:
    """A mixture's stage: each corpus source split and prepared under out/NAME, with one vocab trained on a
    sample of their train documents that follows the mixture's weights (its own, else the schedule's at step 0)."""
    d = config.data
    texts, counts = {}, {}
    for source in corpora:
        here = os.path.join(out, source.name)
        os.makedirs(here, exist_ok=True)
        *texts[source.name], counts[source.name] = _split(config, source.spec, here, source.name)
    vocab_file = d.vocab_file
    if not vocab_file:
        sizes = {name: os.path.getsize(train) for name, (train, _) in texts.items()}
        plain = all(s.weight is not None and not math.isnan(s.weight) for s in mix.sources)
        plan = (dataclasses.replace(mix, entries=()) if plain else mix).resolve(sizes)
        weights = dict(zip(plan.names, plan.weights_at(0)))
        vocab_file = _train_vocab(config, _weighted_sentences(texts, weights, config.seed), out)
    for source in corpora:
        here = os.path.join(out, source.name)
        counts[source.name].update(_prepare_records(config, here, *texts[source.name], vocab_file))
    _commit(config, out, {"sources": counts}, vocab_file)


def _weighted_sentences(texts: dict[str, tuple[str, str]], weights: dict[str, float], seed: int) -> Iterator[str]:
    """Every source's train sentences, each repeated (or kept, seeded) so that its share of the sample is its weight."""
    lines = {name: sum(1 for _ in read_sentences(train)) for name, (train, _) in texts.items()}
    total = sum(lines.values())
    for k, (name, (train, _)) in enumerate(texts.items()):
        factor = weights[name] * total / max(lines[name], 1)
        log.info("data: the vocab's sample holds %s's sentences ×%.2f (weight %.3f)", name, factor, weights[name])
        rng = np.random.default_rng([seed, k])
        for sentence in read_sentences(train):
            for _ in range(int(factor) + (rng.random() < factor - int(factor))):
                yield sentence


def _text_field(config: JobConfig) -> str:
    d = config.data
    return table_corpus.resolve_text_field(
        d.text_field, d.tfds_text_feature, "config.data.tfds_text_feature", "config.data.text_field"
    )


def _corpus_setting(name: str | None) -> str:
    """The setting that names a corpus, as errors about its files say it."""
    return f"config.data.mixture source {name!r}" if name else "config.data.corpus"


def check_corpora(config: JobConfig, corpora: list[tuple[str | None, str]]) -> None:
    """Every corpus the stage will read opens (its files exist, its format is known), before any work: a mixture
    source that matches no files is a config mistake like the mixture's others (ConfigError: exit 2)."""
    d = config.data
    for name, spec in corpora:
        try:
            corpus_lib.open_source(
                spec,
                data_dir=d.tfds_data_dir or None,
                text_field=_text_field(config),
                what=_corpus_setting(name),
                skip_bad_json_lines=d.skip_bad_json_lines,
            )
        except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:  # not a network error
            raise ConfigError(str(e)) from None


def _split(config: JobConfig, spec: str, out: str, name: str | None = None) -> tuple[str, str, dict]:
    d = config.data
    log.info("data: splitting %s into train and held-out documents (every %d-th held out)", spec, d.heldout_every)
    return split_corpus(
        spec,
        out,
        d.heldout_every,
        d.tfds_data_dir or None,
        text_field=_text_field(config),
        skip_bad_json_lines=d.skip_bad_json_lines,
        what=_corpus_setting(name),
    )


def _train_vocab(config: JobConfig, sentences: Iterator[str], out: str) -> str:
    d = config.data
    log.info("data: training a %d-token WordPiece vocab on the train documents", d.corpus_vocab_size)
    tok = vocab_training.train_wordpiece(
        sentences,
        d.corpus_vocab_size,
        os.path.join(out, "vocab"),
        do_lower_case=d.do_lower_case,
        strip_accents=d.strip_accents,
        how_to_keep="set config.data.strip_accents=false",
    )
    return str(tok.path)


def _prepare_records(config: JobConfig, out: str, train_txt: str, heldout_txt: str, vocab_file: str) -> dict:
    """out/train and out/heldout records; their instance counts."""
    d, counts = config.data, {}
    for name, text, dupe in (("train", train_txt, d.dupe_factor), ("heldout", heldout_txt, d.heldout_dupe_factor)):
        cfg = shards.PrepareConfig(
            input_file=text,
            output_dir=os.path.join(out, name),
            vocab_file=vocab_file,
            do_lower_case=d.do_lower_case,
            random_seed=config.seed + (name == "heldout"),
            num_shards=d.num_shards if name == "train" else 1,
            instance=d.instance_config(dupe, name == "heldout"),
            packing=d.packing_config(),
        )
        log.info("data: preparing %s records (dupe_factor %d) into %s", name, dupe, cfg.output_dir)
        # overwrite: a stage cut short before stage.json is redone from the start
        metadata = prepare_job.prepare(cfg, num_workers=d.num_workers or os.cpu_count() or 1, overwrite=True)
        # the vocab trainer said what accent stripping changes, once
        log.info("data: %s", prepare_job.summary(metadata, accents=False).replace("\n", "; "))
        counts[f"{name}_instances"] = metadata["counts"]["instances"]
    return counts


def _commit(config: JobConfig, out: str, counts: dict, vocab_file: str) -> None:
    """stage.json, the stage's commit: what it made, and the vocab."""
    if config.data.vocab_file:
        log.info("data: the vocab %s, as given (none trained)", vocab_file)
    done = os.path.join(out, DONE)
    with open(done + ".tmp", "w") as f:
        size = tokenization.load(vocab_file, config.data.do_lower_case).vocab_size
        json.dump(dict(counts, vocab_file=_recorded(vocab_file, out), vocab_size=size), f, indent=2)
    os.replace(done + ".tmp", done)
