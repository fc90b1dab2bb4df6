"""Parquet and JSON Lines corpora (bertjax/data/corpus/table.py): each container read, the same documents give
byte-identical records from any container, records do not depend on the number of workers, rows without
text are counted, and every bad input is one sentence naming its file (and row group or line)."""

import gzip
import io
import json
import logging
import pathlib
import random
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

from bertjax.data.corpus import sources as corpus_lib  # noqa: E402
from bertjax.data.pretraining import instances  # noqa: E402
from bertjax.data.pretraining import shards as shards_lib  # noqa: E402
from bertjax.jobs import prepare as prepare_job
from bertjax.data.corpus import table as table_corpus  # noqa: E402

from train_setup import vocab_words  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def texts(vocab_file) -> list[str]:
    """60 documents of 2-12 sentences of random vocab words; paragraphs split by blank lines in some."""
    words = vocab_words(vocab_file)
    rng = random.Random(0)
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "."  # noqa: E731
    docs = []
    for i in range(60):
        sentences = [sentence() for _ in range(rng.randint(2, 12))]
        cut = len(sentences) // 2
        docs.append(" ".join(sentences[:cut]) + ("\n\n" if i % 3 == 0 else " ") + " ".join(sentences[cut:]))
    return docs


def write_parquet(path: pathlib.Path, rows: list, row_group_size: int = 7, **columns) -> pathlib.Path:
    pq.write_table(pa.table({"text": rows, **columns}), path, row_group_size=row_group_size)
    return path


def jsonl_bytes(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")


def write_containers(directory: pathlib.Path, texts: list[str]) -> dict[str, pathlib.Path]:
    """The same documents in the same order as Parquet (several row groups), .jsonl, .jsonl.zst, .jsonl.gz."""
    directory.mkdir(parents=True, exist_ok=True)
    data = jsonl_bytes([{"id": i, "text": t} for i, t in enumerate(texts)])
    paths = {
        "parquet": write_parquet(directory / "c.parquet", texts, row_group_size=7, id=list(range(len(texts)))),
        "jsonl": directory / "c.jsonl",
        "zst": directory / "c.jsonl.zst",
        "gz": directory / "c.jsonl.gz",
    }
    paths["jsonl"].write_bytes(data)
    paths["zst"].write_bytes(zstandard.ZstdCompressor().compress(data))
    paths["gz"].write_bytes(gzip.compress(data))
    return paths


def prepare(input_file, out: pathlib.Path, vocab_file, num_shards: int = 1, num_workers: int = 1, **kw) -> dict:
    cfg = shards_lib.PrepareConfig(
        input_file=str(input_file),
        output_dir=str(out),
        vocab_file=str(vocab_file),
        num_shards=num_shards,
        block_chars=2_000,
        **kw,
        instance=instances.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2),
    )
    return prepare_job.prepare(cfg, num_workers=num_workers, progress_stream=io.StringIO())


def shard_bytes(out: pathlib.Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("records-*.tfrecord"))]


# --- Reading ---------------------------------------------------------------------------------------
def test_every_container_reads_the_same_documents_as_split_sentences(tmp_path, texts):
    paths = write_containers(tmp_path, texts)
    expected = [corpus_lib.split_sentences(t) for t in texts]
    assert all(len(d) >= 2 for d in expected)
    for kind, path in paths.items():
        source = corpus_lib.open_source(str(path))
        assert isinstance(source, table_corpus.TableSource), kind
        assert list(source.documents()) == expected, kind
        assert source.stats.rows == len(texts) and source.stats.documents == len(texts), kind
    units = corpus_lib.open_source(str(paths["parquet"])).list_units()
    assert units == [table_corpus.RowGroup(str(paths["parquet"]), i) for i in range(9)]  # 60 rows / 7 a group
    # a glob and a comma list mixing containers: files in order, each document once
    both = corpus_lib.open_source(f"{tmp_path}/*.parquet,{paths['zst']}")
    assert list(both.documents()) == expected + expected
    # raw text keeps its source
    (tmp_path / "plain.txt").write_text("One sentence.\n", encoding="utf-8")
    assert isinstance(corpus_lib.open_source(str(tmp_path / "plain.txt")), corpus_lib.TextSource)


