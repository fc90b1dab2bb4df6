"""Small GLUE folders in each task's exact official layout (download_glue_data.py's files), and the same rows
as TFDS glue/* datasets built locally: what tests/test_glue.py reads and runs the suite on.

Texts use the tiny test vocab (test_finetune.WORDS); a label follows from the words ("good" → positive, "bad"
→ negative; MNLI: good → entailment, bad → contradiction, neither → neutral) so a tiny model can learn it.
"""

from __future__ import annotations

import pathlib
import random

NEUTRAL = ["the", "a", "film", "plot", "was", "very", "actor"]


def sentence(rng: random.Random, key: str | None) -> str:
    words = [rng.choice(NEUTRAL) for _ in range(4)]
    if key:
        words.insert(rng.randrange(5), key)
    return " ".join(words)


def labelled(rng: random.Random, task: str) -> tuple[str, str | None, str]:
    """(text_a, text_b, GLUE label string) for one row of `task`."""
    if task == "mnli":
        label = rng.choice(["entailment", "contradiction", "neutral"])
        key = {"entailment": "good", "contradiction": "bad", "neutral": None}[label]
        return sentence(rng, None), sentence(rng, key), label
    if task == "stsb":
        k = rng.randrange(1, 6)  # the score grows with the count of "good"
        return "the film", " ".join(["good"] * k), f"{(k - 1) * 1.25:.3f}"
    good = rng.random() < 0.5
    text = sentence(rng, "good" if good else "bad")
    if task in ("qnli", "rte"):
        return sentence(rng, None), text, "entailment" if good else "not_entailment"
    if task in ("mrpc", "qqp", "wnli"):
        return sentence(rng, None), text, "1" if good else "0"
    return text, None, "1" if good else "0"  # cola, sst2


def _rows(task: str, split: str, rng: random.Random, n: int) -> list[str]:
    """The rows of one official file, header first (CoLA's train/dev have none)."""
    test = split.startswith("test") or task == "ax"
    rows = []
    for i in range(n):
        a, b, label = labelled(rng, "mnli" if task == "ax" else task)
        if task == "cola":
            rows.append(f"{i}\t{a}" if test else f"gj04\t{label}\t{'' if label == '1' else '*'}\t{a}")
        elif task == "sst2":
            rows.append(f"{i}\t{a}" if test else f"{a}\t{label}")
        elif task == "mrpc":
            rows.append(f"{i}\t{100 + i}\t{200 + i}\t{a}\t{b}" if test else f"{label}\t{100 + i}\t{200 + i}\t{a}\t{b}")
        elif task == "stsb":
            rows.append(
                f"{i}\tmain-news\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}" + ("" if test else f"\t{label}")
            )
        elif task == "qqp":
            rows.append(f"{i}\t{a}\t{b}" if test else f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{label}")
        elif task == "mnli":
            labels = "" if test else ("\t" + "\t".join([label] * (1 if split == "train" else 5))) + f"\t{label}"
            rows.append(f"{i}\t{i}\t{i}n\tfiction\t( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})\t{a}\t{b}{labels}")
        else:  # qnli, rte, wnli, ax
            rows.append(f"{i}\t{a}\t{b}" + ("" if test else f"\t{label}"))
    headers = {
        "cola": "index\tsentence" if test else None,
        "sst2": "index\tsentence" if test else "sentence\tlabel",
        "mrpc": ("index" if test else "\ufeffQuality") + "\t#1 ID\t#2 ID\t#1 String\t#2 String",
        "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
        + ("" if test else "\tscore"),
        "qqp": "id\tquestion1\tquestion2" if test else "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2"
        + ("" if test else "\tlabel1" if split == "train" else "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5")
        + ("" if test else "\tgold_label"),
        "qnli": "index\tquestion\tsentence" + ("" if test else "\tlabel"),
    }
    header = headers.get(task, "index\tsentence1\tsentence2" + ("" if test else "\tlabel"))
    return ([header] if header else []) + rows


FOLDERS = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}


def write_glue(root: pathlib.Path, tasks=tuple(FOLDERS), train: int = 32, dev: int = 12, test: int = 7) -> pathlib.Path:
    """GLUE folders under root for `tasks` (and diagnostic/diagnostic.tsv), seeded per task and split."""
    for task in tasks:
        folder = root / FOLDERS[task]
        folder.mkdir(parents=True, exist_ok=True)
        splits = (
            {
                "train": train,
                "dev_matched": dev,
                "dev_mismatched": dev,
                "test_matched": test,
                "test_mismatched": test + 1,
            }
            if task == "mnli"
            else {"train": train, "dev": dev, "test": test}
        )
        for split, n in splits.items():
            rng = random.Random(f"{task}/{split}")
            (folder / f"{split}.tsv").write_text("\n".join(_rows(task, split, rng, n)) + "\n", encoding="utf-8")
    (root / "diagnostic").mkdir(parents=True, exist_ok=True)
    (root / "diagnostic" / "diagnostic.tsv").write_text("\n".join(_rows("ax", "test", random.Random("ax"), 5)) + "\n")
    return root


def build_tfds(data_dir: pathlib.Path, glue_dir: pathlib.Path, configs: tuple[str, ...]) -> None:
    """TFDS's own glue/* builder, its rows read from our official-layout files instead of downloads (MRPC
    too: tfds normally rebuilds it from the raw MSR files), prepared into data_dir."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.text import glue as tfds_glue

    class Glue(tfds_glue.Glue, skip_registration=True):
        name = "glue"

        def _split_generators(self, dl_manager):
            cfg = self.builder_config.name
            folder = glue_dir / ("diagnostic" if cfg == "ax" else FOLDERS[cfg])
            if cfg == "ax":
                files = {"test": folder / "diagnostic.tsv"}
            elif cfg == "mnli":
                files = {
                    "train": folder / "train.tsv",
                    "validation_matched": folder / "dev_matched.tsv",
                    "validation_mismatched": folder / "dev_mismatched.tsv",
                    "test_matched": folder / "test_matched.tsv",
                    "test_mismatched": folder / "test_mismatched.tsv",
                }
            else:
                files = {"train": folder / "train.tsv", "validation": folder / "dev.tsv", "test": folder / "test.tsv"}
            return [
                tfds.core.SplitGenerator(name=split, gen_kwargs={"path": str(path), "split": split})
                for split, path in files.items()
            ]

        def _generate_examples(self, path, split):
            if self.builder_config.name != "mrpc":
                yield from super()._generate_examples(path, "test" if split.startswith("test") else split)
                return
            import csv

            with open(path, encoding="utf-8-sig") as f:
                for n, row in enumerate(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)):
                    yield (
                        n,
                        {
                            "sentence1": row["#1 String"],
                            "sentence2": row["#2 String"],
                            "idx": n,
                            "label": int(row["Quality"]) if "Quality" in row else -1,
                        },
                    )

    for cfg in configs:
        Glue(config=cfg, data_dir=str(data_dir)).download_and_prepare(
            download_config=tfds.download.DownloadConfig(num_shards=1)
        )
