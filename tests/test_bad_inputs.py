"""Bad inputs a user can give (issue 16): each fails at the entry point in one sentence that names the file or
config field and says what to do, never as a stack trace from inside tokenizers, sentencepiece, gzip,
safetensors or XLA. Every test damages one input and checks the sentence, so removing a check fails it."""

import gzip
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

import bertjax
from bertjax.jobs import export as exporting
from bertjax.models.bert import hf
from bertjax.models.bert import model as model_lib
from bertjax.interop import pretrained
from bertjax.jobs import main as train
from bertjax.training import sharding as sharding_lib
from bertjax.config.schema import JobConfig
from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.pretraining import instances
from bertjax.data.pretraining import shards as shards_lib
from bertjax.jobs import prepare as prepare_job
from bertjax.jobs import stage
from bertjax.data.vocab import tokenization, training as vocab_training

import train_setup

REPO = pathlib.Path(__file__).resolve().parents[1]
WORDS = ["the", "a", "dog", "cat", "runs", "sleeps", "."]


def sentence(excinfo: pytest.ExceptionInfo, *names) -> str:
    """The error's message, checked to be one line that names every one of `names`."""
    message = str(excinfo.value)
    assert "\n" not in message, message
    for name in names:
        assert str(name) in message, (name, message)
    return message


def write_vocab(path: pathlib.Path, tokens) -> pathlib.Path:
    path.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    return path


def gzip_cases(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    """A plain-text file named .gz, a truncated gzip and one whose CRC is wrong."""
    text = "".join(f"sentence {i} of a document.\nand its second line {i}.\n\n" for i in range(2000)).encode()
    data = gzip.compress(text)
    cases = {
        "plain.txt.gz": text[:200],
        "truncated.txt.gz": data[: len(data) // 2],
        "bad_crc.txt.gz": data[:-8] + b"\0" * 8,
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
    return [tmp_path / name for name in cases]


def prepare_config(tmp_path: pathlib.Path, input_file, vocab_file, output_dir=None) -> shards_lib.PrepareConfig:
    return shards_lib.PrepareConfig(
        input_file=str(input_file),
        output_dir=str(output_dir or tmp_path / "out"),
        vocab_file=str(vocab_file),
        num_shards=1,
        instance=instances.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1),
    )


def hf_dir(tmp_path: pathlib.Path, minilm_dir: pathlib.Path, **config_changes) -> pathlib.Path:
    """A Hugging Face directory holding the real MiniLM config.json (changed as asked), and no weights:
    config.json is checked before any weight is read."""
    out = tmp_path / "hf"
    out.mkdir()
    config = json.loads((minilm_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **config_changes}))
    return out


# --- 1, 2, 3: vocab files -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", tokenization.SPECIAL_TOKENS)
def test_vocab_without_a_special_token(tmp_path, missing):
    vocab = write_vocab(tmp_path / "vocab.txt", [t for t in tokenization.SPECIAL_TOKENS if t != missing] + WORDS)
    with pytest.raises(ValueError) as e:
        tokenization.load(vocab)
    sentence(e, vocab, f"lacks the special token(s) {missing};", "python -m bertjax.tokenizer")


def test_empty_and_binary_vocab_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError) as e:
        tokenization.load(empty)
    sentence(e, empty, "is empty")
    good = "".join(f"{t}\n" for t in [*tokenization.SPECIAL_TOKENS, *WORDS]).encode()
    for name, blob in [
        ("random.txt", bytes(range(128, 256)) * 4),
        ("vocab.txt.gz", gzip.compress(good)),
        ("latin1.txt", good + "café\n".encode("latin-1")),
    ]:
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(ValueError) as e:
            tokenization.load(tmp_path / name)
        sentence(e, tmp_path / name, "is not UTF-8 text", "one token per line")


