"""Fine-tuning data: readers and feature conversion for classification and token classification (NER);
SQuAD question answering is squad.py, on the shared pieces here (Source, special tokens, padding).

Features follow google-research/bert (run_classifier.py, run_squad.py) so that scores compare with the paper's: the
same [CLS]/[SEP] layout, longest-first pair truncation, strided QA windows with max-context scoring. Every example
keeps its `Source` (file and line), so a bad row is reported where the user can find it, and whatever is truncated or
skipped is counted and returned, never dropped silently. Pure Python and numpy: no JAX, TensorFlow only for TFDS.

    examples = read_text_examples("glue/mrpc/train.tsv")              # or "tfds:glue/mrpc:train"
    label_map = LabelMap.from_labels(e.label for e in examples)
    arrays, truncated = text_features(examples, tokenizer, 128, label_map)
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

import numpy as np

from bertjax.runtime import files
from bertjax.data.corpus.sources import expand_patterns
from bertjax.data.vocab.tokenization import UNK, Tokenizer

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Source:
    """Where an example came from: file and 1-based line (0 = not line-based), plus a JSON path or record index."""

    file: str
    line: int = 0
    path: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where} at {self.path}" if self.path else where


# ----------------------------------------------------------------------------------------------------- shared


def _check_length(max_seq_length: int, least: int) -> None:
    if max_seq_length < least:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for text beside the special tokens; set "
            f"max_seq_length to at least {least}."
        )


def pad_to(ids: list[int], length: int, value: int) -> list[int]:
    return ids + [value] * (length - len(ids))


def pieces_of(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[str]]:
    """Pieces of many texts in one batched engine call (per-word calls dominate NER and SQuAD conversion)."""
    return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer.encode_batch(list(texts))] if texts else []


def read_text(path: str) -> str:
    """A whole UTF-8 file (a BOM dropped); a decoding error names the file, line and byte."""
    with files.open_file(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: byte {data[e.start]:#04x} is not UTF-8; save the file as UTF-8.") from None


class LabelMap:
    """Labels ↔ ids in one stable order (sorted by str), so ids never depend on file order; saved with the model."""

    def __init__(self, labels: Sequence[str]):
        labels = tuple(labels)
        if not labels:
            raise ValueError("A label map needs at least one label; the training data has none.")
        if len(set(labels)) != len(labels):
            raise ValueError(f"A label map lists a label twice ({list(labels)}); each label needs one id.")
        self.labels: tuple[str, ...] = labels
        self._ids = {label: i for i, label in enumerate(labels)}

    @classmethod
    def from_labels(cls, labels: Iterable[Any]) -> "LabelMap":
        return cls(sorted({str(label) for label in labels if label is not None}))

    def id(self, label: Any, source: Source | str = "") -> int:
        try:
            return self._ids[str(label)]
        except KeyError:
            raise ValueError(
                f"{source}: label {str(label)!r} is not one of the {len(self.labels)} known labels "
                f"{list(self.labels)}; fix the label or train with data that has it."
            ) from None

    def label(self, index: int) -> str:
        return self.labels[index]

    def __len__(self) -> int:
        return len(self.labels)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelMap) and other.labels == self.labels

    def __repr__(self) -> str:
        return f"LabelMap({list(self.labels)})"

    def to_json(self) -> list[str]:
        return list(self.labels)

    @classmethod
    def from_json(cls, data: Any, where: str = "label map") -> "LabelMap":
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise ValueError(
                f"{where} is not a JSON list of label strings ({data!r:.80}); save it with LabelMap.to_json()."
            )
        return cls(data)


# ----------------------------------------------------------------------------------------- sequence classification


@dataclasses.dataclass(frozen=True)
class TextExample:
    text_a: str
    text_b: Optional[str]
    label: Union[str, float, None]
    source: Source


def _label_value(value: Any, source: Source, regression: bool, require_labels: bool) -> Union[str, float, None]:
    if value is None or (isinstance(value, str) and not value.strip()):
        if require_labels:
            raise ValueError(f"{source}: field 'label' is empty; give every training/eval example a label.")
        return None
    if regression:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(
                f"{source}: field 'label' is {value!r}, not a finite number; a regression task needs "
                "numeric labels (or configure a classification task)."
            )
        return number
    if isinstance(value, (dict, list)):
        raise ValueError(f"{source}: field 'label' is {value!r:.60}; a label is one string or number.")
    return str(value).strip() if isinstance(value, str) else str(value)


def _text_columns(columns: Sequence[str], source: Source) -> tuple[str, Optional[str]]:
    """text_a or text (with text_b for pairs), else GLUE's own column names (SST-2's `sentence`, QNLI's
    `question`/`sentence`, RTE's `sentence1`/`sentence2`, …), pairs first."""
    text_a = "text_a" if "text_a" in columns else "text" if "text" in columns else None
    if text_a is not None:
        return text_a, ("text_b" if "text_b" in columns else None)
    for a, b in TFDS_TEXT_FEATURES:
        if a in columns and (b is None or b in columns):
            return a, b
    raise ValueError(
        f"{source}: no column 'text' or 'text_a' (found {list(columns)}); name the text column "
        "text (or text_a, with text_b for pairs)."
    )


