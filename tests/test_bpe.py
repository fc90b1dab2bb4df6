"""Byte-level BPE (`python -m bertjax.tokenizer --model_type=bpe`) and any tokenizer.json: the same bytes from the
same corpus, tokenization equal to transformers' fast tokenizer on held-out text, specials under BERT's or
RoBERTa's names, word starts for whole-word masking, and a ModernBERT run whose export carries the tokenizer."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

from bertjax.data.corpus import sources as corpus_lib
from bertjax.data.vocab import tokenization, training as vocab_training

transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parent.parent
HELD_OUT = [
    "The interpreter reads a file, then runs its code.",
    "Ünïcode naïve 東京 lists  and\ttabs",
    "x = [1, 2, 3]  # a comment",
    "Return the HTTPResponse object's headers.",
]


def pydocs_lines(every: int = 1):
    source = corpus_lib.open_source("builtin:pydocs")
    for i, document in enumerate(source.documents()):
        if i % every == 0:
            yield from document


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> tokenization.JsonTokenizer:
    return vocab_training.train_bpe(pydocs_lines(), 1200, tmp_path_factory.mktemp("bpe"))


def test_bpe_is_reproducible_and_places_the_specials_first(bpe, tmp_path):
    again = vocab_training.train_bpe(pydocs_lines(), 1200, tmp_path)
    assert again.path.read_bytes() == bpe.path.read_bytes()
    assert (bpe.pad_id, bpe.unk_id, bpe.cls_id, bpe.sep_id, bpe.mask_id) == (0, 1, 2, 3, 4)
    assert bpe.vocab_size == 1200 and tokenization.load(bpe.path.parent).path == bpe.path  # a directory finds it
    assert bpe.unk_id not in bpe.encode(" ".join(HELD_OUT))  # every byte is in the alphabet


def test_bpe_tokenizes_as_transformers_fast_tokenizer_does(bpe):
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bpe.path),
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    for text in HELD_OUT:
        assert theirs(text)["input_ids"] == [bpe.cls_id, *bpe.encode(text), bpe.sep_id], text
    pair = theirs(HELD_OUT[0], HELD_OUT[1])
    assert pair["input_ids"] == [bpe.cls_id, *bpe.encode(HELD_OUT[0]), bpe.sep_id, *bpe.encode(HELD_OUT[1]), bpe.sep_id]
    assert bpe.encode("The Code") != bpe.encode("the code")  # cased, as RoBERTa's and ModernBERT's


def test_the_cli_trains_a_cased_bpe_unless_told_and_its_mask_takes_the_space_before_it(tmp_path):
    (tmp_path / "corpus.txt").write_text(
        "\n\n".join(
            f"The module {w} installs packages from the index.\nThen it builds the {w} wheel."
            for w in ("pip", "venv", "Tk")
        )
        * 20
    )
    casing = {}
    for name, flags in (("default", []), ("lower", ["--do_lower_case"])):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bertjax.tokenizer",
                f"--input_file={tmp_path / 'corpus.txt'}",
                "--vocab_size=300",
                "--model_type=bpe",
                f"--output_dir={tmp_path / name}",
                *flags,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        tok = tokenization.load(tmp_path / name)
        casing[name] = tok.encode("The Module") == tok.encode("the module")
        assert f"do_lower_case={name == 'lower'}" in done.stdout, done.stdout
    assert casing == {"default": False, "lower": True}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "default" / "tokenizer.json"))
    ids = lambda text: fast(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    masked = ids("it installs [MASK] from the index")  # no lone "Ġ" piece before the mask: [MASK] = id 4
    assert masked == ids("it installs") + [4] + ids("from the index"), fast.convert_ids_to_tokens(masked)


def test_word_starts_for_whole_word_masking(bpe):
    pieces = bpe.tokenize("interpreters unbelievably")
    starts = [not bpe.is_continuation_token(p) for p in pieces]
    assert starts[0] and sum(starts) == 2 and len(pieces) > 2, pieces  # two words, more pieces than words
    assert not any(bpe.is_continuation_token(bpe.vocab[i]) for i in bpe.special_ids)


def roberta_tokenizer(path: pathlib.Path) -> tokenizers.Tokenizer:
    """A byte-level BPE with RoBERTa's specials (<s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4) and its template
    (<s> a </s></s> b </s>, one segment), saved at path."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator(
        HELD_OUT * 50,
        tokenizers.trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False
        ),
    )
    tok.post_processor = tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(path))
    return tok


def test_roberta_named_specials_and_a_file_without_them(tmp_path):
    roberta_tokenizer(tmp_path / "roberta.json")
    loaded = tokenization.load(tmp_path / "roberta.json")
    assert (loaded.cls_id, loaded.pad_id, loaded.sep_id, loaded.unk_id, loaded.mask_id) == (0, 1, 2, 3, 4)
    assert loaded.vocab[loaded.mask_id] == "<mask>"
    bare = tokenizers.Tokenizer(tokenizers.models.BPE())
    bare.train_from_iterator(HELD_OUT, tokenizers.trainers.BpeTrainer(vocab_size=100, show_progress=False))
    bare.save(str(tmp_path / "bare.json"))
    with pytest.raises(
        ValueError,
        match=r"bare\.json lacks the special token\(s\) \[PAD\] \[UNK\] \[CLS\] \[SEP\] "
        r"\[MASK\] \(or RoBERTa's",
    ):
        tokenization.load(tmp_path / "bare.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json cannot be read by `tokenizers`"):
        tokenization.load(tmp_path / "broken.json")