def test_corrupt_sentencepiece_model(tmp_path):
    lines = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 9)) for i in range(200)]
    model = vocab_training.train_sentencepiece(iter(lines), 25, tmp_path / "sp").path.read_bytes()
    for name, blob in [
        ("garbage.model", b"\x8f\x01not a model at all" * 10),
        ("empty.model", b""),
        ("truncated.model", model[: len(model) // 2]),
        ("cut_short.model", model[:-3]),
    ]:
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(ValueError) as e:
            tokenization.load(tmp_path / name)
        sentence(e, tmp_path / name, "cannot be read", "sentencepiece training")


def test_bad_vocab_through_the_prepare_cli(tmp_path):
    """python -m bertjax.prepare: the tokenizer's sentence on stderr, exit code 1, no traceback."""
    vocab = write_vocab(tmp_path / "nomask.txt", [*tokenization.SPECIAL_TOKENS[:-1], *WORDS])
    (tmp_path / "corpus.txt").write_text("the dog runs.\nthe cat sleeps.\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.prepare",
            f"--input_file={tmp_path}/corpus.txt",
            f"--output_dir={tmp_path}/out",
            f"--vocab_file={vocab}",
            "--num_workers=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("prepare: error:")]
    assert len(error) == 1 and f"{vocab} lacks the special token(s) [MASK];" in error[0], done.stderr
    assert not (tmp_path / "out").exists()


# --- 4: corrupt .gz corpora ---------------------------------------------------------------------------------------


def test_corrupt_gzip_corpus(tmp_path, minilm_dir):
    for path in gzip_cases(tmp_path):
        with pytest.raises(ValueError) as e:
            list(corpus_lib.open_source(str(path)).documents())
        sentence(e, path, "is not a readable gzip file", "drop the .gz")
    truncated = tmp_path / "truncated.txt.gz"
    with pytest.raises(ValueError) as e:  # bertjax.prepare's own entry point
        prepare_job.prepare(
            prepare_config(tmp_path, truncated, minilm_dir / "vocab.txt"), progress_stream=io.StringIO()
        )
    sentence(e, truncated, "is not a readable gzip file")


def test_corrupt_gzip_through_the_tokenizer_cli(tmp_path):
    truncated = gzip_cases(tmp_path)[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.tokenizer",
            f"--input_file={truncated}",
            "--vocab_size=100",
            f"--output_dir={tmp_path}/vocab",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1].startswith(f"tokenizer: error: {truncated} is not a readable gzip file (")
    ), done.stderr


# --- 5: a directory where a file is expected, a file where a directory is -----------------------------------------


def test_directory_given_as_a_file(tmp_path):
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    with pytest.raises(IsADirectoryError) as e:
        corpus_lib.open_source(str(corpus_dir))
    sentence(e, f"--input_file '{corpus_dir}' is a directory", os.path.join(corpus_dir, "*.txt"))
    with pytest.raises(IsADirectoryError) as e:  # the main job's data stage names its own field
        stage.split_corpus(str(corpus_dir), str(tmp_path), heldout_every=20)
    sentence(e, f"config.data.corpus '{corpus_dir}' is a directory")
    with pytest.raises(FileNotFoundError) as e:  # --vocab_file=DIR is searched for vocab.txt / spm.model
        tokenization.load(corpus_dir)
    sentence(e, corpus_dir, "holds none of vocab.txt, spm.model or tokenizer.json")


def test_file_given_as_a_directory(tmp_path, minilm_dir):
    weights = minilm_dir / "model.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        bertjax.from_pretrained(str(weights))
    sentence(e, weights, f"is not a directory (it is a file: pass the directory that holds it, {minilm_dir})")
    with pytest.raises(FileNotFoundError) as e:
        pretrained.init_params(str(weights), model_lib.BertForPreTraining(model_lib.BertConfig()))
    sentence(e, f"config.train.init_from={weights} is neither a bertjax workdir")
    with pytest.raises(FileNotFoundError) as e:  # an HF directory is not a training run
        exporting.export(str(minilm_dir), str(tmp_path / "out"))
    sentence(e, f"--workdir={minilm_dir} is not a bertjax workdir", "Hugging Face directory already")
    with pytest.raises(FileNotFoundError) as e:
        exporting.export(str(weights), str(tmp_path / "out"))
    sentence(e, f"--workdir={weights} is not a bertjax workdir", "--workdir of a training run")

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the dog runs.\nthe cat sleeps.\n", encoding="utf-8")
    with pytest.raises(NotADirectoryError) as e:
        prepare_job.prepare(
            prepare_config(tmp_path, corpus, minilm_dir / "vocab.txt", output_dir=a_file), progress_stream=io.StringIO()
        )
    sentence(e, f"--output_dir={a_file} is a file")
    with pytest.raises(NotADirectoryError) as e:
        vocab_training.train_wordpiece(iter(["the dog runs"]), 50, a_file)
    sentence(e, a_file, "is a file; pass a directory")
    config = model_lib.BertConfig(
        vocab_size=16,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=8,
    )
    with pytest.raises(NotADirectoryError) as e:
        hf.save_pretrained(str(a_file), model_lib.BertForPreTraining(config), {})
    sentence(e, a_file, "is a file, not a directory")


# --- 6, 7, 8: config fields ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, says",
    [
        ((3, 1, 1), "config.mesh.shape=(3, 1, 1) needs 3 devices but 8 are available; make the product 8"),
        ((2, 2, 1), "config.mesh.shape=(2, 2, 1) needs 4 devices but 8 are available"),
        ((-1, -1, 1), "config.mesh.shape=(-1, -1, 1): sizes must be positive, with at most one -1"),
        ((3, -1, 1), "config.mesh.shape=(3, -1, 1): 8 devices do not divide by 3"),
        ((0, -1, 1), "config.mesh.shape=(0, -1, 1): sizes must be positive"),
        ((-1, 1), "config.mesh.shape=(-1, 1) must have 3 entries"),
    ],
)
def test_mesh_that_does_not_match_the_devices(shape, says):
    assert len(jax.devices()) == 8  # tests/conftest.py
    with pytest.raises(ValueError) as e:
        sharding_lib.make_mesh(shape)
    sentence(e, says)


def test_heads_that_do_not_divide_hidden_size(tmp_path, minilm_dir):
    with pytest.raises(ValueError) as e:
        JobConfig.from_configdict(train_setup.small_config(**{"model.num_attention_heads": 5}))
    sentence(e, "config.model: hidden_size=64 is not divisible by num_attention_heads=5")
    path = hf_dir(tmp_path, minilm_dir, num_attention_heads=5)
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(
        e,
        f"{path / 'config.json'}: hidden_size=384 is not divisible by num_attention_heads=5",
        "choose a head count that divides it",
    )


def test_config_json_with_wrongly_typed_fields(tmp_path, minilm_dir):
    path = hf_dir(tmp_path, minilm_dir, num_attention_heads="12")
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(e, f"{path / 'config.json'}: num_attention_heads='12' must be a positive integer")


def test_max_seq_length_over_max_position_embeddings():
    with pytest.raises(ValueError) as e:
        JobConfig.from_configdict(train_setup.small_config(**{"data.max_seq_length": 128}))
    sentence(e, "config.data.max_seq_length=128 exceeds config.model.max_position_embeddings=64")


# --- 9, 10: Hugging Face directories ------------------------------------------------------------------------------


def test_truncated_safetensors(tmp_path, minilm_dir):
    path = tmp_path / "hf"
    path.mkdir()
    shutil.copy(minilm_dir / "config.json", path)
    data = (minilm_dir / "model.safetensors").read_bytes()
    model = model_lib.BertForPreTraining(hf.load_config(str(path)))
    for cut in (len(data) // 2, len(data) - 1, 100, 4):  # tensor data, header, or the header's length cut off
        (path / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ValueError) as e:
            bertjax.from_pretrained(str(path))
        sentence(e, path / "model.safetensors", "is not a readable safetensors file", "re-download it")
        with pytest.raises(ValueError) as e:  # config.train.init_from
            pretrained.init_params(str(path), model)
        sentence(e, path / "model.safetensors", "is not a readable safetensors file")


@pytest.mark.parametrize(
    "field, value",
    [
        ("position_embedding_type", "relative_key"),
        ("position_embedding_type", "relative_key_query"),
        ("is_decoder", True),
        ("add_cross_attention", True),
    ],
)
def test_unsupported_config_json_fields(tmp_path, minilm_dir, field, value):
    path = hf_dir(tmp_path, minilm_dir, **{field: value})
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(e, f"{path / 'config.json'}: {field}={value!r} is not supported", "load this checkpoint with transformers")


def test_config_json_that_is_not_bert(tmp_path, minilm_dir):
    path = hf_dir(tmp_path, minilm_dir, model_type="roberta")
    with pytest.raises(ValueError) as e:
        bertjax.from_pretrained(str(path))
    sentence(e, f"{path / 'config.json'}: model_type='roberta' is not BERT")
    for text, says in [("{not json", "is not valid JSON"), ("[1, 2]", "holds a JSON list")]:
        (path / "config.json").write_text(text)
        with pytest.raises(ValueError) as e:
            bertjax.from_pretrained(str(path))
        sentence(e, path / "config.json", says)


# --- The job's command line ---------------------------------------------------------------------------------------


def test_the_job_ends_a_bad_input_in_its_one_sentence(tmp_path):
    """python -m bertjax.main: a user's mistake is the error's sentence on stderr, exit 1, no traceback."""
    command = [
        sys.executable,
        "-m",
        "bertjax.main",
        "--config=configs/tiny.py:runlocal",
        f"--workdir={tmp_path}/w",
        f"--config.data.train_files={tmp_path}/records/*.tfrecord",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", BERTJAX_NO_TCMALLOC="1")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert last.startswith(
        f"bertjax: config.data.train_files pattern '{tmp_path}/records/*.tfrecord' matches no files"
    ), last
    assert last.endswith("(BERTJAX_TRACEBACK=1 shows where it was raised)")
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(env, BERTJAX_TRACEBACK="1")
    )
    assert done.returncode == 1 and "Traceback" in done.stderr


# --- Absurd sizes: refused before anything is allocated -----------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, says",
    [
        (
            "vocab_size",
            10**9,
            "says vocab_size=1,000,000,000, hidden_size=8, but the weights' word_embeddings.weight is 16 × 8",
        ),
        (
            "intermediate_size",
            10**9,
            "says intermediate_size=1,000,000,000, hidden_size=8, but the weights' intermediate.dense.weight is 8 × 8",
        ),
        (
            "max_position_embeddings",
            10**9,
            "says max_position_embeddings=1,000,000,000, hidden_size=8, but the "
            "weights' position_embeddings.weight is 8 × 8",
        ),
        ("num_hidden_layers", 10**6, "says num_hidden_layers=1,000,000, but the weights hold 1 layers"),
    ],
)
def test_a_config_json_that_does_not_belong_to_its_weights_is_refused_before_any_allocation(
    tmp_path, field, value, says
):
    config = model_lib.BertConfig(
        vocab_size=16,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=8,
    )
    model = model_lib.BertForPreTraining(config)
    hf.save_pretrained(str(tmp_path), model, model_lib.init_params(model, jax.random.PRNGKey(0)))
    saved = json.loads((tmp_path / "config.json").read_text())
    saved[field] = value
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError) as e:
        pretrained.load(str(tmp_path))
    sentence(e, f"{tmp_path}/config.json {says}", "does not belong to these weights")


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            {"data.max_seq_length": 10**9, "model.max_position_embeddings": 10**9},
            "max_position_embeddings=1,000,000,000) has 64,0",
        ),
        (
            {"train.global_batch_size": 10**9},
            "config.train.global_batch_size=1,000,000,000 rows of "
            "config.data.max_seq_length=32 tokens are 357.6 GiB of input arrays",
        ),
    ],
)
def test_a_job_too_large_for_any_memory_here_is_refused_before_anything_is_written(tmp_path, overrides, says):
    c = train_setup.small_config(**{"data.corpus": "builtin:pydocs", **overrides})
    with pytest.raises(ValueError) as e:
        train.train_and_evaluate(c, str(tmp_path / "work"))
    sentence(e, says, "more than")
    assert not (tmp_path / "work").exists()


