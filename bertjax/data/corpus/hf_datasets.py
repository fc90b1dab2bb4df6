"""`hf:DIR[:SPLIT]` corpora: a Hugging Face dataset directory resolved, offline, to the files of one split.

    files, split = resolve("hf:fineweb-edu-sample")        # the train split, as `datasets` would pick it
    files, split = resolve("hf:my_dataset:validation")
    files, split = resolve("hf:fineweb-edu:sample-10BT/train")  # a config the README names, then its split

Two layouts, both read by table_corpus.TableSource with pyarrow alone (no `datasets` import):
- what `Dataset.save_to_disk` / `DatasetDict.save_to_disk` write: `state.json` (its `_data_files`, Arrow IPC
  streams, in order) in DIR, or `dataset_dict.json` naming the splits, each in DIR/SPLIT/;
- a dataset repository as the Hub holds it (cloned, or fetched with `hf download`): the files the
  README's YAML `configs:` list for each split when it has one (the config marked `default`, else the one
  named "default", else the only one; `CONFIG/SPLIT` picks another), else the Hub's own conventions: a split is
  named by a directory (`train/`, `data/validation/`) or by a file name's word (`data/train-00000-of-00004.parquet`,
  `test.jsonl.zst`: train|training, validation|valid|val|dev, test|testing|eval|evaluation), and with no
  split named anywhere every data file is `train`.
Data files are Parquet, JSON Lines (.jsonl, .jsonl.gz, .json.gz, .jsonl.zst) and Arrow; the split's files are
in path order, so shards `-00000-of-00004` come in order. DIR is local (for gs://, name the files instead).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from typing import Any

from bertjax.data.corpus import table as table_corpus
from bertjax.runtime.files import is_remote

log = logging.getLogger(__name__)

PREFIX = "hf:"
# The Hub's split keywords (datasets' data_files.py: the words a directory or file name is matched on).
SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_WORD_OF = {word: split for split, words in SPLIT_WORDS.items() for word in words}
_HIDDEN = re.compile(r"(^|/)(\.|__)")  # .git, .cache/huggingface (hf download leaves it), __pycache__


def is_hf_spec(spec: str) -> bool:
    return spec.strip().startswith(PREFIX)


def parse(spec: str) -> tuple[str, str]:
    """`hf:DIR[:SPLIT]` → (DIR, SPLIT or ""). A ':' ends DIR only when what follows it is no path (`gs://`)."""
    rest = spec.strip()[len(PREFIX) :]
    head, sep, tail = rest.rpartition(":")
    if sep and head and not tail.startswith("//"):
        return head, tail
    return rest, ""


def resolve(spec: str, what: str = "--input_file") -> tuple[list[str], str]:
    """The data files of the split `spec` names, and that split's name. One sentence if there are none."""
    root, wanted = parse(spec)
    if not root:
        raise ValueError(f"{what}={spec!r} names no directory: use hf:DIR[:SPLIT].")
    if is_remote(root):
        raise ValueError(
            f"{what}={spec!r}: hf: reads local directories only; name the data files of a remote "
            f"dataset directly, e.g. {root.rstrip('/')}/data/*.parquet."
        )
    if not os.path.isdir(root):
        raise FileNotFoundError(
            f"{what}={spec!r}: {root} is not a directory: point hf: at a dataset directory "
            "(written by save_to_disk, or a dataset repository downloaded from the Hub)."
        )
    if os.path.exists(os.path.join(root, "dataset_dict.json")):
        return _saved_dict(root, wanted, spec, what)
    if os.path.exists(os.path.join(root, "state.json")):
        return _saved_dataset(root, wanted, spec, what), wanted or _saved_split(root) or "train"
    return _hub_layout(root, wanted, spec, what)


def _load_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path} cannot be read as JSON ({e}): the dataset directory is damaged; save or download it again."
        ) from None


def _saved_split(root: str) -> str:
    return _load_json(os.path.join(root, "state.json")).get("_split") or ""


def _saved_dataset(root: str, wanted: str, spec: str, what: str) -> list[str]:
    state = _load_json(os.path.join(root, "state.json"))
    split = state.get("_split") or ""
    if wanted and split and wanted != split:
        raise ValueError(
            f"{what}={spec!r}: {root} holds one saved split, {split!r}, not {wanted!r}: use "
            f"hf:{root} or hf:{root}:{split}."
        )
    names = [entry["filename"] for entry in state.get("_data_files", [])]
    files = [os.path.join(root, name) for name in names]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(
            f"{missing[0]} is missing: {root}/state.json lists it; save or copy the dataset directory again, whole."
        )
    if not files:
        raise ValueError(f"{what}={spec!r}: {root}/state.json lists no data files: save the dataset again.")
    return files


def _saved_dict(root: str, wanted: str, spec: str, what: str) -> tuple[list[str], str]:
    splits = list(_load_json(os.path.join(root, "dataset_dict.json")).get("splits", []))
    split = _pick_split(splits, wanted, spec, what)
    return _saved_dataset(os.path.join(root, split), "", spec, what), split


def _pick_split(splits: list[str], wanted: str, spec: str, what: str) -> str:
    if wanted:
        if wanted not in splits:
            raise ValueError(f"{what}={spec!r}: the dataset has no split {wanted!r}; its splits: {splits}.")
        return wanted
    if "train" in splits:
        return "train"
    if len(splits) == 1:
        return splits[0]
    raise ValueError(f"{what}={spec!r}: the dataset has no train split; name one of its splits {splits}: {spec}:SPLIT.")


