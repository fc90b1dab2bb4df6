"""An encoder scored on a BEIR-layout retrieval set, with BM25 beside it:

    python -m bertjax.retrieval --model=PATH --data_dir=BEIR_DIR --output=RESULTS.json [--split=test]

The work is `bertjax.jobs.retrieval.run`; this command holds its flags. It prints one JSON line and writes it to
--output: ndcg_at_10, recall_at_100, mrr_at_10, queries, documents, seconds, and the same under "bm25s".
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from absl import flags

from bertjax import cli


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """The CLI's flags; defined only when run as a program (or by a test, on its own FlagValues)."""
    flags.DEFINE_string(
        "model",
        None,
        "A sentence-transformers directory, a bertjax workdir, or a Hugging Face (or TF1) directory.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "data_dir", None, "A BEIR directory: corpus.jsonl, queries.jsonl, qrels/<split>.tsv.", flag_values=fv
    )
    flags.DEFINE_string("output", None, "The results' JSON file.", flag_values=fv)
    flags.DEFINE_string("split", "test", "The qrels file: qrels/<split>.tsv.", flag_values=fv)
    flags.DEFINE_integer("batch_size", 64, "Texts per forward pass.", flag_values=fv)
    flags.DEFINE_integer(
        "max_seq_length",
        None,
        "Tokens a text is cut to (default: the sentence-transformers directory's, else 512 or the model's limit).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "block_size", None, "Documents scored a block (default: sized to the number of queries).", flag_values=fv
    )
    flags.DEFINE_boolean("bm25", True, "Also score BM25 (bm25s) on the same data.", flag_values=fv)
    flags.mark_flags_as_required(["model", "data_dir", "output"], flag_values=fv)


def main(argv: Sequence[str], fv: flags.FlagValues = flags.FLAGS) -> None:
    from bertjax.jobs import retrieval

    results = cli.run_job(
        argv,
        retrieval.run,
        fv.model,
        fv.data_dir,
        fv.output,
        fv.split,
        fv.batch_size,
        fv.max_seq_length,
        fv.block_size,
        fv.bm25,
        command="retrieval",
        errors=cli.USER_ERRORS + (ImportError,),  # bm25s missing: its one sentence
    )
    print(json.dumps(results))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