def test_parquet_reads_only_the_text_column_by_row_group(tmp_path, texts, monkeypatch):
    path = write_parquet(tmp_path / "c.parquet", texts, row_group_size=10, other=["x" * 10] * len(texts))
    calls = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(
        pq.ParquetFile,
        "read_row_group",
        lambda self, i, columns=None, **kw: calls.append((i, columns)) or real(self, i, columns=columns, **kw),
    )
    source = corpus_lib.open_source(str(path))
    units = source.list_units()
    assert [d for d in source.read(units[2:3])] == [corpus_lib.split_sentences(t) for t in texts[20:30]]
    assert calls == [(2, ["text"])]


def test_text_field_names_the_column_and_the_key(tmp_path, texts):
    write_parquet(tmp_path / "c.parquet", ["ignored"] * 3, body=texts[:3])
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes([{"body": t} for t in texts[:3]]))
    for name in ("c.parquet", "c.jsonl"):
        source = corpus_lib.open_source(str(tmp_path / name), text_field="body")
        assert list(source.documents()) == [corpus_lib.split_sentences(t) for t in texts[:3]]
    # the TFDS-only alias still works when text_field is left at its default
    source = corpus_lib.open_source(str(tmp_path / "c.jsonl"), text_feature="body")
    assert source.text_field == "body"


def test_a_dotted_text_field_names_a_field_inside_a_struct_column_or_object(tmp_path, texts):
    """--text_field=meta.text: Parquet and Arrow struct columns and nested JSON objects; a null struct is an
    empty text, counted; a missing inner field lists the dotted names there are."""
    meta = [{"text": t, "lang": "en"} for t in texts[:4]] + [None]
    pq.write_table(pa.table({"id": list(range(5)), "meta": meta}), tmp_path / "c.parquet", row_group_size=2)
    with (
        pa.OSFile(str(tmp_path / "c.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, pa.table({"meta": meta}).schema) as writer,
    ):  # the stream format datasets.save_to_disk writes
        writer.write_table(pa.table({"meta": meta}))
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes([{"meta": m} for m in meta[:4]] + [{"meta": {"lang": "de"}}]))
    expected = [corpus_lib.split_sentences(t) for t in texts[:4]]
    for name in ("c.parquet", "c.arrow", "c.jsonl"):
        source = corpus_lib.open_source(str(tmp_path / name), text_field="meta.text")
        assert list(source.documents()) == expected, name
        assert source.stats.rows == 5 and source.stats.empty_texts + source.stats.missing_texts == 1, name
    with pytest.raises(ValueError, match=r"no column 'meta.body' \(its columns: \['id', 'meta.text', 'meta.lang'\]\)"):
        corpus_lib.open_source(str(tmp_path / "c.parquet"), text_field="meta.body")
    with pytest.raises(ValueError, match=r"column 'meta' holds struct<.*string columns: \['meta.text', 'meta.lang'\]"):
        corpus_lib.open_source(str(tmp_path / "c.parquet"), text_field="meta")


def test_deprecated_alias_warns_once_and_is_used_only_when_text_field_is_default(caplog):
    with caplog.at_level(logging.WARNING):
        assert table_corpus.resolve_text_field("text", "text", "--tfds_text_feature", "--text_field") == "text"
        assert not caplog.records
        assert table_corpus.resolve_text_field("text", "body", "--tfds_text_feature", "--text_field") == "body"
        assert table_corpus.resolve_text_field("content", "body", "--tfds_text_feature", "--text_field") == "content"
    assert len(caplog.records) == 2
    assert all("--tfds_text_feature is deprecated: use --text_field" in r.getMessage() for r in caplog.records)


def test_long_sentences_are_capped(tmp_path):
    long = " ".join(["word"] * 600)  # 2,999 characters, no sentence end
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes([{"text": long}]))
    source = corpus_lib.open_source(str(tmp_path / "c.jsonl"), max_line_chars=2_000, max_sentence_chars=1_000)
    (doc,) = source.documents()
    assert len(doc) == 3 and all(len(s) <= 1_000 for s in doc) and " ".join(doc) == long
    assert source.stats.split_lines == 1