# --- Settings refused before the data stage, named as the config's fields (issue 69) -------------------------------


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"data.corpus_vocab_size": 5}, "config.data.corpus_vocab_size=5 leaves no room beside the 5 special tokens"),
        ({"data.max_seq_length": 3}, "config.data.max_seq_length=3 leaves no room for [CLS], two segments"),
        ({"data.max_predictions_per_seq": 40}, "config.data.max_predictions_per_seq=40 is larger than"),
        ({"model.vocab_size": 5}, "config.model.vocab_size=5, but the job trains its own vocab of"),
        ({"mesh.shape": (3, 1, 1)}, "config.mesh.shape=(3, 1, 1) needs 3 devices"),
        ({"train.global_batch_size": 12, "mesh.shape": (1, 8, 1)}, "must divide by the 8 ways the batch is split"),
        (
            {"data.corpus": "", "data.mixture": "py=builtin:pydocs:0.5,code={tmp}/nothing/*.txt:0.5"},
            "config.data.mixture source 'code'",
        ),
    ],
)
def test_a_setting_that_cannot_work_is_refused_before_the_data_stage(tmp_path, overrides, says):
    overrides = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in overrides.items()}
    c = train_setup.small_config(**{"data.corpus": "builtin:pydocs", "data.corpus_vocab_size": train_setup.VOCAB})
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    with pytest.raises(ValueError) as e:
        train.train_and_evaluate(c, str(tmp_path / "work"))
    sentence(e, says)
    assert not (tmp_path / "work" / "data").exists()  # no minutes of data work before the refusal


