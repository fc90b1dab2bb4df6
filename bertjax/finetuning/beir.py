"""A retrieval set in BEIR's layout, read and checked before any work:

    BEIR_DIR/corpus.jsonl     {"_id": …, "title": …, "text": …} a line (title optional)
    BEIR_DIR/queries.jsonl    {"_id": …, "text": …} a line
    BEIR_DIR/qrels/<split>.tsv  query-id <tab> corpus-id <tab> score, under that header line

A document's text is its title and text joined by a space and stripped, as BEIR's and MTEB's dense retrievers
(`title + " " + text`) and sentence-transformers' information-retrieval evaluator give it to the encoder: one text,
not a pair. Only queries with at least one qrels row are evaluated (as BEIR); the others are counted in the log.

Every mistake is one sentence naming the file and line: a missing file, malformed JSON, a row without `_id` or
`text`, a duplicate `_id`, a qrels file without its header or with a row that is not three fields and an integer
score, and qrels rows naming a query or document the set does not hold. Those are refused rather than skipped
(counted, the first named): a judgement on a missing document would silently lower every recall, and a typo in a
split's ids would score a different set than the one meant.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Iterator

from bertjax.runtime import files

log = logging.getLogger(__name__)

CORPUS = "corpus.jsonl"
QUERIES = "queries.jsonl"
QRELS_DIR = "qrels"
QRELS_HEADER = ("query-id", "corpus-id", "score")
LAYOUT = f"{CORPUS}, {QUERIES} and {QRELS_DIR}/<split>.tsv"


@dataclasses.dataclass(frozen=True)
class RetrievalSet:
    """A BEIR set in memory: documents in file order, the judged queries in file order, their judgements."""

    doc_ids: list[str]
    doc_texts: list[str]  # title + " " + text, stripped
    query_ids: list[str]  # only queries with a qrels row
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]  # query id → {document id: graded relevance}
    unjudged_queries: int = 0  # queries.jsonl's rows without qrels, not evaluated

    @property
    def num_documents(self) -> int:
        return len(self.doc_ids)

    @property
    def num_queries(self) -> int:
        return len(self.query_ids)


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a UTF-8 file, streamed; blank lines skipped; a bad byte named by line."""
    with files.open_file(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: byte {raw[e.start]:#04x} is not UTF-8; save the file as UTF-8."
                ) from None
            if line.strip():
                yield number, line


def _id(value: object) -> str | None:
    """An `_id` as text (BEIR's ids are strings; a number is taken as its text, as BEIR's loader keys it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value:
        return value
    return str(value) if isinstance(value, int) else None


def read_jsonl(path: str, kind: str, need_title: bool) -> tuple[list[str], list[str]]:
    """(ids, texts) of corpus.jsonl or queries.jsonl, checked row by row."""
    example = '{"_id": "d1", "title": "…", "text": "…"}' if need_title else '{"_id": "q1", "text": "…"}'
    ids: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    for number, line in _lines(path):
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: not valid JSON ({e.msg} at column {e.colno}); write one object a line, like {example}."
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{where}: a {type(row).__name__}, not an object; write one object a line, like {example}."
            )
        doc_id = _id(row.get("_id"))
        if doc_id is None:
            what = "no" if "_id" not in row else "an empty or non-text"
            raise ValueError(f'{where}: the {kind} has {what} "_id"; give every row one, like {example}.')
        text = row.get("text")
        if not isinstance(text, str):
            what = "no" if "text" not in row else "a non-text"
            raise ValueError(f'{where}: the {kind} {doc_id!r} has {what} "text"; give every row one, like {example}.')
        if doc_id in seen:
            raise ValueError(
                f"{where}: _id {doc_id!r} is given twice (first on line {seen[doc_id]}); each {kind} needs its own _id."
            )
        seen[doc_id] = number
        title = row.get("title") if need_title else None
        if title is not None and not isinstance(title, str):
            raise ValueError(f'{where}: the {kind} {doc_id!r} has a non-text "title"; make it a string or drop it.')
        ids.append(doc_id)
        texts.append(f"{title} {text}".strip() if title else text.strip())
    if not ids:
        raise ValueError(f"{path} holds no rows; write one object a line, like {example}.")
    return ids, texts


def read_qrels(path: str) -> dict[str, dict[str, tuple[int, int]]]:
    """query id → {document id: (relevance, line)}; the header line checked, every row three fields."""
    qrels: dict[str, dict[str, tuple[int, int]]] = {}
    header = "\t".join(QRELS_HEADER)
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{path} is empty; write the header {header!r}, then one judgement a line.")
    number, line = first
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 3 or fields[2].strip().lstrip("-").isdigit():
        raise ValueError(
            f"{path}:{number}: the first line is not a header; BEIR's qrels start with the line {header!r} (tab-"
            "separated), which readers skip: add it."
        )
    for number, line in lines:
        fields = line.rstrip("\r\n").split("\t")
        where = f"{path}:{number}"
        if len(fields) != 3:
            raise ValueError(f"{where}: {len(fields)} tab-separated fields; write query-id, corpus-id and score.")
        query_id, doc_id, score = (f.strip() for f in fields)
        try:
            relevance = int(score)
        except ValueError:
            raise ValueError(
                f"{where}: score {score!r} is not an integer; write graded relevance as 0, 1, 2, …"
            ) from None
        if relevance < 0:
            raise ValueError(f"{where}: score {relevance} is negative; write graded relevance as 0, 1, 2, …")
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            raise ValueError(
                f"{where}: query {query_id!r} and document {doc_id!r} were judged before, on line "
                f"{judged[doc_id][1]}; keep one judgement a pair."
            )
        judged[doc_id] = (relevance, number)
    if not qrels:
        raise ValueError(f"{path} holds no judgements under its header; write one query-id, corpus-id, score a line.")
    return qrels


def _missing(qrels: dict, known: set, position: int) -> list[tuple[int, str]]:
    """(line, id) of the qrels rows whose query (position 0) or document (1) is not known, in line order."""
    rows = [(line, (q, d)[position]) for q, judged in qrels.items() for d, (_, line) in judged.items()]
    return sorted((line, name) for line, name in rows if name not in known)


def read(data_dir: str, split: str = "test") -> RetrievalSet:
    """The set at `data_dir` with the judgements of qrels/<split>.tsv."""
    if not files.isdir(data_dir):
        raise FileNotFoundError(f"--data_dir={data_dir} is not a directory; pass a BEIR directory ({LAYOUT}).")
    corpus, queries = os.path.join(data_dir, CORPUS), os.path.join(data_dir, QUERIES)
    qrels_path = os.path.join(data_dir, QRELS_DIR, f"{split}.tsv")
    for path in (corpus, queries):
        if not files.isfile(path):
            raise FileNotFoundError(f"{path} does not exist; a BEIR directory holds {LAYOUT}.")
    if not files.isfile(qrels_path):
        splits = sorted(n[:-4] for n in files.listdir(os.path.join(data_dir, QRELS_DIR)) if n.endswith(".tsv"))
        have = f"; it has --split={', '.join(splits)}" if splits else f"; a BEIR directory holds {LAYOUT}"
        raise FileNotFoundError(f"{qrels_path} does not exist{have}.")
    qrels = read_qrels(qrels_path)
    query_ids, query_texts = read_jsonl(queries, "query", need_title=False)
    doc_ids, doc_texts = read_jsonl(corpus, "document", need_title=True)
    for position, known, what, file in ((0, set(query_ids), "query", queries), (1, set(doc_ids), "document", corpus)):
        missing = _missing(qrels, known, position)
        if missing:
            line, name = missing[0]
            raise ValueError(
                f"{qrels_path}:{line}: names {what} {name!r}, which {file} does not hold ({len(missing)} qrels rows "
                f"name missing {what}s); remove those rows or add the {what}s."
            )
    judged = [i for i, q in enumerate(query_ids) if q in qrels]
    unjudged = len(query_ids) - len(judged)
    if unjudged:
        log.info(
            "retrieval: %d of %d queries in %s have no qrels in %s: not evaluated",
            unjudged,
            len(query_ids),
            queries,
            qrels_path,
        )
    return RetrievalSet(
        doc_ids=doc_ids,
        doc_texts=doc_texts,
        query_ids=[query_ids[i] for i in judged],
        query_texts=[query_texts[i] for i in judged],
        qrels={q: {d: rel for d, (rel, _) in judged_docs.items()} for q, judged_docs in qrels.items()},
        unjudged_queries=unjudged,
    )
