"""Fine-tuning data (bertjax.finetuning.readers): readers, features against google-research/bert's rules and transformers.

Everything runs on files written here with a small vocab; no JAX compile, no download.
"""

import json

import numpy as np
import pytest

from bertjax.finetuning import readers, squad
from bertjax.data.vocab import tokenization
from bertjax.finetuning.squad import QAExample
from bertjax.finetuning.readers import LabelMap, Source, TextExample, TokenExample

WORDS = (
    "the a cat sat on mat dog ran john lives in new york is big hello world good bad what team won when did they "
    "who denver broncos super bowl 50 play un cafe filler , . ! ? ( ) - ##ed ##s ##aff ##able ##ing ##ly"
).split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(WORDS)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(f"{t}\n" for t in VOCAB), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(vocab_file):
    return tokenization.load(vocab_file, do_lower_case=True)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------------------------------
# Sequence classification: readers
# --------------------------------------------------------------------------------------------------


def test_tsv_csv_jsonl_single_and_pair(tmp_path):
    tsv = write(
        tmp_path / "pair.tsv", 'text_a\ttext_b\tlabel\nThe "cat" sat.\tA dog ran.\tyes\n\nJohn lives.\tHe is.\tno\n'
    )
    csv_ = write(tmp_path / "single.csv", 'text,label\n"Hello, world",pos\nbad dog,neg\n')
    jsonl = write(
        tmp_path / "mixed.jsonl",
        '{"text_a": "hello", "text_b": "world", "label": 1}\n\n{"text_a": "good", "text_b": null, "label": 0}\n',
    )
    pair = readers.read_text_examples(tsv)
    assert pair == [
        TextExample('The "cat" sat.', "A dog ran.", "yes", Source(tsv, 2)),
        TextExample("John lives.", "He is.", "no", Source(tsv, 4)),
    ]
    single = readers.read_text_examples(csv_)
    assert [(e.text_a, e.text_b, e.label, e.source.line) for e in single] == [
        ("Hello, world", None, "pos", 2),
        ("bad dog", None, "neg", 3),
    ]
    js = readers.read_text_examples(jsonl)
    assert [(e.text_a, e.text_b, e.label, e.source.line) for e in js] == [
        ("hello", "world", "1", 1),
        ("good", None, "0", 3),
    ]
    both = readers.read_text_examples(f"{tsv},{csv_}")
    assert len(both) == 4
    glob = readers.read_text_examples(str(tmp_path / "*.tsv"))
    assert glob == pair


def test_glue_files_are_read_by_their_own_column_names(tmp_path):
    """GLUE's SST-2/train.tsv (sentence, label), as the README's fine-tuning example passes it, and QNLI's
    (index, question, sentence, label): no renaming needed."""
    sst2 = write(tmp_path / "sst2_train.tsv", "sentence\tlabel\nhide new secretions \t0\nit 's a charming trip \t1\n")
    assert [(e.text_a, e.text_b, e.label) for e in readers.read_text_examples(sst2)] == [
        ("hide new secretions ", None, "0"),
        ("it 's a charming trip ", None, "1"),
    ]
    qnli = write(tmp_path / "qnli_dev.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tHe did.\tentailment\n")
    assert [(e.text_a, e.text_b, e.label) for e in readers.read_text_examples(qnli)] == [
        ("Who?", "He did.", "entailment")
    ]


def test_regression_and_prediction_files(tmp_path):
    path = write(tmp_path / "sts.tsv", "text_a\ttext_b\tlabel\na\tb\t3.5\nc\td\t-1\n")
    assert [e.label for e in readers.read_text_examples(path, regression=True)] == [3.5, -1.0]
    unlabeled = write(tmp_path / "test.tsv", "text\nthe cat\n")
    assert readers.read_text_examples(unlabeled, require_labels=False)[0].label is None
    with pytest.raises(ValueError, match=r"test\.tsv:1: no column 'label'"):
        readers.read_text_examples(unlabeled)


def test_label_order_is_stable_regardless_of_file_order(tmp_path):
    one = write(tmp_path / "one.tsv", "text\tlabel\na\tneutral\nb\tcontradiction\nc\tentailment\n")
    two = write(tmp_path / "two.tsv", "text\tlabel\nc\tentailment\na\tneutral\nb\tcontradiction\nd\tneutral\n")
    maps = [LabelMap.from_labels(e.label for e in readers.read_text_examples(p)) for p in (one, two)]
    assert maps[0] == maps[1]
    assert maps[0].labels == ("contradiction", "entailment", "neutral")
    assert LabelMap.from_json(json.loads(json.dumps(maps[0].to_json()))) == maps[0]
    with pytest.raises(ValueError, match="not a JSON list of label strings"):
        LabelMap.from_json({"a": 0})