def test_a_modernbert_run_on_bpe_exports_a_tokenizer_that_tokenizes_as_it_did(bpe, tmp_path):
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.main",
            "--config=configs/modernbert.py:size=tiny,runlocal",
            f"--workdir={run}",
            "--config.data.corpus=builtin:pydocs",
            "--config.data.dupe_factor=1",
            f"--config.data.vocab_file={bpe.path}",
            "--config.train.num_train_steps=6",
            "--config.eval.every_steps=6",
            "--config.checkpoint.export_hf=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metadata = json.loads((run / "data" / "train" / "metadata.json").read_text())
    assert metadata["vocab_size"] == 1200
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(run / "hf"))
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(run / "hf"))
    assert type(model).__name__ == "ModernBertForMaskedLM" and model.config.vocab_size == 1200
    assert model.config.cls_token_id == bpe.cls_id and hf_tokenizer.mask_token_id == bpe.mask_id
    enc = hf_tokenizer(HELD_OUT, padding=True)
    assert set(enc) == {"input_ids", "attention_mask"}
    for text, ids, mask in zip(HELD_OUT, enc["input_ids"], enc["attention_mask"]):
        assert list(np.asarray(ids)[np.asarray(mask) > 0]) == [bpe.cls_id, *bpe.encode(text), bpe.sep_id]
    # Fine-tuning from that export finds its tokenizer.json (no vocab.txt there) and applies it.
    from bertjax.interop import pretrained

    assert pretrained.vocab_of(str(run / "hf"))[0] == str(run / "hf" / "tokenizer.json")


def test_a_bert_export_with_a_roberta_style_tokenizer_pads_with_its_pad_token(tmp_path):
    import jax
    from flax import linen as nn

    from bertjax.models.bert import model as model_lib
    from bertjax.models.bert import hf as bert_hf

    tok = roberta_tokenizer(tmp_path / "roberta.json")
    config = model_lib.BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=16,
    )
    model = model_lib.BertForPreTraining(config)
    ids = np.zeros((1, 4), np.int32)
    params = nn.meta.unbox(model.init(jax.random.key(0), ids, np.zeros_like(ids), np.ones_like(ids))["params"])
    bert_hf.save_pretrained(str(tmp_path / "hf"), model, params, vocab_file=str(tmp_path / "roberta.json"))
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert saved["pad_token_id"] == hf_tokenizer.pad_token_id == 1  # <pad>; 0 is <s>
    # ... and fine-tunes from that export on pairs, framed as its tokenizer frames them: <s> a </s></s> b </s>.
    import runpy

    from bertjax.jobs import finetune as finetuning

    rows = ["text_a\ttext_b\tlabel"] + [f"{HELD_OUT[3 * (i % 2)]}\t{HELD_OUT[2]}\t{'ab'[i % 2]}" for i in range(16)]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    c = runpy.run_path(str(ROOT / "configs" / "finetune.py"))["get_config"]("size=tiny")
    c.model.scan_layers = False
    c.train.update(init_from=str(tmp_path / "hf"), global_batch_size=8, num_epochs=1.0)
    c.data.update(max_seq_length=16, train_file=str(tmp_path / "pairs.tsv"), eval_file=str(tmp_path / "pairs.tsv"))
    report = finetuning.finetune(c, str(tmp_path / "finetuned"))
    assert 0.0 <= report["accuracy"] <= 1.0, report
    framed = hf_tokenizer(HELD_OUT[0], HELD_OUT[2])["input_ids"]
    assert framed[0] == 0 and framed[-1] == 2 and [2, 2] in [framed[i : i + 2] for i in range(len(framed))]


def test_a_byte_level_bpe_file_without_a_template_frames_inputs_as_bert_does_and_says_so_once(tmp_path, caplog):
    """The file a user brings: `tokenizers.ByteLevelBPETokenizer().save()`, whose post-processor (ByteLevel) adds
    no special tokens. Fine-tuning framed nothing and stopped on an internal error ("not enough values to
    unpack"); it frames [CLS] a [SEP] b [SEP] with the file's own <s> and </s>, and the log says so once."""
    from bertjax.finetuning import readers

    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(
        list(pydocs_lines(every=20)), vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    path = tmp_path / "tokenizer.json"
    trainer.save(str(path))
    assert type(tokenizers.Tokenizer.from_file(str(path)).post_processor).__name__ == "ByteLevel"
    tok = tokenization.load(path)
    with caplog.at_level("WARNING"):
        frame = tok.frame()
        assert tok.frame() == frame
    said = [r.getMessage() for r in caplog.records if "adds no special tokens" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "<s> a </s>" in said[0], said
    s, e = tok.cls_id, tok.sep_id
    assert (s, e, tok.pad_id) == (0, 2, 1)
    a, b = tok.encode(HELD_OUT[0]), tok.encode(HELD_OUT[2])
    arrays, _ = readers.text_features(
        [readers.TextExample(HELD_OUT[0], HELD_OUT[2], None, readers.Source(str(path)))], tok, 64, None
    )
    n = len(a) + len(b) + 3
    assert arrays["input_ids"][0, :n].tolist() == [s, *a, e, *b, e]
    assert arrays["segment_ids"][0, :n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert set(arrays["input_ids"][0, n:].tolist()) == {tok.pad_id}


def test_a_template_tokenizer_json_is_read_off_its_own_encodings(bpe):
    """A TemplateProcessing file (sentence-transformers 6 saves only tokenizer.json): its pair template is read
    from encode(a, b), whose sequence ids say which tokens are text (post_process() loses the first text's)."""
    frame = bpe.frame()
    assert (frame.before, frame.after, frame.between, frame.end) == (
        (bpe.cls_id,),
        (bpe.sep_id,),
        (bpe.sep_id,),
        (bpe.sep_id,),
    )
    assert frame.b_segment == 1
