"""Accent stripping on real Russian, Czech and Japanese text (Debian's translated manual pages): `strip_accents`
keeps every script's letters in the vocab, the records and the export, equal to transformers' BertTokenizer; BERT's
default rule is kept and says once, with counts by script, what it changes."""

import collections
import gzip
import json
import pathlib
import re
import subprocess
import sys
import unicodedata

import pytest

from bertjax.config import schema
from bertjax.data.pretraining import instances as instances_lib
from bertjax.data.pretraining import shards
from bertjax.data.vocab import accents, tokenization, training as vocab_training
from bertjax.jobs import prepare as prepare_job
from bertjax.jobs import stage
from bertjax.models import hf_files
from tests.test_tokenizer import Reference

MAN = pathlib.Path("/usr/share/man")
LANGUAGES = ("ru", "cs", "ja")
TROFF = re.compile(r"\\f[BIRP]|\\\(..|\\[-&e ]|\\\*\(..")


def man_lines(language: str) -> list[str]:
    """The prose of a language's manual pages: troff requests dropped, font and escape codes removed."""
    lines = []
    for page in sorted(MAN.glob(f"{language}/man*/*.gz")):
        for line in gzip.decompress(page.read_bytes()).decode("utf-8", "replace").splitlines():
            if line and not line.startswith((".", "'")):
                text = " ".join(TROFF.sub(" ", line).split())
                if text:
                    lines.append(text)
    return lines


@pytest.fixture(scope="module")
def texts() -> dict[str, list[str]]:
    found = {language: man_lines(language) for language in LANGUAGES}
    missing = [language for language, lines in found.items() if len(lines) < 200]
    if missing:
        pytest.skip(f"Debian's manual pages in {', '.join(missing)} are not installed under {MAN}")
    return found


@pytest.fixture(scope="module")
def vocabs(texts, tmp_path_factory) -> dict:
    """A vocab trained on the three languages with BERT's rule, and one with strip_accents=False; the notes each
    training reported."""
    lines = [line for language in LANGUAGES for line in texts[language]]
    out, notes = {}, {}
    for name, strip in (("bert", None), ("keep", False)):
        notes[name] = []
        out[name] = vocab_training.train_wordpiece(
            lines, 3000, tmp_path_factory.mktemp(name), strip_accents=strip, report=notes[name].append
        )
    return out, notes


def test_strip_accents_false_keeps_the_letters_and_equals_transformers(texts, vocabs):
    (vocab, _) = vocabs
    keep, bert = vocab["keep"], vocab["bert"]
    assert (keep.strip_accents, bert.strip_accents) == (False, True)
    # reloaded from the file alone: tokenizer_config.json beside vocab.txt carries the setting
    assert tokenization.load(keep.path).strip_accents is False
    assert tokenization.load(keep.path.parent).strip_accents is False
    assert "й" in "".join(keep.tokenize("мой край")) and "й" not in "".join(bert.tokenize("мой край"))
    assert keep.tokenize("がぎぐ") != bert.tokenize("がぎぐ")
    assert "č" in "".join(keep.tokenize("Přečtěte")) and "č" not in "".join(bert.tokenize("Přečtěte"))
    for tokenizer, strip in ((keep, False), (bert, None)):
        reference = Reference(tokenizer.path, do_lower_case=True, strip_accents=strip)
        for language in LANGUAGES:
            for line in texts[language][:300]:
                assert tokenizer.tokenize(line) == reference(line), (language, line)


def test_bert_rule_says_once_what_it_changed_by_script(texts, vocabs):
    _, notes = vocabs
    assert notes["keep"] == []  # nothing stripped, nothing said
    (note,) = notes["bert"]
    expected = collections.Counter()
    for language in LANGUAGES:
        for line in texts[language]:
            for word in line.split():  # each character the rule changes, counted by its Unicode name's script
                for c in word:
                    if unicodedata.category(c) == "Mn" or accents.stripped(c.lower()) != c.lower():
                        expected[unicodedata.name(c).split()[0].title()] += 1
    for script in ("Cyrillic", "Latin", "Hiragana", "Katakana"):
        assert expected[script] > 0
        assert f"{script} {expected[script]:,} (" in note, (script, note)
    assert "й→и" in note and "--strip_accents=false" in note


