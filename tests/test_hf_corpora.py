"""`hf:DIR[:SPLIT]` corpora (bertjax/data/corpus/hf_datasets.py) and the row-based work split of table corpora: the same
documents give byte-identical records over several shards from any container (Parquet with one or many row
groups, JSON Lines, .jsonl.zst, save_to_disk directories, the Hub's layout), row spans tile every unit, skipped
rows are counted per file, and each bad directory is one sentence."""

import io
import json
import pathlib
import random
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")

from bertjax.data.corpus import sources as corpus_lib  # noqa: E402
from bertjax.data.corpus import hf_datasets  # noqa: E402
from bertjax.data.pretraining import instances  # noqa: E402
from bertjax.data.pretraining import shards as shards_lib  # noqa: E402
from bertjax.jobs import prepare as prepare_job

from train_setup import vocab_words  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def texts(vocab_file) -> list[str]:
    """80 documents of 2-9 sentences of random vocab words."""
    words = vocab_words(vocab_file)
    rng = random.Random(1)
    sentence = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + "."  # noqa: E731
    return [" ".join(sentence() for _ in range(rng.randint(2, 9))) for _ in range(80)]


def write_parquet(path: pathlib.Path, rows: list, row_group_size: int = 1_000_000) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": pa.array(rows, pa.string())}), path, row_group_size=row_group_size)
    return path


def jsonl_bytes(rows: list, blank_every: int = 0) -> bytes:
    return "".join(
        json.dumps(r) + "\n" + ("\n" if blank_every and i % blank_every == 0 else "") for i, r in enumerate(rows)
    ).encode("utf-8")


def prepare(
    input_file,
    out: pathlib.Path,
    vocab_file,
    num_shards: int = 1,
    num_workers: int = 1,
    runner: str = "local",
    beam_args: tuple = (),
    **kw,
) -> dict:
    cfg = shards_lib.PrepareConfig(
        input_file=str(input_file),
        output_dir=str(out),
        vocab_file=str(vocab_file),
        num_shards=num_shards,
        block_chars=2_000,
        **kw,
        instance=instances.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2),
    )
    return prepare_job.prepare(
        cfg, num_workers=num_workers, runner=runner, beam_args=tuple(beam_args), progress_stream=io.StringIO()
    )


def shard_bytes(out: pathlib.Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("records-*.tfrecord"))]


def hub_layout(root: pathlib.Path, texts: list[str]) -> pathlib.Path:
    """A dataset repository as the Hub lays it out: data/train-0000K-of-00003.parquet plus a validation file."""
    third = len(texts) // 3 + 1
    for k in range(3):
        write_parquet(
            root / "data" / f"train-{k:05d}-of-00003.parquet", texts[k * third : (k + 1) * third], row_group_size=5
        )
    write_parquet(root / "data" / "validation-00000-of-00001.parquet", texts[:3])
    return root


# --- Same documents, same records, over several shards --------------------------------------------
def test_every_container_gives_byte_identical_records_over_several_shards(tmp_path, texts, vocab_file):
    """Shards are cut by rows, not by files or row groups: 4 shards are the same from 7 containers."""
    write_parquet(tmp_path / "one.parquet", texts)
    write_parquet(tmp_path / "groups.parquet", texts, row_group_size=7)
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes([{"text": t} for t in texts], blank_every=17))
    (tmp_path / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(jsonl_bytes([{"text": t} for t in texts]))
    )
    dataset = datasets.Dataset.from_dict({"id": list(range(len(texts))), "text": texts})
    dataset.save_to_disk(str(tmp_path / "saved"), max_shard_size="2KB")  # several .arrow files
    datasets.DatasetDict({"train": dataset, "test": dataset.select(range(5))}).save_to_disk(str(tmp_path / "dict"))
    hub_layout(tmp_path / "hub", texts)
    specs = {
        "parquet": tmp_path / "one.parquet",
        "row_groups": tmp_path / "groups.parquet",
        "jsonl": tmp_path / "c.jsonl",
        "zst": tmp_path / "c.jsonl.zst",
        "save_to_disk": f"hf:{tmp_path}/saved",
        "dataset_dict": f"hf:{tmp_path}/dict:train",
        "hub": f"hf:{tmp_path}/hub",
    }
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 3
    made = {}
    for kind, spec in specs.items():
        metadata = prepare(spec, tmp_path / kind, vocab_file, num_shards=4)
        assert metadata["corpus"]["rows"] == len(texts) and metadata["corpus"]["documents"] == len(texts), kind
        made[kind] = shard_bytes(tmp_path / kind)
    assert len(made["parquet"]) == 4 and all(len(shard) > 1_000 for shard in made["parquet"])
    assert all(made[kind] == made["parquet"] for kind in specs), [k for k in specs if made[k] != made["parquet"]]


