"""The peer of `python -m bertjax.finetune --config=configs/retrieval.py`: sentence-transformers' own trainer on the
same pairs, as its documentation trains an embedder (SentenceTransformerTrainer, MultipleNegativesRankingLoss, the
no-duplicates batch sampler), with the settings the bertjax job runs under:

    python benchmarks/st_contrastive.py --model=ST_DIR --train_file=PAIRS.jsonl --output_dir=OUT
        [--batch_size=32] [--epochs=1] [--learning_rate=8e-5] [--warmup_steps=N] [--max_seq_length=128]
        [--cached_mini_batch=N] [--device=auto] [--bf16]

the same linear warmup and linear decay to 0 (warmup steps given as bertjax counts them: int(0.1 × steps)),
weight decay 0.01 off biases and LayerNorm, clipping at 1.0, Adam ε 1e-6, scale 20, every core for torch.
`--cached_mini_batch=N`: CachedMultipleNegativesRankingLoss (GradCache, ModernBERT's MS MARCO recipe) in mini-batches
of N, bertjax's `train.micro_batches` = batch / N. The weights train in float32 whatever the directory stores (a
float16 copy carried to a GPU), as bertjax loads them; `--bf16` is the trainer's autocast.
benchmarks/retrieval.py times this whole process (imports, loading, tokenizing, training, saving) against the
whole bertjax process.
"""

import argparse
import json
import os
import time

START = time.monotonic()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--train_file", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning_rate", type=float, default=8e-5)
    p.add_argument("--warmup_steps", type=int, default=0)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) (the trainer's bf16=True)")
    p.add_argument("--cached_mini_batch", type=int, default=0, help="> 0: CachedMNRL's mini_batch_size")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: cuda when torch has one")
    args = p.parse_args(argv)

    import datasets
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )
    from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    torch.set_num_threads(os.cpu_count() or 1)
    with open(args.train_file, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    train = datasets.Dataset.from_dict(
        {"anchor": [r["query"] for r in rows], "positive": [r["positive"] for r in rows]}
    )
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = SentenceTransformer(args.model, device=device).to(torch.float32)
    model.max_seq_length = args.max_seq_length
    if args.cached_mini_batch > 0:
        loss = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=args.cached_mini_batch)
    else:
        loss = MultipleNegativesRankingLoss(model, scale=20.0)
    training = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(args.output_dir, "trainer"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        seed=args.seed,
        save_strategy="no",
        report_to="none",
        logging_steps=50,
        disable_tqdm=True,
        use_cpu=device == "cpu",
        bf16=args.bf16,
    )
    trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=train, loss=loss)
    trained = trainer.train()
    model.save(os.path.join(args.output_dir, "model"))
    print(
        json.dumps(
            {
                "steps": trained.global_step,
                "train_loss": trained.training_loss,
                "seconds": time.monotonic() - START,
                "device": device,
                "loss": type(loss).__name__,
            }
        )
    )


if __name__ == "__main__":
    main()