# --- Same documents, same records ------------------------------------------------------------------
def test_same_documents_give_byte_identical_records_in_every_container(tmp_path, texts, vocab_file):
    paths = write_containers(tmp_path / "in", texts)
    made = {kind: shard_bytes(tmp_path / kind) for kind in paths if prepare(paths[kind], tmp_path / kind, vocab_file)}
    assert len(made["parquet"]) == 1 and len(made["parquet"][0]) > 10_000
    assert made["parquet"] == made["jsonl"] == made["zst"] == made["gz"]
    # and the same as the documents written as BERT raw text: a row is a document, cut into sentences
    (tmp_path / "c.txt").write_text(
        "\n\n".join("\n".join(corpus_lib.split_sentences(t)) for t in texts) + "\n", encoding="utf-8"
    )
    prepare(tmp_path / "c.txt", tmp_path / "txt", vocab_file)
    assert shard_bytes(tmp_path / "txt") == made["parquet"]


@pytest.mark.parametrize("kind", ["parquet", "zst"])
def test_records_do_not_depend_on_the_number_of_workers(tmp_path, texts, vocab_file, kind):
    path = write_containers(tmp_path / "in", texts)[kind]
    one = prepare(path, tmp_path / "w1", vocab_file, num_shards=3, num_workers=1)
    two = prepare(path, tmp_path / "w2", vocab_file, num_shards=3, num_workers=2)
    assert one["files"] == two["files"] and all(f["records"] > 0 for f in one["files"])
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")
    assert one["corpus"]["documents"] == len(texts) and one["corpus"]["rows"] == len(texts)


# --- Counts ----------------------------------------------------------------------------------------
def test_rows_without_text_are_counted_in_metadata_and_the_summary(tmp_path, texts, vocab_file):
    lines = [
        json.dumps({"text": texts[0]}),
        json.dumps({"text": None}),
        json.dumps({"text": "  "}),
        json.dumps({"title": "no text"}),
        json.dumps({"text": 42}),
        json.dumps([1, 2]),
        "",
        json.dumps({"text": texts[1]}),
        "{not json",
        json.dumps({"text": texts[2]}),
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_parquet(tmp_path / "d.parquet", [texts[3], None, "", texts[4]], row_group_size=2)
    metadata = prepare(
        f"{tmp_path}/c.jsonl,{tmp_path}/d.parquet", tmp_path / "out", vocab_file, skip_bad_json_lines=True
    )
    corpus = metadata["corpus"]
    assert corpus["documents"] == 5 and corpus["rows"] == 9 + 4 and corpus["empty_lines"] == 1
    assert (
        corpus["empty_texts"],
        corpus["missing_texts"],
        corpus["non_string_texts"],
        corpus["non_object_lines"],
        corpus["bad_json_lines"],
    ) == (2 + 2, 1, 1, 1, 1)
    assert {k: metadata["skipped"][k] for k in table_corpus.SKIPPED_ROW_COUNTERS} == {
        "empty_texts": 4,
        "missing_texts": 1,
        "non_string_texts": 1,
        "non_object_lines": 1,
        "bad_json_lines": 1,
    }
    assert (
        "4 empty texts, 1 missing texts, 1 non string texts, 1 non object lines, 1 bad json lines"
        in prepare_job.summary(metadata)
    )


def test_raw_text_metadata_shows_no_row_counters(tmp_path, texts, vocab_file):
    (tmp_path / "c.txt").write_text("\n\n".join(texts[:20]) + "\n", encoding="utf-8")
    metadata = prepare(tmp_path / "c.txt", tmp_path / "out", vocab_file)
    assert not set(table_corpus.SKIPPED_ROW_COUNTERS) & set(metadata["skipped"])


def test_empty_files_are_counted(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"\n\n")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "b.parquet")
    source = corpus_lib.open_source(f"{tmp_path}/a.jsonl,{tmp_path}/b.parquet")
    assert list(source.documents()) == [] and source.stats.empty_files == 2


# --- Bad input: one sentence naming the file -------------------------------------------------------
def test_a_line_that_is_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "Fine."}\n{"text": "cut\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}, line 2, is not valid JSON .*--skip_bad_json_lines"):
        list(corpus_lib.open_source(str(path)).documents())


def test_parquet_without_the_field_lists_its_columns(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"content": ["a"], "url": ["u"]}), path)
    with pytest.raises(
        ValueError,
        match=rf"{path} has no column 'text' \(its columns: \['content', 'url'\]\).*"
        "--text_field",
    ):
        corpus_lib.open_source(str(path))