def test_prepare_records_what_was_stripped_and_the_export_tokenizes_as_bertjax(texts, vocabs, tmp_path):
    (vocab, _) = vocabs
    corpus = tmp_path / "corpus.txt"
    lines = [line for language in LANGUAGES for line in texts[language][:400]]
    corpus.write_text("".join(line + ("\n\n" if i % 20 == 19 else "\n") for i, line in enumerate(lines)), "utf-8")
    metadata = {}
    for name in ("bert", "keep"):
        cfg = shards.PrepareConfig(
            input_file=str(corpus),
            output_dir=str(tmp_path / f"records-{name}"),
            vocab_file=str(vocab[name].path),
            instance=instances_lib.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1),
            num_shards=2,
        )
        metadata[name] = prepare_job.prepare(cfg, num_workers=1)
    assert metadata["keep"]["strip_accents"] is False and metadata["keep"]["accents_stripped_by_script"] == {}
    assert "stripping accents" not in prepare_job.summary(metadata["keep"])
    by_script = metadata["bert"]["accents_stripped_by_script"]
    assert by_script["Cyrillic"] > 0 and by_script["Hiragana"] > 0 and by_script["Latin"] > 0
    assert metadata["bert"]["replaced"]["characters_accent_stripped"] == sum(by_script.values())
    assert "prepare: warning: stripping accents" in prepare_job.summary(metadata["bert"])
    assert "prepare: warning: stripping accents" not in prepare_job.summary(metadata["bert"], accents=False)

    from transformers import AutoTokenizer

    for name in ("bert", "keep"):
        hf_dir = tmp_path / f"hf-{name}"
        hf_dir.mkdir()
        hf_files.write_tokenizer(str(hf_dir), str(vocab[name].path), True, 64)
        written = json.loads((hf_dir / "tokenizer_config.json").read_text())
        assert written["strip_accents"] is (name == "bert")
        hf = AutoTokenizer.from_pretrained(str(hf_dir))
        for language in LANGUAGES:
            for line in texts[language][:100]:
                assert hf.tokenize(line) == vocab[name].tokenize(line), (name, language, line)


def test_a_setting_that_disagrees_with_a_given_vocab_is_refused_in_one_sentence(vocabs):
    (vocab, _) = vocabs
    data = schema.DataConfig(vocab_file=str(vocab["bert"].path), strip_accents=False, corpus="builtin:pydocs")
    with pytest.raises(ValueError, match=r"config\.data\.strip_accents=False disagrees with the vocab .*strips"):
        stage.check_strip_accents(data)
    stage.check_strip_accents(schema.DataConfig(vocab_file=str(vocab["keep"].path), strip_accents=False))


def test_the_tokenizer_cli_takes_strip_accents_for_wordpiece_only(tmp_path, texts):
    corpus = tmp_path / "ru.txt"
    corpus.write_text("\n".join(texts["ru"]) + "\n", "utf-8")

    def cli(*flags):
        return subprocess.run(
            [sys.executable, "-m", "bertjax.tokenizer", f"--input_file={corpus}", "--vocab_size=600", *flags],
            capture_output=True,
            text=True,
        )

    done = cli(f"--output_dir={tmp_path / 'wp'}", "--strip_accents=false")
    assert done.returncode == 0, done.stderr
    assert "strip_accents=False" in done.stdout and "warning" not in done.stdout
    assert json.loads((tmp_path / "wp" / "tokenizer_config.json").read_text())["strip_accents"] is False
    refused = cli(f"--output_dir={tmp_path / 'bpe'}", "--model_type=bpe", "--strip_accents")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1].endswith("never strips accents: drop the flag.")
