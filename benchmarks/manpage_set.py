"""A retrieval set from this machine's English manual pages (Debian's /usr/share/man/man1..8): text nobody here
wrote, with queries and documents from different parts of each page, written for different readers.

- query: the page's NAME line after its dash, the one-line summary `apropos` searches ("passwd - change user
  password" → "change user password"); the page's name is not in it;
- document: the page's DESCRIPTION section (its first `max_words` words), titled with the page's name, the
  relevant document of the page's own query and a distractor for every other query.

Pages are split, not pairs: a test page's summary is never a training query and its description never a training
positive; the test corpus holds every page's description (training pages' too, as MS MARCO's corpus holds its
training passages). Left out: gcloud's 16,631 generated pages (one template, they would be most of the set),
pages without exactly one " - " in NAME (several names), summaries under three words, descriptions under twenty,
and summaries or descriptions that two pages share (a query with two right answers, or two identical documents).

    python benchmarks/manpage_set.py --out=DIR [--test_queries=400] [--max_pages=0]

writes DIR/train.jsonl (pairs for `bertjax.finetune`), DIR/beir/ (corpus.jsonl, queries.jsonl, qrels/test.tsv)
and DIR/set.json (the counts and each split's pages). Pages are rendered by groff, as `man` renders them.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import glob
import gzip
import json
import os
import pathlib
import random
import re
import subprocess

MAN_GLOB = "/usr/share/man/man[1-8]/*.gz"  # English: the translations live in /usr/share/man/<lang>/
EXCLUDED_PREFIXES = ("gcloud",)
SECTION = re.compile(r"^[A-Z][A-Z0-9 ,/&()'-]*$")  # a heading: upper case at column 0


class Page:
    __slots__ = ("name", "summary", "description")

    def __init__(self, name: str, summary: str, description: str):
        self.name, self.summary, self.description = name, summary, description


def page_files(max_pages: int = 0, seed: int = 0) -> list[str]:
    """The English pages that are files (a symlink is another name of a page), gcloud's left out; `max_pages` > 0
    draws that many (seeded), for a quick set."""
    paths = sorted(
        p
        for p in glob.glob(MAN_GLOB)
        if not os.path.islink(p) and not os.path.basename(p).startswith(EXCLUDED_PREFIXES)
    )
    if max_pages and len(paths) > max_pages:
        paths = sorted(random.Random(seed).sample(paths, max_pages))
    return paths


def render(path: str) -> str:
    """The page as `man` shows it, one line a paragraph (no line length, no hyphenation, no bold or underline)."""
    with gzip.open(path, "rb") as f:
        source = f.read()
    if source.startswith(b".so "):  # an alias page: `.so man1/other.1`
        return ""
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-rLL=5000n", "-rHY=0", "-P-cbou"],
        input=source,
        capture_output=True,
        timeout=60,
    )
    return done.stdout.decode("utf-8", "replace")


def sections(text: str) -> dict[str, list[str]]:
    """Heading → its paragraphs (each collapsed to one line of words)."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    heading, paragraph = None, []
    for line in text.splitlines() + [""]:
        if line and not line[0].isspace() and SECTION.match(line.strip()):
            heading, paragraph = line.strip(), []
            continue
        if heading is None:
            continue
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            out[heading].append(" ".join(" ".join(paragraph).split()))
            paragraph = []
    return out


def parse(path: str, text: str, max_words: int) -> Page | None:
    parts = sections(text)
    name_line = " ".join(parts.get("NAME", []))
    description = " ".join(parts.get("DESCRIPTION", [])).split()
    if name_line.count(" - ") != 1 or len(description) < 20:
        return None
    name, summary = (s.strip() for s in name_line.split(" - "))
    if len(summary.split()) < 3:
        return None
    page = os.path.basename(path)[: -len(".gz")]  # git-add.1: a page's identity across sections
    return Page(page, summary, " ".join(description[:max_words]))


def read_pages(paths: list[str], max_words: int, workers: int = 2) -> list[Page]:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # each render is its own groff process
        texts = list(pool.map(render, paths))
    pages = [p for p in (parse(path, text, max_words) for path, text in zip(paths, texts)) if p]
    summaries = collections.Counter(p.summary.lower() for p in pages)
    descriptions = collections.Counter(p.description for p in pages)
    return [p for p in pages if summaries[p.summary.lower()] == 1 and descriptions[p.description] == 1]


def title(page: Page) -> str:
    return page.name.rsplit(".", 1)[0]  # git-add.1 → git-add


def document_text(page: Page) -> str:
    """The document as `bertjax.retrieval` embeds it (title + " " + text): the training positives are the same."""
    return f"{title(page)} {page.description}"


def build(out: pathlib.Path, test_queries: int, max_pages: int = 0, max_words: int = 200, seed: int = 0) -> dict:
    paths = page_files(max_pages, seed)
    pages = read_pages(paths, max_words)
    if len(pages) < 2 * test_queries:
        raise SystemExit(f"only {len(pages)} usable manual pages for {test_queries} test queries: ask for fewer.")
    order = sorted(pages, key=lambda p: p.name)
    random.Random(seed).shuffle(order)
    test, train = order[:test_queries], order[test_queries:]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w", encoding="utf-8") as f:
        for p in train:
            f.write(json.dumps({"query": p.summary, "positive": document_text(p)}) + "\n")
    beir = out / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    with open(beir / "corpus.jsonl", "w", encoding="utf-8") as f:
        for p in sorted(pages, key=lambda p: p.name):
            f.write(json.dumps({"_id": p.name, "title": title(p), "text": p.description}) + "\n")
    with open(beir / "queries.jsonl", "w", encoding="utf-8") as f:
        for p in test:
            f.write(json.dumps({"_id": f"q:{p.name}", "text": p.summary}) + "\n")
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q:{p.name}\t{p.name}\t1\n" for p in test), encoding="utf-8"
    )
    summary_in_document = sum(p.summary.lower() in p.description.lower() for p in test)
    info = {
        "source": MAN_GLOB,
        "page_files": len(paths),
        "usable_pages": len(pages),
        "train_pairs": len(train),
        "test_queries": len(test),
        "documents": len(pages),
        "mean_query_words": round(sum(len(p.summary.split()) for p in pages) / len(pages), 2),
        "mean_document_words": round(sum(len(p.description.split()) for p in pages) / len(pages), 1),
        "test_summary_verbatim_in_its_document": summary_in_document,
        "train_pages": sorted(p.name for p in train),
        "test_pages": sorted(p.name for p in test),
    }
    (out / "set.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--test_queries", type=int, default=400)
    p.add_argument("--max_pages", type=int, default=0, help="draw this many page files (0 = all)")
    p.add_argument("--max_words", type=int, default=200, help="words of a DESCRIPTION kept")
    args = p.parse_args(argv)
    info = build(pathlib.Path(args.out), args.test_queries, args.max_pages, args.max_words)
    print(json.dumps({k: v for k, v in info.items() if k not in ("train_pages", "test_pages")}))


if __name__ == "__main__":
    main()