def test_row_spans_tile_every_unit(tmp_path, texts):
    """Over any number of shards, the shards' documents in order are the corpus's, and every counter adds
    up to a whole read's: each row, blank line, file and row group is read and counted once."""
    write_parquet(tmp_path / "a.parquet", texts[:20] + [None, ""], row_group_size=3)
    (tmp_path / "b.jsonl").write_bytes(
        b"\n" + jsonl_bytes([{"text": t} for t in texts[20:50]] + [{"x": 1}], blank_every=4) + b"\n\n"
    )
    (tmp_path / "c.jsonl").write_bytes(b"")
    datasets.Dataset.from_dict({"text": texts[50:]}).save_to_disk(str(tmp_path / "saved"), max_shard_size="1KB")
    spec = f"{tmp_path}/*.parquet,{tmp_path}/*.jsonl,{tmp_path}/saved/*.arrow"
    whole = corpus_lib.open_source(spec)
    expected = list(whole.documents())
    assert len(expected) == len(texts)
    for num_shards in (1, 2, 3, 5, 8, 13, 200):
        source = corpus_lib.open_source(spec)
        work = source.split(num_shards)
        assert len(work) == num_shards
        stats = corpus_lib.CorpusStats()
        got = [doc for units in work for doc in source.read(units, stats)]
        assert got == expected, num_shards
        assert stats == whole.stats, num_shards


def test_a_big_uncompressed_jsonl_file_is_split_at_seek_points(tmp_path):
    """Its row-count pass notes where every SEEK_EVERY-th row starts, so each shard seeks near its first row
    (a line-aligned byte range) instead of reading the file from the top; the rows read are the same."""
    from bertjax.data.corpus import table as table_corpus

    rows = [{"text": f"Row {i} says hello. It ends here."} for i in range(20_000)]
    data = b"\xef\xbb\xbf" + jsonl_bytes(rows, blank_every=999)
    (tmp_path / "big.jsonl").write_bytes(data)
    whole = corpus_lib.open_source(str(tmp_path / "big.jsonl"))
    expected = list(whole.documents())
    source = corpus_lib.open_source(str(tmp_path / "big.jsonl"))
    spans = [unit for units in source.split(5) for unit in units]
    assert len(spans) == 5 and all(isinstance(span, table_corpus.RowSpan) for span in spans)
    assert [bool(span.seek) for span in spans] == [span.start >= table_corpus.SEEK_EVERY for span in spans]
    assert sum(bool(span.seek) for span in spans) >= 3
    for span in (span for span in spans if span.seek):
        row, _, offset = span.seek
        assert span.start - table_corpus.SEEK_EVERY < row <= span.start
        assert json.loads(data[offset:].split(b"\n", 1)[0]) == rows[row]
    stats = corpus_lib.CorpusStats()
    assert [doc for span in spans for doc in source.read([span], stats)] == expected
    assert stats == whole.stats and stats.empty_lines == data.count(b"\n\n") > 0


def test_records_do_not_depend_on_the_workers_or_the_runner_for_an_hf_directory(tmp_path, texts, vocab_file):
    """1 worker, 2 workers and Beam (FnApiRunner: the DirectRunner's batch engine, nothing downloaded) write
    the same bytes from row spans of several Arrow files."""
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"), max_shard_size="3KB")
    one = prepare(f"hf:{tmp_path}/saved", tmp_path / "w1", vocab_file, num_shards=3, num_workers=1)
    two = prepare(f"hf:{tmp_path}/saved", tmp_path / "w2", vocab_file, num_shards=3, num_workers=2)
    beam = prepare(
        f"hf:{tmp_path}/saved",
        tmp_path / "beam",
        vocab_file,
        num_shards=3,
        runner="beam",
        beam_args=("--runner=FnApiRunner",),
    )
    assert one["files"] == two["files"] == beam["files"] and all(f["records"] > 0 for f in one["files"])
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2") == shard_bytes(tmp_path / "beam")
    assert beam["runner"] == "beam" and beam["corpus"]["rows"] == len(texts)


