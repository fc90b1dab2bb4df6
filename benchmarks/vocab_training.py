"""bertjax's WordPiece learner against Hugging Face tokenizers' WordPieceTrainer, on builtin:pydocs.

    python benchmarks/vocab_training.py [--vocab_size=4096] [--repeats=3] [--heldout_every=10]

Splits `builtin:pydocs` into train documents and every `--heldout_every`-th document held out (as the
demo does), then on the train sentences: times HF's trainer (`train_from_iterator`, the normaliser and
pre-tokenizer bertjax builds) and bertjax's learner (`vocab_training.learn_wordpiece`), interleaved,
`--repeats` times each (median and all); counts held-out WordPiece tokens per word with each vocab; the
share of tokens the two vocabs have in common; and the sha256 of each vocab learned in two separate
processes with different PYTHONHASHSEED (bertjax's agree; HF's usually do not: tokenizers#1794). Prints
one JSON object. A couple of minutes on 2 cores.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each trainer, interleaved")
    p.add_argument("--heldout_every", type=int, default=10)
    p.add_argument("--_sha_of", choices=("bertjax", "hf"), help=argparse.SUPPRESS)  # the child process's job
    return p.parse_args()


def split(heldout_every: int) -> tuple[list[str], list[str]]:
    """Train and held-out sentences of builtin:pydocs: every heldout_every-th document held out."""
    from bertjax.data.corpus import sources as corpus

    train, heldout = [], []
    for i, document in enumerate(corpus.open_source("builtin:pydocs").documents()):
        (heldout if i % heldout_every == heldout_every - 1 else train).extend(document)
    return train, heldout


def learn_bertjax(lines: list[str], vocab_size: int) -> list[str]:
    from bertjax.data.vocab import training as vocab_training

    return vocab_training.learn_wordpiece(lines, vocab_size)


def learn_hf(lines: list[str], vocab_size: int) -> list[str]:
    from tokenizers import trainers

    from bertjax.data.vocab import tokenization

    hf = tokenization._hf_wordpiece(None, do_lower_case=True)
    hf.train_from_iterator(
        lines,
        trainer=trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=list(tokenization.SPECIAL_TOKENS),
            continuing_subword_prefix=tokenization.WORDPIECE_PREFIX,
            show_progress=False,
        ),
    )
    return [t for t, _ in sorted(hf.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])]


LEARNERS = {"bertjax": learn_bertjax, "hf": learn_hf}


def sha256(vocab: list[str]) -> str:
    return hashlib.sha256("".join(f"{t}\n" for t in vocab).encode("utf-8")).hexdigest()


def tokens_per_word(vocab: list[str], lines: list[str]) -> float:
    from bertjax.data.vocab import tokenization, training as vocab_training

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{t}\n" for t in vocab))
        pieces = sum(map(len, tokenization.WordPieceTokenizer(path, do_lower_case=True).encode_batch(lines)))
    return pieces / sum(vocab_training.count_words(lines).values())


def sha_in_a_process(name: str, args, seed: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            f"--_sha_of={name}",
            f"--vocab_size={args.vocab_size}",
            f"--heldout_every={args.heldout_every}",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONHASHSEED=seed),
    )
    return done.stdout.strip()


def main():
    args = parse_args()
    train, heldout = split(args.heldout_every)
    if args._sha_of:
        print(sha256(LEARNERS[args._sha_of](train, args.vocab_size)))
        return
    times = {name: [] for name in LEARNERS}
    vocabs = {}
    for _ in range(args.repeats):  # interleaved: a slow moment of the box hits both
        for name, learn in LEARNERS.items():
            start = time.perf_counter()
            vocabs[name] = learn(train, args.vocab_size)
            times[name].append(time.perf_counter() - start)
    result = {
        "corpus": "builtin:pydocs",
        "vocab_size": args.vocab_size,
        "train_sentences": len(train),
        "heldout_sentences": len(heldout),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }  # other work on the box slows both trainers
    for name in LEARNERS:
        result[name] = {
            "seconds_median": round(statistics.median(times[name]), 3),
            "seconds": [round(t, 3) for t in times[name]],
            "entries": len(vocabs[name]),
            "heldout_tokens_per_word": round(tokens_per_word(vocabs[name], heldout), 4),
            "sha256_two_processes": [sha_in_a_process(name, args, seed)[:16] for seed in ("0", "1")],
        }
        result[name]["same_in_both_processes"] = len(set(result[name]["sha256_two_processes"])) == 1
    result["hf_over_bertjax_time"] = round(result["hf"]["seconds_median"] / result["bertjax"]["seconds_median"], 2)
    result["shared_tokens"] = round(len(set(vocabs["bertjax"]) & set(vocabs["hf"])) / args.vocab_size, 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
