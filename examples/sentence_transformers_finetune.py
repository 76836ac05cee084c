"""Fine-tune all-MiniLM-L6-v2 contrastively with the outlier monitors in sentence-transformers' own trainer.

    python examples/sentence_transformers_finetune.py out/minilm_wic            # 200 steps, CPU: about 3 minutes

The model is the shipped copy of sentence-transformers/all-MiniLM-L6-v2 (offline); the training pairs are the
shipped WordNet WiC set's same-sense pairs (two WordNet example sentences of one synset: ``label`` true, train
split), learned with ``MultipleNegativesRankingLoss`` (in-batch negatives).  ``OutlierMonitorCallback`` -- the one
line -- records, every ``--every`` steps, the LayerNorm and hidden-state outlier rows of the body and the
sentence-vector order change of every layer (docs/order_use.md) into ``<out>/monitor/``; the model has no LM head,
so there is no order use in nats.  docs/loop_monitors.md reports one run of this script.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def same_sense_pairs(limit: int | None = None) -> dict[str, list[str]]:
    """``anchor``/``positive`` columns: the WiC train pairs whose two sentences use the word in one sense."""
    import outlierlab.datamodules

    path = Path(outlierlab.datamodules.__file__).parent / "data" / "eval" / "wic_wordnet.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "train" and r["label"]]
    rows = rows[:limit] if limit else rows
    return {"anchor": [r["sentence1"] for r in rows], "positive": [r["sentence2"] for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (the trainer's output_dir; the monitor writes <out>/monitor/)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--every", type=int, default=20, help="monitor record every this many steps")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from outlierlab import OutlierMonitorCallback
    from outlierlab.models.encoder_source import bundled_model_path

    model = SentenceTransformer(bundled_model_path(), device="cpu")
    pairs = Dataset.from_dict(same_sense_pairs())
    training = SentenceTransformerTrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        warmup_steps=args.steps // 10, save_strategy="no", report_to=[], use_cpu=True, seed=args.seed,
        logging_steps=args.every, disable_tqdm=True)
    callback = OutlierMonitorCallback(every_n_steps=args.every, image_every_n_steps=args.steps, figures=False,
                                      writer=False)
    trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=pairs,
                                         loss=MultipleNegativesRankingLoss(model), callbacks=[callback])
    trainer.train()
    print(f"{len(pairs)} pairs, {args.steps} steps -> {Path(args.out) / 'monitor'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