def _data_files(root: str, pattern: str = "**/*") -> list[str]:
    """Data files (by extension) under root matching a glob relative to it, hidden folders left out."""
    found = glob.glob(os.path.join(glob.escape(root), pattern), recursive=True)
    files = []
    for path in found:
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if os.path.isfile(path) and table_corpus.is_table_file(path) and not _HIDDEN.search(rel):
            files.append(path)
    return sorted(files)


def _readme_configs(root: str) -> list[dict]:
    """The `configs:` list of the README's YAML header, [] without one."""
    path = os.path.join(root, "README.md")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    match = re.match(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", text, re.S)
    if not match:
        return []
    import yaml  # PyYAML: a dependency of flax

    try:
        header = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as e:
        raise ValueError(
            f"{path}: its YAML header does not parse ({' '.join(str(e).split())}): fix it, or move "
            "the README away to use the Hub's file-name conventions."
        ) from None
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _config_splits(config: dict) -> dict[str, list[str]]:
    """A README config's data_files as {split: [glob, ...]} (a bare glob or list of them is `train`)."""
    data_files = config.get("data_files", [])
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {k: [v] if isinstance(v, str) else list(v) for k, v in data_files.items()}
    splits: dict[str, list[str]] = {}
    for entry in data_files:
        if isinstance(entry, str):
            splits.setdefault("train", []).append(entry)
        elif isinstance(entry, dict):
            paths = entry.get("path", [])
            splits.setdefault(entry.get("split", "train"), []).extend([paths] if isinstance(paths, str) else paths)
    return splits


def _pick_config(configs: list[dict], name: str, root: str, spec: str, what: str) -> dict:
    names = [c.get("config_name", "default") for c in configs]
    if name:
        if name not in names:
            raise ValueError(f"{what}={spec!r}: {root}/README.md names no config {name!r}; its configs: {names}.")
        return configs[names.index(name)]
    marked = [c for c in configs if c.get("default")]
    if marked:
        return marked[0]
    if "default" in names:
        return configs[names.index("default")]
    if len(configs) == 1:
        return configs[0]
    raise ValueError(
        f"{what}={spec!r}: {root}/README.md names several configs and none is the default: pick one "
        f"of {names}, as hf:{root}:CONFIG/SPLIT."
    )


def _hub_layout(root: str, wanted: str, spec: str, what: str) -> tuple[list[str], str]:
    config_name, _, wanted = wanted.rpartition("/")
    configs = _readme_configs(root)
    if configs:
        names = [c.get("config_name", "default") for c in configs]
        if not config_name and wanted in names and wanted not in SPLIT_WORDS:  # hf:DIR:CONFIG, its train split
            config_name, wanted = wanted, ""
        config = _pick_config(configs, config_name, root, spec, what)
        patterns = _config_splits(config)
        split = _pick_split(list(patterns), wanted, spec, what)
        files = sorted({f for pattern in patterns[split] for f in _data_files(root, pattern)})
        if not files:
            with_files = [
                c.get("config_name", "default")
                for c in configs
                if any(_data_files(root, p) for ps in _config_splits(c).values() for p in ps)
            ]
            raise FileNotFoundError(
                f"{what}={spec!r}: {root}/README.md's config {config.get('config_name', 'default')!r} lists "
                f"{patterns[split]} for split {split!r}, which match no data file here"
                + (
                    f"; configs with files here: {with_files} (pick one as hf:{root}:CONFIG/{split})"
                    if with_files
                    else ": download those files, or point hf: at the directory that holds them"
                )
                + "."
            )
        return files, split
    if config_name:
        raise ValueError(
            f"{what}={spec!r}: {root} has no README.md with configs, so {config_name!r} names no "
            "config: use hf:DIR[:SPLIT]."
        )
    files = _data_files(root)
    if not files:
        raise FileNotFoundError(
            f"{what}={spec!r}: {root} holds no data files (Parquet, JSON Lines "
            f"{', '.join(table_corpus.JSONL_SUFFIXES)}, or the .arrow files save_to_disk writes): "
            "download the dataset's data files into it, or point hf: at the directory that "
            "holds them."
        )
    by_split: dict[str, list[str]] = {}
    unnamed = []
    for path in files:
        split = _split_of(os.path.relpath(path, root))
        if split:
            by_split.setdefault(split, []).append(path)
        else:
            unnamed.append(path)
    if not by_split:  # no split named anywhere: all of it is train, as on the Hub
        by_split = {"train": files}
    elif unnamed:
        log.warning(
            "%s: %d data file(s) name no split (e.g. %s) and are left out, as the Hub leaves them out",
            spec,
            len(unnamed),
            unnamed[0],
        )
    split = _pick_split(list(by_split), wanted, spec, what)
    return by_split[split], split


def _split_of(rel_path: str) -> str:
    """The split a data file's path names: its directories first (train/, data/validation/), then its file
    name's words (delimited by - . _ space or digits); "" if none."""
    parts = rel_path.replace(os.sep, "/").split("/")
    for part in parts[:-1]:
        if part.lower() in _WORD_OF:
            return _WORD_OF[part.lower()]
    for word in re.split(r"[-._ 0-9]+", parts[-1].lower()):
        if word in _WORD_OF:
            return _WORD_OF[word]
    return ""