def test_a_mixture_source_matching_no_files_exits_2_as_the_mixtures_other_mistakes(tmp_path):
    from bertjax import cli
    from bertjax.config.schema import ConfigError

    c = train_setup.small_config(**{"data.mixture": f"py=builtin:pydocs:0.5,code={tmp_path}/none/*.txt:0.5"})
    c.model.vocab_size = 0
    with pytest.raises(ConfigError) as e:
        train.train_and_evaluate(c, str(tmp_path / "work"))
    assert "config.data.corpus" not in str(e.value)
    with pytest.raises(SystemExit) as done:
        cli.exit_with_sentence(e.value)
    assert done.value.code == cli.USAGE_EXIT


def test_schedule_steps_the_run_never_reaches_are_warned_about():
    c = train_setup.small_config(
        **{
            "data.mixture": "a=x/*.txt:0.5,b=y/*.txt:0.5",
            "data.mixture_schedule": "3:a=1,b=0;500:a=0,b=1",
            "data.masked_lm_prob": "0:0.3;4:0.15;5:0.1",
            "data.dynamic_masking": True,
        }
    )
    job = JobConfig.from_configdict(c)  # num_train_steps=5
    assert job.never_reached() == [
        "config.data.mixture_schedule changes at step 500, which the run never reaches: it ends at "
        "config.train.num_train_steps=5.",
        "config.data.masked_lm_prob changes at step 5, which the run never reaches: it ends at "
        "config.train.num_train_steps=5.",
    ]
    assert JobConfig.from_configdict(train_setup.small_config()).never_reached() == []
