"""Contextual token vectors of chosen layers, as google-research/bert's extract_features.py writes them:

    python -m bertjax.extract_features --init_from=PATH --input_file=F --output_file=OUT.jsonl --layers=-1,-2,-3,-4

The work is `bertjax.jobs.extract_features.run`; this command holds its flags.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from bertjax import cli


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """The CLI's flags; defined only when run as a program (or by a test, on its own FlagValues)."""
    flags.DEFINE_string(
        "init_from", None, "A bertjax workdir, or a Hugging Face (or TF1) BERT directory.", flag_values=fv
    )
    flags.DEFINE_string(
        "input_file", None, "UTF-8 text: one input per line, `text_a ||| text_b` for a pair.", flag_values=fv
    )
    flags.DEFINE_string("output_file", None, "JSONL output: one object per input line.", flag_values=fv)
    flags.DEFINE_string("layers", "-1,-2,-3,-4", "Encoder layers to output (-1 the last, 0 the first).", flag_values=fv)
    flags.DEFINE_integer(
        "max_seq_length", 128, "Tokens per input, with [CLS]/[SEP]; longer inputs are truncated.", flag_values=fv
    )
    flags.DEFINE_integer("batch_size", 8, "Inputs per forward pass.", flag_values=fv)
    flags.DEFINE_string("vocab_file", None, "Vocabulary (default: the one --init_from records).", flag_values=fv)
    flags.DEFINE_boolean(
        "do_lower_case", None, "Lower-case input (default: as --init_from records, else true).", flag_values=fv
    )
    flags.mark_flags_as_required(["init_from", "input_file", "output_file"], flag_values=fv)


def main(argv: Sequence[str], fv: flags.FlagValues = flags.FLAGS) -> int:
    from bertjax.jobs import extract_features

    summary = cli.run_job(
        argv,
        extract_features.run,
        fv.init_from,
        fv.input_file,
        fv.output_file,
        fv.layers,
        fv.max_seq_length,
        fv.batch_size,
        fv.vocab_file or None,
        fv.do_lower_case,
        command="extract_features",
    )
    print(f"wrote features of {summary['lines']} lines to {fv.output_file}")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