# --- hf: directories --------------------------------------------------------------------------------
def test_save_to_disk_directories_and_their_splits(tmp_path, texts):
    dataset = datasets.Dataset.from_dict({"text": texts[:10]})
    datasets.DatasetDict({"train": dataset, "test": datasets.Dataset.from_dict({"text": texts[10:14]})}).save_to_disk(
        str(tmp_path / "dict")
    )
    assert len(list(corpus_lib.open_source(f"hf:{tmp_path}/dict").documents())) == 10  # train by default
    assert len(list(corpus_lib.open_source(f"hf:{tmp_path}/dict:test").documents())) == 4
    with pytest.raises(ValueError, match=r"has no split 'validation'; its splits: \['train', 'test'\]"):
        corpus_lib.open_source(f"hf:{tmp_path}/dict:validation")
    # one saved split, as load_dataset(...)[split].save_to_disk writes it
    datasets.DatasetDict({"test": dataset}).save_to_disk(str(tmp_path / "only_test"))
    assert len(list(corpus_lib.open_source(f"hf:{tmp_path}/only_test").documents())) == 10
    (tmp_path / "dict" / "test" / "state.json").unlink()
    with pytest.raises(ValueError, match=r"dict/test/state\.json cannot be read"):
        corpus_lib.open_source(f"hf:{tmp_path}/dict:test")


def test_hub_layout_splits_by_directory_and_file_name(tmp_path, texts):
    root = hub_layout(tmp_path / "repo", texts)
    (root / ".cache" / "huggingface").mkdir(parents=True)  # what hf download leaves: not data
    write_parquet(root / ".cache" / "huggingface" / "train-00009-of-00010.parquet", ["hidden"])
    files, split = hf_datasets.resolve(f"hf:{root}")
    assert split == "train" and [pathlib.Path(f).name for f in files] == [
        f"train-{k:05d}-of-00003.parquet" for k in range(3)
    ]
    assert hf_datasets.resolve(f"hf:{root}:validation")[0] == [str(root / "data" / "validation-00000-of-00001.parquet")]
    with pytest.raises(ValueError, match=r"no split 'test'; its splits: \['train', 'validation'\]"):
        hf_datasets.resolve(f"hf:{root}:test")
    # split directories, JSON Lines inside
    (tmp_path / "dirs" / "dev").mkdir(parents=True)
    (tmp_path / "dirs" / "train").mkdir()
    (tmp_path / "dirs" / "train" / "part-1.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(b'{"text": "A."}\n')
    )
    (tmp_path / "dirs" / "dev" / "part-1.jsonl").write_bytes(b'{"text": "B."}\n')
    assert hf_datasets.resolve(f"hf:{tmp_path}/dirs:validation")[1] == "validation"
    # no split named anywhere: every data file is train
    write_parquet(tmp_path / "flat" / "000_00000.parquet", texts[:2])
    write_parquet(tmp_path / "flat" / "000_00001.parquet", texts[2:4])
    assert len(hf_datasets.resolve(f"hf:{tmp_path}/flat")[0]) == 2


def test_hub_readme_configs_choose_the_files(tmp_path, texts):
    """A FineWeb-Edu-like repository: the README's configs name each split's files; CONFIG/SPLIT picks one."""
    root = tmp_path / "fineweb-edu"
    write_parquet(root / "sample" / "10BT" / "000_00000.parquet", texts[:30])
    write_parquet(root / "sample" / "10BT" / "001_00000.parquet", texts[30:50])
    write_parquet(root / "data" / "CC-MAIN-2024-10" / "000_00000.parquet", texts[50:])
    (root / "README.md").write_text(
        "---\nlicense: odc-by\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*/*\n"
        "- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n"
        "- config_name: sample-100BT\n  data_files:\n  - split: train\n    path: sample/100BT/*\n---\n# FineWeb-Edu\n",
        encoding="utf-8",
    )
    assert len(list(corpus_lib.open_source(f"hf:{root}").documents())) == 30  # the default config: data/*/*
    assert len(list(corpus_lib.open_source(f"hf:{root}:sample-10BT").documents())) == 50
    assert len(list(corpus_lib.open_source(f"hf:{root}:sample-10BT/train").documents())) == 50
    with pytest.raises(
        FileNotFoundError,
        match=r"config 'sample-100BT' lists \['sample/100BT/\*'\] for split "
        r"'train', which match no data file here; configs with files here: "
        r"\['default', 'sample-10BT'\]",
    ):
        corpus_lib.open_source(f"hf:{root}:sample-100BT/train")
    with pytest.raises(ValueError, match=r"names no config 'nope'; its configs: \['default', 'sample-10BT', "):
        corpus_lib.open_source(f"hf:{root}:nope/train")