@pytest.mark.parametrize(
    "name, text, kwargs, message",
    [
        ("empty.tsv", "", {}, r"empty\.tsv is empty"),
        ("nocol.tsv", "review\tlabel\nx\ty\n", {}, r"nocol\.tsv:1: no column 'text' or 'text_a'"),
        ("nolabel.csv", "text\nx\n", {}, r"nolabel\.csv:1: no column 'label'"),
        ("fields.tsv", "text\tlabel\na\tb\nc\td\te\n", {}, r"fields\.tsv:3: 3 fields where the header has 2"),
        ("emptylabel.tsv", "text\tlabel\na\t\n", {}, r"emptylabel\.tsv:2: field 'label' is empty"),
        (
            "reg.tsv",
            "text\tlabel\na\t1.0\nb\tgood\n",
            {"regression": True},
            r"reg\.tsv:3: field 'label' is 'good', not a finite number",
        ),
        ("reg.jsonl", '{"text": "a", "label": "nan"}\n', {"regression": True}, r"reg\.jsonl:1: field 'label'"),
        ("badjson.jsonl", '{"text": "a", "label": 1}\n{"text": \n', {}, r"badjson\.jsonl:2: invalid JSON"),
        ("nottext.jsonl", '{"text": 3, "label": 1}\n', {}, r"nottext\.jsonl:1: field 'text' is 3, not a string"),
        ("header.csv", "text,label\n", {}, r"header but no examples"),
        ("quote.csv", 'text,label\n"open quote,1\n', {}, r"quote\.csv:\d+: .*quoting"),
        ("data.txt", "text\tlabel\n", {}, r"data\.txt is not \.tsv, \.csv or \.jsonl"),
        ("latin.tsv", b"text\tlabel\ncaf\xe9\t1\n", {}, r"latin\.tsv:2: byte 0xe9 is not UTF-8"),
    ],
)
def test_bad_text_inputs_name_file_line_and_field(tmp_path, name, text, kwargs, message):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=message):
        readers.read_text_examples(str(path), **kwargs)