def test_parquet_field_that_is_not_strings(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [1, 2], "body": ["a", "b"]}), path)
    with pytest.raises(ValueError, match=rf"{path}: column 'text' holds int64, not strings.*\['body'\]"):
        corpus_lib.open_source(str(path))


def test_damaged_parquet_footer_and_row_group(tmp_path, texts):
    good = write_parquet(tmp_path / "good.parquet", texts, row_group_size=20).read_bytes()
    (tmp_path / "footer.parquet").write_bytes(good[:-20])
    with pytest.raises(ValueError, match=rf"{tmp_path / 'footer.parquet'} is not a readable Parquet file.*footer"):
        corpus_lib.open_source(str(tmp_path / "footer.parquet"))
    # the footer intact, a data page overwritten: named with its row group when read
    pf = pq.ParquetFile(tmp_path / "good.parquet")
    start = pf.metadata.row_group(1).column(0).data_page_offset
    damaged = bytearray(good)
    damaged[start : start + 64] = b"\xff" * 64
    (tmp_path / "page.parquet").write_bytes(bytes(damaged))
    source = corpus_lib.open_source(str(tmp_path / "page.parquet"))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'page.parquet'}, row group 1 of 3, cannot be read.*damaged"):
        list(source.documents())


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl.gz"])
def test_truncated_compressed_streams(tmp_path, texts, suffix):
    data = jsonl_bytes([{"text": t} for t in texts])
    packed = zstandard.ZstdCompressor().compress(data) if suffix.endswith("zst") else gzip.compress(data)
    path = tmp_path / f"c{suffix}"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match=rf"{path} is (a truncated zstd stream|not a complete gzip stream).*again"):
        list(corpus_lib.open_source(str(path)).documents())


def test_concatenated_zstd_frames_are_read_whole(tmp_path, texts):
    c = zstandard.ZstdCompressor()
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(
        c.compress(jsonl_bytes([{"text": t} for t in texts[:30]]))
        + c.compress(jsonl_bytes([{"text": t} for t in texts[30:]]))
    )
    assert len(list(corpus_lib.open_source(str(path)).documents())) == len(texts)


