"""Hidden states equal Hugging Face's, and `python -m bertjax.extract_features` writes the original's JSONL."""

import json

import jax
import numpy as np
import pytest
import torch
from absl import flags

import bertjax
from bertjax import extract_features
from bertjax.jobs import extract_features as features
from bertjax.models.bert import model as model_lib
from bertjax.data.vocab import tokenization

import reference

CONFIG = model_lib.BertConfig(
    vocab_size=40,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
HIDDEN_ATOL = 1e-4
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "house", "##s", "##ing", "sun", "red", "."]
VOCAB = [*tokenization.SPECIAL_TOKENS, *WORDS]


@pytest.mark.parametrize("remat", ["none", "full"])
def test_hidden_states_match_hf(remat, tmp_path):
    hf_model = reference.random_hf_model(CONFIG)
    hf_model.save_pretrained(tmp_path)
    inputs = reference.batch(CONFIG)
    with torch.no_grad():
        expected = hf_model.bert(
            input_ids=torch.tensor(inputs["input_ids"]).long(),
            token_type_ids=torch.tensor(inputs["segment_ids"]).long(),
            attention_mask=torch.tensor(inputs["input_mask"]).long(),
            output_hidden_states=True,
        ).hidden_states
    assert len(expected) == CONFIG.num_hidden_layers + 1
    plain = {k: v for k, v in inputs.items() if k != "masked_lm_positions"}
    for scan in (False, True):
        model, params = bertjax.from_pretrained(str(tmp_path), scan_layers=scan, remat_policy=remat)
        out = jax.jit(lambda p: model.apply({"params": p}, **plain, output_hidden_states=True))(params)
        assert len(out.hidden_states) == len(expected), f"scan={scan}"
        for i, (ours, theirs) in enumerate(zip(out.hidden_states, expected)):
            np.testing.assert_allclose(ours, theirs.numpy(), atol=HIDDEN_ATOL, rtol=0, err_msg=f"scan={scan} {i}")
        np.testing.assert_array_equal(out.hidden_states[-1], out.sequence_output)
        assert model.apply({"params": params}, **plain).hidden_states is None  # off by default


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny random model saved as a Hugging Face directory with a small cased vocab.txt."""
    root = tmp_path_factory.mktemp("extract")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    model = model_lib.BertForPreTraining(CONFIG)
    params = reference.random_params(model)
    bertjax.save_pretrained(str(root / "model"), model, params, vocab_file=str(vocab), do_lower_case=True)
    return root, model, params


def run_cli(capsys, *args: str) -> tuple[int, str]:
    """The CLI in this process: its own flags, parsed from args; (exit code, stderr)."""
    fv = flags.FlagValues()
    extract_features.define_flags(fv)
    fv(["extract_features", *args])
    try:
        extract_features.main([], fv)
        code = 0
    except SystemExit as e:  # cli.run_job's one way out of a user's mistake
        code = e.code
    return code, capsys.readouterr().err


def test_cli_writes_tokens_and_last_layer(exported, capsys, caplog):
    root, model, params = exported
    lines = [
        "The cat sat on the mat.",
        "a big red houses ||| the dog sating",  # a pair
        "",
        "the sun " * 40,
    ]  # a blank line still gets [CLS] [SEP]; the last is truncated
    (root / "input.txt").write_text("\n".join(lines) + "\n")
    out_file = root / "out" / "features.jsonl"
    code, err = run_cli(
        capsys,
        f"--init_from={root / 'model'}",
        f"--input_file={root / 'input.txt'}",
        f"--output_file={out_file}",
        "--layers=-1,0",
        "--max_seq_length=16",
        "--batch_size=3",
    )
    assert code == 0, err
    assert "truncated 1 of 4 lines" in caplog.text
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["linex_index"] for r in rows] == [0, 1, 2, 3]

    tokenizer = tokenization.load(root / "model" / "vocab.txt", True)
    a, b = (tokenizer.tokenize(t) for t in lines[1].split(" ||| "))
    expected_tokens = [
        ["[CLS]", *tokenizer.tokenize(lines[0]), "[SEP]"],
        ["[CLS]", *a, "[SEP]", *b, "[SEP]"],
        ["[CLS]", "[SEP]"],
        ["[CLS]", *tokenizer.tokenize(lines[3])[:14], "[SEP]"],
    ]
    assert expected_tokens[1] == [
        "[CLS]",
        "a",
        "big",
        "red",
        "house",
        "##s",
        "[SEP]",
        "the",
        "dog",
        "sat",
        "##ing",
        "[SEP]",
    ]
    for row, tokens in zip(rows, expected_tokens):
        assert [f["token"] for f in row["features"]] == tokens
        assert all([layer["index"] for layer in f["layers"]] == [-1, 0] for f in row["features"])

    for row, tokens in zip(rows, expected_tokens):
        n = len(tokens)
        ids = np.array([tokenizer.convert_tokens_to_ids(tokens)], np.int32)
        sep = tokens.index("[SEP]")
        segments = np.array([[0] * (sep + 1) + [1] * (n - sep - 1)], np.int32)  # pair: b and its [SEP] are 1
        out = model.apply({"params": params}, ids, segments, np.ones_like(ids))
        values = np.array([[f["layers"][0]["values"] for f in row["features"]]])
        np.testing.assert_allclose(values, out.sequence_output, atol=2e-6, rtol=0)
        assert len(row["features"][0]["layers"][0]["values"]) == CONFIG.hidden_size


def test_cli_errors_are_one_line(exported, capsys, tmp_path):
    root, _, _ = exported
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "one.txt").write_text("the cat\n")
    model_dir = root / "model"
    cases = {
        "--layers=-4": (f"--input_file={tmp_path / 'one.txt'}", "--layers=-1,-4"),
        "empty": (f"--input_file={tmp_path / 'empty.txt'}",),
        "no vocab": (f"--input_file={tmp_path / 'one.txt'}",),
    }
    expected = {
        "--layers=-4": "pass indices from -3 to 2",
        "empty": "empty.txt is empty",
        "no vocab": "pass the one the model was trained with as --vocab_file",
    }
    for name, args in cases.items():
        init_from = model_dir
        if name == "no vocab":  # the same model without its vocab.txt
            init_from = tmp_path / "bare"
            init_from.mkdir()
            for f in ("config.json", "model.safetensors"):
                (init_from / f).write_bytes((model_dir / f).read_bytes())
        code, err = run_cli(capsys, f"--init_from={init_from}", f"--output_file={tmp_path / 'out.jsonl'}", *args)
        assert code == 1, name
        assert err.startswith("extract_features: error: ") and err.count("\n") == 1, err
        assert expected[name] in err, err
    assert not (tmp_path / "out.jsonl").exists()


def test_vocab_comes_from_flags_then_what_the_checkpoint_records(tmp_path):
    vocab = tmp_path / "my_vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps({"data": {"vocab_file": str(vocab), "do_lower_case": False}}))
    assert features.find_vocab(str(workdir), None, None) == (str(vocab), False)  # a bertjax workdir
    assert features.find_vocab(str(workdir), "other.txt", True) == ("other.txt", True)  # flags win
    tf1 = tmp_path / "cased_L-2_H-128_A-2"  # google-research/bert's naming: no tokenizer_config.json
    tf1.mkdir()
    (tf1 / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    assert features.find_vocab(str(tf1), None, None) == (str(tf1 / "vocab.txt"), False)
    with pytest.raises(ValueError, match="not a comma-separated list of integers"):
        features.layer_indices("-1,last", 3)
    assert features.layer_indices("-1,-3,0,2", 3) == [-1, -3, 0, 2]