def test_missing_files_and_bad_specs(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pattern .*nothing\*\.tsv.* matches no files"):
        readers.read_text_examples(str(tmp_path / "nothing*.tsv"))
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        readers.read_text_examples(str(tmp_path / "gone.tsv"))


def test_unknown_label_names_file_line_label_and_known_ones(tmp_path, tok):
    train = LabelMap.from_labels(["neg", "pos"])
    dev = write(tmp_path / "dev.tsv", "text\tlabel\ngood\tpos\nbad\tneutral\n")
    examples = readers.read_text_examples(dev)
    with pytest.raises(
        ValueError,
        match=r"dev\.tsv:3: label 'neutral' is not one of the 2 known labels "
        r"\['neg', 'pos'\]",
    ):
        readers.text_features(examples, tok, 8, train)


# --------------------------------------------------------------------------------------------------
# Sequence classification: features
# --------------------------------------------------------------------------------------------------


def test_text_features_layout_labels_and_truncation(tok):
    src = Source("x.tsv", 2)
    examples = [
        TextExample("the cat sat", None, "b", src),
        TextExample("john lives in new york", "the dog ran on the mat", "a", src),
        TextExample("hello", "world", "b", src),
    ]
    arrays, truncated = readers.text_features(examples, tok, 10, LabelMap.from_labels(["b", "a"]))
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert arrays["input_ids"][0].tolist() == [2, ids["the"], ids["cat"], ids["sat"], 3, 0, 0, 0, 0, 0]
    assert arrays["input_mask"][0].tolist() == [1] * 5 + [0] * 5
    assert arrays["segment_ids"][0].tolist() == [0] * 10
    # 5 + 6 tokens into 7 by _truncate_seq_pair (pop the longer, b on ties): (5,6)->(5,5)->(5,4)->(4,4)->(4,3).
    assert tok.convert_ids_to_tokens(arrays["input_ids"][1]) == (
        ["[CLS]", "john", "lives", "in", "new", "[SEP]", "the", "dog", "ran", "[SEP]"]
    )
    assert arrays["segment_ids"][1].tolist() == [0] * 6 + [1] * 4
    assert arrays["label"].tolist() == [1, 0, 1] and arrays["label"].dtype == np.int32
    assert all(a.dtype == np.int32 and a.shape == (3, 10) for k, a in arrays.items() if k != "label")
    assert truncated == 1
    _, cut = readers.text_features([TextExample("the cat sat on the mat", None, "a", src)], tok, 5, LabelMap(["a"]))
    assert cut == 1


def test_text_features_regression_and_unlabelled(tok):
    src = Source("x.tsv", 2)
    arrays, _ = readers.text_features([TextExample("a", "b", 0.5, src), TextExample("a", None, 4.0, src)], tok, 6, None)
    assert arrays["label"].dtype == np.float32 and arrays["label"].tolist() == [0.5, 4.0]
    arrays, _ = readers.text_features([TextExample("a", None, None, src)], tok, 6, LabelMap(["x"]))
    assert "label" not in arrays
    with pytest.raises(ValueError, match=r"x\.tsv:7: this example has no label but others do"):
        readers.text_features(
            [TextExample("a", None, "x", src), TextExample("b", None, None, Source("x.tsv", 7))],
            tok,
            6,
            LabelMap(["x"]),
        )
    with pytest.raises(ValueError, match=r"x\.tsv:2: label 'x' is not a number; pass a LabelMap"):
        readers.text_features([TextExample("a", None, "x", src)], tok, 6, None)
    with pytest.raises(ValueError, match="max_seq_length=2 leaves no room"):
        readers.text_features([TextExample("a", None, "x", src)], tok, 2, LabelMap(["x"]))


def test_a_roberta_style_tokenizer_frames_inputs_as_transformers_does(tmp_path):
    """<s> a </s></s> b </s>, one segment, padded with <pad> (id 1): its own template, for every task."""
    transformers = pytest.importorskip("transformers")
    from test_bpe import roberta_tokenizer

    roberta_tokenizer(tmp_path / "tokenizer.json")
    tok = tokenization.load(tmp_path / "tokenizer.json")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), pad_token="<pad>")
    src = Source("x.tsv", 1)
    cases = [("The interpreter reads a file.", None), ("The interpreter reads a file.", "x = [1, 2, 3]")]
    ours, _ = readers.text_features([TextExample(a, b, "x", src) for a, b in cases], tok, 48, LabelMap(["x"]))
    for i, (a, b) in enumerate(cases):
        ref = hf(a, b, max_length=48, padding="max_length", return_token_type_ids=True)
        assert ours["input_ids"][i].tolist() == ref["input_ids"], (a, b)
        assert ours["segment_ids"][i].tolist() == ref["token_type_ids"] == [0] * 48, (a, b)
        assert ours["input_mask"][i].tolist() == ref["attention_mask"], (a, b)
    cut, truncated = readers.text_features([TextExample(*cases[1], "x", src)], tok, 12, LabelMap(["x"]))
    ids = cut["input_ids"][0].tolist()
    assert truncated == 1 and ids[0] == 0 and ids[-1] == 2 and ids.count(2) == 3 and 1 not in ids  # framed, full
    words, _, _ = readers.token_features(
        [TokenExample(["The", "interpreter"], ["O", "O"], src)], tok, 16, LabelMap(["O"])
    )
    row = words["input_ids"][0][words["input_mask"][0] == 1].tolist()
    assert row[0] == 0 and row[-1] == 2 and words["label_weights"][0][[0, len(row) - 1]].tolist() == [0, 0]
    example = QAExample(
        "q0", "Who reads it?", "The interpreter reads a file, then runs its code.", [("The interpreter", 0)], False, src
    )
    arrays, features = squad.qa_features([example], tok, 48, max_query_length=16, training=True)
    ref = hf("Who reads it?", example.context, max_length=48, padding="max_length")["input_ids"]
    assert arrays["input_ids"][0].tolist() == ref
    start, end = arrays["start_positions"][0], arrays["end_positions"][0]
    spans = features[0].token_to_char
    assert example.context[spans[start][0] : spans[end][1]] == "The interpreter"