def test_bad_hf_directories_are_one_sentence(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"is not a directory: point hf: at a dataset directory"):
        corpus_lib.open_source(f"hf:{tmp_path}/missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("# nothing here\n")
    with pytest.raises(FileNotFoundError, match=r"holds no data files \(Parquet, JSON Lines .*\): download"):
        corpus_lib.open_source(f"hf:{tmp_path}/empty")
    with pytest.raises(
        ValueError,
        match=r"hf: reads local directories only; name the data files of a remote "
        r"dataset directly, e.g. gs://bucket/fw/data/\*\.parquet",
    ):
        corpus_lib.open_source("hf:gs://bucket/fw")
    datasets.Dataset.from_dict({"text": ["One. Two."] * 50}).save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:300])
    with pytest.raises(
        ValueError,
        match=r"data-00000-of-00001\.arrow is not a readable Arrow file .*: it is "
        r"damaged or truncated; write or download it again\.",
    ):
        list(corpus_lib.open_source(f"hf:{tmp_path}/saved").documents())


def test_the_prepare_command_names_the_splits_an_hf_directory_has(tmp_path, vocab_file):
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["A. B."]})}).save_to_disk(str(tmp_path / "d"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file=hf:{tmp_path}/d:dev",
            f"--output_dir={tmp_path}/out",
            f"--vocab_file={vocab_file}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert f"--input_file='hf:{tmp_path}/d:dev': the dataset has no split 'dev'; its splits: ['train']." in done.stderr
    assert "Traceback" not in done.stderr


# --- Counts per file ----------------------------------------------------------------------------------
def test_skipped_rows_are_counted_per_file(tmp_path, texts, vocab_file):
    (tmp_path / "a.jsonl").write_text(
        "\n".join([json.dumps({"text": texts[0]}), json.dumps({"text": None}), "{oops", json.dumps({"text": texts[1]})])
        + "\n"
    )
    (tmp_path / "b.jsonl").write_text(
        "\n".join([json.dumps({"text": 7}), json.dumps({"text": texts[2]}), json.dumps({"body": "x"})]) + "\n"
    )
    write_parquet(tmp_path / "c.parquet", texts[3:30] + [None, "  "], row_group_size=4)
    write_parquet(tmp_path / "d.parquet", texts[30:40])
    expected = {
        str(tmp_path / "a.jsonl"): {"empty_texts": 1, "bad_json_lines": 1},
        str(tmp_path / "b.jsonl"): {"non_string_texts": 1, "missing_texts": 1},
        str(tmp_path / "c.parquet"): {"empty_texts": 2},
    }
    spec = f"{tmp_path}/*.jsonl,{tmp_path}/*.parquet"
    one = prepare(spec, tmp_path / "one", vocab_file, skip_bad_json_lines=True)
    three = prepare(spec, tmp_path / "three", vocab_file, num_shards=3, num_workers=2, skip_bad_json_lines=True)
    assert one["corpus"]["skipped_by_file"] == three["corpus"]["skipped_by_file"] == expected
    assert one["skipped"]["empty_texts"] == 3 and one["text_field"] == "text"
    summary = prepare_job.summary(three)
    assert (
        f"rows skipped by file: {tmp_path}/a.jsonl: 1 bad json lines, 1 empty texts; {tmp_path}/b.jsonl: "
        "1 missing texts, 1 non string texts;" in summary
    )


# --- The job ---------------------------------------------------------------------------------------------
def test_the_job_trains_from_an_hf_directory(tmp_path, texts):
    """--config.data.corpus=hf:DIR:SPLIT (a save_to_disk DatasetDict): the stage streams its rows, the job trains."""
    import numpy as np

    import train_setup
    from bertjax.jobs import main as train

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": texts[:60]}),
            "validation": datasets.Dataset.from_dict({"text": texts[60:]}),
        }
    ).save_to_disk(str(tmp_path / "corpus"))
    config = train_setup.small_config(
        **{
            "data.corpus": f"hf:{tmp_path}/corpus:train",
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
    assert stage["train_instances"] > 0 and np.isfinite(result["mlm_loss"])