def test_glob_matching_nothing_and_mixed_kinds(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing-\*\.parquet' matches no files"):
        corpus_lib.open_source(f"{tmp_path}/nothing-*.parquet")
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes([{"text": "A."}]))
    (tmp_path / "d.txt").write_text("B.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"mixes Parquet / JSON Lines files with .*d\.txt"):
        corpus_lib.open_source(f"{tmp_path}/c.jsonl,{tmp_path}/d.txt")


# --- Commands --------------------------------------------------------------------------------------
def test_prepare_command_on_a_parquet_glob(tmp_path, texts, vocab_file):
    write_parquet(tmp_path / "a.parquet", texts[:30])
    write_parquet(tmp_path / "b.parquet", texts[30:] + [None])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={tmp_path}/*.parquet",
            f"--output_dir={tmp_path}/out",
            f"--vocab_file={vocab_file}",
            "--num_shards=2",
            "--num_workers=1",
            "--max_seq_length=64",
            "--max_predictions_per_seq=10",
            "--dupe_factor=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "from 60 documents" in done.stdout and "1 empty texts" in done.stdout
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["corpus"]["rows"] == 61 and metadata["corpus"]["units"] == 10  # 5 + 5 row groups
    assert len(list((tmp_path / "out").glob("records-*.tfrecord"))) == 2
    # a bad field is one line on stderr, exit 1
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={tmp_path}/*.parquet",
            f"--output_dir={tmp_path}/out2",
            f"--vocab_file={vocab_file}",
            "--text_field=body",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith(f"prepare: error: {tmp_path / 'a.parquet'} has no column 'body' (its columns: ['text'])")
    )


def test_tokenizer_command_on_jsonl_zst(tmp_path, texts):
    data = jsonl_bytes([{"content": t} for t in texts] + [{"content": ""}])
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.tokenizer",
            f"--input_file={tmp_path}/c.jsonl.zst",
            "--text_field=content",
            "--vocab_size=300",
            f"--output_dir={tmp_path}/out",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sentences = sum(len(corpus_lib.split_sentences(t)) for t in texts)
    assert f"60 documents, {sentences:,} sentences (61 rows, skipped 1 empty texts" in done.stdout
    assert (tmp_path / "out" / "vocab.txt").is_file()


# --- The job ---------------------------------------------------------------------------------------
def test_the_job_trains_from_a_parquet_glob(tmp_path, texts):
    """--config.data.corpus='DIR/*.parquet' with --config.data.text_field: the stage reads the rows, the job trains."""
    import numpy as np

    import train_setup
    from bertjax.jobs import main as train

    write_parquet(tmp_path / "a.parquet", ["x"] * 40, body=texts[:40])
    write_parquet(tmp_path / "b.parquet", ["x"] * 20, body=texts[40:])
    config = train_setup.small_config(
        **{
            "data.corpus": f"{tmp_path}/*.parquet",
            "data.text_field": "body",
            "data.corpus_vocab_size": 600,
            "model.vocab_size": 0,  # the trained vocab's
            "data.heldout_every": 4,
            "data.dupe_factor": 2,
            "data.num_shards": 2,
            "data.num_workers": 1,
            "train.num_train_steps": 2,
            "eval.every_steps": 2,
            "checkpoint.every_steps": 2,
        }
    )
    result = train.train_and_evaluate(config, str(tmp_path / "work"))
    stage = json.loads((tmp_path / "work" / "data" / "stage.json").read_text())
    assert (stage["train_documents"], stage["heldout_documents"]) == (45, 15)
    assert stage["train_instances"] > 0 and stage["vocab_size"] <= 600
    assert np.isfinite(result["mlm_loss"])


# --- Files named or holding what a user would not expect ----------------------------------------------


def test_a_json_file_of_json_lines_is_read_by_rows_and_a_json_array_is_refused(tmp_path, texts):
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_dict({"id": list(range(len(texts))), "text": texts})
    rows.to_json(tmp_path / "lines.json")  # datasets' default: JSON Lines, named .json
    source = corpus_lib.open_source(str(tmp_path / "lines.json"))
    assert isinstance(source, table_corpus.TableSource)
    assert list(source.documents()) == [corpus_lib.split_sentences(t) for t in texts]
    assert source.stats.rows == len(texts)
    rows.to_json(tmp_path / "array.json", lines=False)
    with pytest.raises(
        ValueError,
        match=rf"{tmp_path / 'array.json'} holds a JSON array, not JSON Lines .*"
        r"to_json\(path\) does by default",
    ):
        corpus_lib.open_source(str(tmp_path / "array.json"))
    (tmp_path / "pretty.json").write_text(json.dumps({"text": texts[0]}, indent=2))
    with pytest.raises(
        ValueError,
        match=r"pretty.json: line 1 is not a JSON object by itself, so the file is one "
        r"JSON document over several lines",
    ):
        corpus_lib.open_source(str(tmp_path / "pretty.json"))


def test_a_lone_surrogate_is_replaced_and_counted_like_bytes_that_are_not_utf8(tmp_path, vocab_file):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"text": "The parser reads \\ud800 a file. It writes it back."}\n'
        '{"text": "A fine row. With two sentences."}\n',
        encoding="utf-8",
    )  # valid JSON, no text
    source = corpus_lib.open_source(str(path))
    documents = list(source.documents())
    assert documents[0] == ["The parser reads \ufffd a file.", "It writes it back."]
    assert source.stats.replaced_lines == 1
    meta = prepare(path, tmp_path / "out", vocab_file)  # records are written: nothing fails to encode
    assert meta["replaced"]["non_utf8_lines"] == 1 and shard_bytes(tmp_path / "out")


def test_the_tokenizer_on_a_file_without_rows_names_the_file_and_what_it_read(tmp_path):
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.tokenizer",
            f"--input_file={tmp_path}/empty.parquet",
            "--vocab_size=100",
            f"--output_dir={tmp_path}/out",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stderr.strip() == (
        f"tokenizer: error: --input_file={tmp_path}/empty.parquet gave no text to train on: 1 unit(s) read, 1 empty file(s); "
        "point it at files that hold text (or name the field that does with --text_field)."
    ), done.stderr