def _read_delimited(path: str, text: str, delimiter: str, regression: bool, require_labels: bool) -> list[TextExample]:
    """TSV (no quoting, as GLUE's files and bert's _read_tsv) or CSV (quoted fields) with a header row."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    examples: list[TextExample] = []
    header: Optional[list[str]] = None
    line = 1
    try:
        for row in reader:
            source, line = Source(path, line), reader.line_num + 1
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line is no example
            if header is None:
                header = [c.strip() for c in row]
                a, b = _text_columns(header, source)
                if require_labels and "label" not in header:
                    raise ValueError(
                        f"{source}: no column 'label' in the header {header}; add a label column "
                        "(prediction-only files may omit it)."
                    )
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{source}: {len(row)} fields where the header has {len(header)} ({header}); "
                    f"quote or remove the extra {'tab' if delimiter == chr(9) else 'comma'}s in this row."
                )
            fields = dict(zip(header, row))
            examples.append(
                TextExample(
                    fields[a],
                    fields[b] if b else None,
                    _label_value(fields.get("label"), source, regression, require_labels and "label" in header),
                    source,
                )
            )
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: {e}; fix the quoting of this row.") from None
    if header is None:
        raise ValueError(f"{path} is empty; it needs a header (text or text_a[, text_b], label) and rows.")
    return examples


def _read_jsonl(path: str, text: str, regression: bool, require_labels: bool) -> list[TextExample]:
    examples = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        source = Source(path, number)
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{source}: invalid JSON ({e.msg} at column {e.colno}); write one object per line."
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{source}: a JSON {type(row).__name__}, not an object with text/text_a and label.")
        a, b = _text_columns(list(row), source)
        for key in (a, b):
            if key and row[key] is not None and not isinstance(row[key], str):
                raise ValueError(f"{source}: field {key!r} is {row[key]!r:.60}, not a string; quote the text.")
        if row[a] is None:
            raise ValueError(f"{source}: field {a!r} is null; give the example its text.")
        if require_labels and "label" not in row:
            raise ValueError(f"{source}: no field 'label'; give every training/eval example a label.")
        examples.append(
            TextExample(
                row[a],
                row.get(b) if b else None,
                _label_value(row.get("label"), source, regression, require_labels),
                source,
            )
        )
    if not examples:
        raise ValueError(f"{path} is empty; write one JSON object per line with text (or text_a[, text_b]) and label.")
    return examples


def read_text_examples(
    pattern: str, regression: bool = False, require_labels: bool = True, what: str = "data file"
) -> list[TextExample]:
    """Examples from .tsv/.csv/.jsonl files (a path, glob or comma list) or `tfds:NAME:SPLIT[:DATA_DIR]`.

    Files need a header (`text` or `text_a`[, `text_b`], `label`); labels are strings, or floats when `regression`.
    `require_labels=False` reads prediction files: the label column may be missing or empty (label None).
    """
    if pattern.startswith("tfds:"):
        m = re.fullmatch(r"tfds:([^:]+)(?::([^:\[]+(?:\[[^\]]*\])?))?(?::(.+))?", pattern)
        if not m:
            raise ValueError(
                f"{what} {pattern!r} is not tfds:NAME[/CONFIG][:SPLIT[:DATA_DIR]]; e.g. tfds:glue/sst2:train."
            )
        return read_tfds_text_examples(
            m[1], m[2] or "train", m[3], regression=regression, require_labels=require_labels
        )
    examples: list[TextExample] = []
    for path in expand_patterns(pattern, what=what):
        suffix = path.lower().rsplit(".", 1)[-1]
        if suffix not in ("tsv", "csv", "jsonl"):
            raise ValueError(f"{what} {path} is not .tsv, .csv or .jsonl; rename it to the format it holds.")
        text = read_text(path)
        if suffix == "jsonl":
            examples += _read_jsonl(path, text, regression, require_labels)
        else:
            examples += _read_delimited(path, text, "\t" if suffix == "tsv" else ",", regression, require_labels)
    if not examples:
        raise ValueError(f"{what} {pattern!r} holds a header but no examples; add rows.")
    return examples


# TFDS feature names of the text fields, pairs first (GLUE, SuperGLUE's BoolQ, IMDB and similar).
TFDS_TEXT_FEATURES = (
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("question", "passage"),
    ("text_a", "text_b"),
    ("sentence", None),
    ("text", None),
    ("text_a", None),
)


def read_tfds_text_examples(
    name: str,
    split: str = "train",
    data_dir: Optional[str] = None,
    regression: bool = False,
    require_labels: bool = True,
    text_features: Optional[tuple[str, Optional[str]]] = None,
    label_feature: str = "label",
) -> list[TextExample]:
    """A prepared TFDS split as examples; ClassLabel ids become their names, -1 (GLUE's test splits) no label."""
    import tensorflow_datasets as tfds  # Deferred: heavy, and only this reader needs it.

    where = f"data_dir {data_dir!r}" if data_dir else "the default TFDS data_dir"
    fix = f"run `tfds build {name.split('/')[0]} --data_dir=DIR` and pass tfds:{name}:{split}:DIR."
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise FileNotFoundError(f"TFDS dataset {name!r} is neither registered nor prepared in {where}: {fix}") from None
    if not builder.is_prepared():
        raise FileNotFoundError(f"TFDS dataset {name!r} is not prepared in {where}: {fix}")
    features = builder.info.features
    if split.split("[", 1)[0] not in builder.info.splits:
        raise ValueError(f"TFDS dataset {name!r} has no split {split!r}: use one of {sorted(builder.info.splits)}.")
    if text_features is None:
        text_features = next(
            (pair for pair in TFDS_TEXT_FEATURES if pair[0] in features and (pair[1] is None or pair[1] in features)),
            None,
        )
    if text_features is None or any(k and k not in features for k in text_features):
        raise ValueError(
            f"TFDS dataset {name!r} has features {sorted(features)}, none of the text features known "
            f"here {text_features or TFDS_TEXT_FEATURES}; pass text_features=(A, B or None)."
        )
    has_label = label_feature in features
    if require_labels and not has_label:
        raise ValueError(
            f"TFDS dataset {name!r} has no feature {label_feature!r} (features {sorted(features)}); "
            "pass label_feature=NAME."
        )
    names = getattr(features[label_feature], "names", None) if has_label else None
    if regression and names:
        raise ValueError(
            f"TFDS dataset {name!r}: feature {label_feature!r} is a class label ({names}); configure a "
            "classification task, not regression."
        )
    a, b = text_features
    examples = []
    for index, row in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
        source = Source(f"tfds:{name}:{split}", 0, f"example {index}")
        texts = [row[k].decode("utf-8", errors="replace") if k else None for k in (a, b)]
        value = row[label_feature].item() if has_label else None
        if names is not None:
            value = None if value < 0 else names[value]
        examples.append(
            TextExample(texts[0], texts[1], _label_value(value, source, regression, require_labels), source)
        )
    if not examples:
        raise ValueError(f"TFDS split tfds:{name}:{split} is empty; pick a split with examples.")
    return examples


def _truncate_seq_pair(tokens_a: list[Any], tokens_b: list[Any], max_length: int) -> bool:
    """google-research/bert's rule: pop from the longer list (b on ties) until both fit; True if anything was cut."""
    cut = False
    while len(tokens_a) + len(tokens_b) > max_length:
        cut = True
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
    return cut


def text_features(
    examples: Sequence[TextExample], tokenizer: Tokenizer, max_seq_length: int, label_map: Optional[LabelMap]
) -> tuple[Arrays, int]:
    """[CLS] a [SEP] (b [SEP]) as int32 [N, max_seq_length] arrays; returns (arrays, number of examples truncated).

    "label" is int32 ids from `label_map`, or float32 when `label_map` is None (regression); it is left out when no
    example has a label (prediction).
    """
    frame = tokenizer.frame()
    pairs = [ex for ex in examples if ex.text_b is not None]
    _check_length(max_seq_length, (frame.pair_specials if pairs else frame.single_specials) + 1)
    input_ids, segment_ids, input_mask = [], [], []
    truncated = 0
    firsts = tokenizer.encode_batch([ex.text_a for ex in examples]) if examples else []
    seconds = iter(tokenizer.encode_batch([ex.text_b for ex in pairs]) if pairs else [])
    for ex, a in zip(examples, firsts):
        b = next(seconds) if ex.text_b is not None else None
        if b is not None:
            truncated += _truncate_seq_pair(a, b, max_seq_length - frame.pair_specials)
            ids, segments = frame.pair(a, b)
        else:
            if len(a) > max_seq_length - frame.single_specials:
                a, truncated = a[: max_seq_length - frame.single_specials], truncated + 1
            ids = frame.single(a)
            segments = [0] * len(ids)
        input_ids.append(pad_to(ids, max_seq_length, frame.pad_id))
        segment_ids.append(pad_to(segments, max_seq_length, 0))
        input_mask.append(pad_to([1] * len(ids), max_seq_length, 0))
    shape = (len(examples), max_seq_length)
    arrays = {
        k: np.array(v, np.int32).reshape(shape)
        for k, v in (("input_ids", input_ids), ("segment_ids", segment_ids), ("input_mask", input_mask))
    }
    unlabelled = [ex for ex in examples if ex.label is None]
    if unlabelled and len(unlabelled) < len(examples):
        raise ValueError(
            f"{unlabelled[0].source}: this example has no label but others do; label every example "
            "(or none, for prediction)."
        )
    if examples and not unlabelled:
        if label_map is None:
            if not all(isinstance(ex.label, float) for ex in examples):
                bad = next(ex for ex in examples if not isinstance(ex.label, float))
                raise ValueError(
                    f"{bad.source}: label {bad.label!r} is not a number; pass a LabelMap for "
                    "classification, or read the file with regression=True."
                )
            arrays["label"] = np.array([ex.label for ex in examples], np.float32)
        else:
            arrays["label"] = np.array([label_map.id(ex.label, ex.source) for ex in examples], np.int32)
    if truncated:
        log.info(
            "text_features: %d of %d examples truncated to max_seq_length=%d", truncated, len(examples), max_seq_length
        )
    return arrays, truncated


# ------------------------------------------------------------------------------------------ token classification


@dataclasses.dataclass(frozen=True)
class TokenExample:
    """One sentence; word i is on line `source.line + i` of the CoNLL file."""

    words: list[str]
    labels: list[str]
    source: Source


def read_conll(pattern: str, what: str = "data file") -> list[TokenExample]:
    """CoNLL-2003 style: a word per line, columns split on whitespace, word first and label last; blank line between
    sentences; `-DOCSTART-` lines skipped."""
    examples: list[TokenExample] = []
    for path in expand_patterns(pattern, what=what):
        words: list[str] = []
        labels: list[str] = []
        start = 0
        lines = read_text(path).splitlines()
        for number, line in enumerate(lines + [""], 1):
            columns = line.split()
            if not columns or columns[0] == "-DOCSTART-":
                if words:
                    examples.append(TokenExample(words, labels, Source(path, start)))
                    words, labels = [], []
                continue
            if len(columns) < 2:
                raise ValueError(
                    f"{path}:{number}: one column {line.strip()!r:.60}; each line needs the word first "
                    "and its label last, separated by whitespace (or a blank line between sentences)."
                )
            start = start if words else number
            words.append(columns[0])
            labels.append(columns[-1])
        if not any(ex.source.file == path for ex in examples[-1:]):
            raise ValueError(f"{path} holds no sentences; write one 'word label' pair per line.")
    return examples


def token_features(
    examples: Sequence[TokenExample], tokenizer: Tokenizer, max_seq_length: int, label_map: LabelMap
) -> tuple[Arrays, list[np.ndarray], int]:
    """Each word tokenized alone; its label on its first piece, other pieces and specials weighted 0.

    Returns (arrays, per example the token index of each word's first piece or -1 when truncation cut the word,
    number of examples truncated). A word with no pieces (only control characters) becomes [UNK], keeping its label.
    """
    frame = tokenizer.frame()  # the tokenizer's own template around the text
    _check_length(max_seq_length, frame.single_specials + 1)
    rows: dict[str, list[list[Any]]] = {k: [] for k in ("input_ids", "input_mask", "label_ids", "label_weights")}
    word_starts: list[np.ndarray] = []
    truncated = 0
    for ex in examples:
        if len(ex.words) != len(ex.labels):
            raise ValueError(
                f"{ex.source}: {len(ex.words)} words but {len(ex.labels)} labels; give each word one label."
            )
        ids, label_ids, weights = list(frame.before), [0] * len(frame.before), [0.0] * len(frame.before)
        starts = np.full(len(ex.words), -1, np.int32)
        cut = False
        for i, (word, label, pieces) in enumerate(zip(ex.words, ex.labels, pieces_of(tokenizer, ex.words))):
            label_id = label_map.id(label, Source(ex.source.file, ex.source.line + i) if ex.source.line else ex.source)
            pieces = pieces or [UNK]
            room = max_seq_length - len(frame.after) - len(ids)
            if room <= 0 or len(pieces) > room:
                cut = True
            if room <= 0:
                continue
            pieces = pieces[:room]
            starts[i] = len(ids)
            ids += tokenizer.convert_tokens_to_ids(pieces)
            label_ids += [label_id] + [0] * (len(pieces) - 1)
            weights += [1.0] + [0.0] * (len(pieces) - 1)
        truncated += cut
        ids += frame.after
        rows["input_ids"].append(pad_to(ids, max_seq_length, frame.pad_id))
        rows["input_mask"].append(pad_to([1] * len(ids), max_seq_length, 0))
        rows["label_ids"].append(pad_to(label_ids, max_seq_length, 0))
        rows["label_weights"].append(pad_to(weights, max_seq_length, 0.0))
        word_starts.append(starts)
    shape = (len(examples), max_seq_length)
    arrays = {
        "input_ids": np.array(rows["input_ids"], np.int32).reshape(shape),
        "segment_ids": np.zeros(shape, np.int32),
        "input_mask": np.array(rows["input_mask"], np.int32).reshape(shape),
    }
    arrays["label_ids"] = np.array(rows["label_ids"], np.int32).reshape(shape)
    arrays["label_weights"] = np.array(rows["label_weights"], np.float32).reshape(shape)
    if truncated:
        log.info(
            "token_features: %d of %d sentences truncated to max_seq_length=%d (their cut words map to -1)",
            truncated,
            len(examples),
            max_seq_length,
        )
    return arrays, word_starts, truncated