def test_text_features_match_transformers_bert_tokenizer(vocab_file, tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizer(str(vocab_file), do_lower_case=True)
    src = Source("x.tsv", 1)
    cases = [("Hello, world!", None), ("The Cat sat on the mat.", "A dog ran."), ("Café au lait?", "who won")]
    cases += [
        ("the cat sat on the mat with a dog", "john lives in new york"),  # a longer: only a is cut
        ("hello", "the big dog ran on the mat and the cat sat"),  # b longer: only b is cut
        ("the cat sat on the big mat", "the dog ran on a mat"),
    ]  # both cut, even room
    for max_len in (13, 16, 32):
        examples = [TextExample(a, b, "x", src) for a, b in cases]
        ours, _ = readers.text_features(examples, tok, max_len, LabelMap(["x"]))
        for i, (a, b) in enumerate(cases):
            ref = hf(a, b, truncation="longest_first", max_length=max_len, padding="max_length")
            assert ours["input_ids"][i].tolist() == ref["input_ids"], (a, b, max_len)
            assert ours["segment_ids"][i].tolist() == ref["token_type_ids"], (a, b, max_len)
            assert ours["input_mask"][i].tolist() == ref["attention_mask"], (a, b, max_len)
    # Where the two rules part: both texts longer than half of an odd budget. google-research/bert (followed here)
    # gives the spare token to text_a, transformers to the text that was longer (here text_b).
    a, b = "the cat sat on the big mat", "the dog ran on a mat the cat"
    ours, _ = readers.text_features([TextExample(a, b, "x", src)], tok, 14, LabelMap(["x"]))
    assert tok.convert_ids_to_tokens(ours["input_ids"][0]) == (
        ["[CLS]", "the", "cat", "sat", "on", "the", "big", "[SEP]", "the", "dog", "ran", "on", "a", "[SEP]"]
    )
    assert hf(a, b, truncation="longest_first", max_length=14)["input_ids"] != ours["input_ids"][0].tolist()


# --------------------------------------------------------------------------------------------------
# TFDS
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory) -> str:
    tfds = pytest.importorskip("tensorflow_datasets")

    class BertjaxTasksTestSet(tfds.core.GeneratorBasedBuilder):
        """A GLUE-like pair task made up here; nothing is downloaded."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "sentence1": tfds.features.Text(),
                        "sentence2": tfds.features.Text(),
                        "label": tfds.features.ClassLabel(names=["not_equivalent", "equivalent"]),
                        "idx": np.int32,
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {
                "train": self._generate_examples(3, labelled=True),
                "test": self._generate_examples(2, labelled=False),
            }

        def _generate_examples(self, n, labelled):
            for i in range(n):
                yield (
                    i,
                    {
                        "sentence1": f"first {i}",
                        "sentence2": f"second {i}",
                        "label": i % 2 if labelled else -1,
                        "idx": i,
                    },
                )

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    BertjaxTasksTestSet(data_dir=data_dir).download_and_prepare()
    return data_dir


def test_tfds_reader_maps_glue_features(tfds_dir):
    examples = readers.read_text_examples(f"tfds:bertjax_tasks_test_set:train:{tfds_dir}")
    assert sorted((e.text_a, e.text_b, e.label) for e in examples) == [
        ("first 0", "second 0", "not_equivalent"),
        ("first 1", "second 1", "equivalent"),
        ("first 2", "second 2", "not_equivalent"),
    ]
    assert str(examples[0].source) == "tfds:bertjax_tasks_test_set:train at example 0"
    sliced = readers.read_text_examples(f"tfds:bertjax_tasks_test_set:train[:2]:{tfds_dir}")
    assert len(sliced) == 2
    test = readers.read_text_examples(f"tfds:bertjax_tasks_test_set:test:{tfds_dir}", require_labels=False)
    assert [e.label for e in test] == [None, None]
    with pytest.raises(ValueError, match=r"tfds:bertjax_tasks_test_set:test at example 0: field 'label' is empty"):
        readers.read_text_examples(f"tfds:bertjax_tasks_test_set:test:{tfds_dir}")
    with pytest.raises(ValueError, match="class label.*not regression"):
        readers.read_text_examples(f"tfds:bertjax_tasks_test_set:train:{tfds_dir}", regression=True)
    with pytest.raises(ValueError, match=r"no split 'dev'"):
        readers.read_text_examples(f"tfds:bertjax_tasks_test_set:dev:{tfds_dir}")
    with pytest.raises(FileNotFoundError, match=r"not_a_dataset_zz.*tfds build"):
        readers.read_text_examples(f"tfds:not_a_dataset_zz:train:{tfds_dir}")


# --------------------------------------------------------------------------------------------------
# Token classification
# --------------------------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

John NNP B-NP B-PER
lives VBZ B-VP O
in IN B-PP O
New NNP B-NP B-LOC
York NNP I-NP I-LOC
. . O O

unaffable JJ B-ADJP O
john NNP B-NP B-PER
-DOCSTART- -X- -X- O
the DT O O
"""


def test_read_conll_sentences_docstart_and_columns(tmp_path):
    path = write(tmp_path / "train.conll", CONLL)
    examples = readers.read_conll(path)
    assert [(e.words, e.labels, e.source.line) for e in examples] == [
        (["John", "lives", "in", "New", "York", "."], ["B-PER", "O", "O", "B-LOC", "I-LOC", "O"], 3),
        (["unaffable", "john"], ["O", "B-PER"], 10),
        (["the"], ["O"], 13),
    ]
    two = write(tmp_path / "two.txt", "EU\tB-ORG\nrejects\tO\n\n\nGerman B-MISC\n")
    assert [(e.words, e.labels) for e in readers.read_conll(two)] == [
        (["EU", "rejects"], ["B-ORG", "O"]),
        (["German"], ["B-MISC"]),
    ]


def test_read_conll_malformed_and_empty(tmp_path):
    with pytest.raises(ValueError, match=r"bad\.conll:3: one column 'York'"):
        readers.read_conll(write(tmp_path / "bad.conll", "New B-LOC\n\nYork\n"))
    with pytest.raises(ValueError, match=r"blank\.conll holds no sentences"):
        readers.read_conll(write(tmp_path / "blank.conll", "-DOCSTART- O\n\n\n"))


def test_token_features_label_first_piece_only(tmp_path, tok):
    examples = readers.read_conll(write(tmp_path / "train.conll", CONLL))
    label_map = LabelMap.from_labels(label for e in examples for label in e.labels)
    assert label_map.labels == ("B-LOC", "B-PER", "I-LOC", "O")
    arrays, starts, truncated = readers.token_features(examples, tok, 8, label_map)
    pieces = [tok.convert_ids_to_tokens(row) for row in arrays["input_ids"]]
    # Sentence 2: "unaffable" is three pieces; its label O on "un" only, the ## pieces weighted 0.
    assert pieces[1][:6] == ["[CLS]", "un", "##aff", "##able", "john", "[SEP]"]
    assert arrays["label_ids"][1].tolist() == [0, 3, 0, 0, 1, 0, 0, 0]
    assert arrays["label_weights"][1].tolist() == [0, 1, 0, 0, 1, 0, 0, 0]
    assert arrays["input_mask"][1].tolist() == [1] * 6 + [0] * 2
    assert starts[1].tolist() == [1, 4]
    # Sentence 1 has 6 one-piece words; 8 positions hold 6 of them, so nothing is cut ... "new york" are 2 words.
    assert pieces[0] == ["[CLS]", "john", "lives", "in", "new", "york", ".", "[SEP]"]
    assert arrays["label_ids"][0].tolist() == [0, 1, 3, 3, 0, 2, 3, 0]
    assert arrays["label_weights"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 0]
    assert truncated == 0
    assert arrays["label_weights"].dtype == np.float32 and arrays["label_ids"].dtype == np.int32
    assert not arrays["segment_ids"].any()
    # Truncation: 5 positions leave room for 3 pieces; words that do not fit map to -1.
    arrays, starts, truncated = readers.token_features(examples, tok, 5, label_map)
    assert starts[0].tolist() == [1, 2, 3, -1, -1, -1]
    assert starts[1].tolist() == [1, -1]
    assert arrays["label_weights"][1].tolist() == [0, 1, 0, 0, 0]
    assert truncated == 2
    # A word cut inside keeps its first pieces, and so its label.
    arrays, starts, truncated = readers.token_features(examples[1:2], tok, 4, label_map)
    assert tok.convert_ids_to_tokens(arrays["input_ids"][0]) == ["[CLS]", "un", "##aff", "[SEP]"]
    assert starts[0].tolist() == [1, -1] and arrays["label_weights"][0].tolist() == [0, 1, 0, 0] and truncated == 1


def test_token_features_empty_word_and_unknown_label(tmp_path, tok):
    src = Source("t.conll", 4)
    arrays, starts, _ = readers.token_features(
        [TokenExample(["the", "\u200b", "cat"], ["O", "X", "O"], src)], tok, 8, LabelMap(["O", "X"])
    )
    assert tok.convert_ids_to_tokens(arrays["input_ids"][0][:5]) == ["[CLS]", "the", "[UNK]", "cat", "[SEP]"]
    assert arrays["label_ids"][0][:5].tolist() == [0, 0, 1, 0, 0] and starts[0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"t\.conll:5: label 'B-ORG' is not one of the 1 known labels \['O'\]"):
        readers.token_features([TokenExample(["a", "b"], ["O", "B-ORG"], src)], tok, 8, LabelMap(["O"]))
