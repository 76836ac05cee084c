#!/usr/bin/env bash
# The reproduction behind docs/reproduction.md, with the project's own commands only.
# Four tiny encoders (learned, none, relative, rope) pretrained for the same budget on the embedded
# corpus, then probed and evaluated. On 2 CPU cores the four runs share the machine (one thread each).
#   bash scripts/reproduce.sh [STEPS] [OUT] [train|analyze|all]
#   python -m lab.reproduction_tables OUT docs/reproduction   # the tables of docs/reproduction.md
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-800}
OUT=${2:-outputs/reproduction}
PHASE=${3:-all}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$OUT"
if [ "$PHASE" != analyze ]; then
for pos in learned none relative rope; do
  python train.py pos=$pos model=tiny data.batch_size=16 trainer.max_steps=$STEPS \
    trainer.val_check_interval=200 callbacks.model_checkpoint.every_n_train_steps=200 \
    module.scheduler.num_warmup_steps=50 hydra.run.dir=$OUT/train_$pos > $OUT.train_$pos.log 2>&1 &
done
wait
fi
[ "$PHASE" = train ] && exit 0
# probes on one core, evaluations on the other
(for pos in learned none relative rope; do
  python probe.py encoder.name_or_path=$OUT/train_$pos data.max_sentences=1000 \
    hydra.run.dir=$OUT/probe_$pos > $OUT.probe_$pos.log 2>&1 || echo "probe $pos failed (see $OUT.probe_$pos.log)"
done) &
(for pos in learned none relative rope; do
  python evaluate.py encoder.name_or_path=$OUT/train_$pos 'analyses=[outliers,anisotropy,self_similarity,wic,ablation]' \
    hydra.run.dir=$OUT/evaluate_$pos > $OUT.evaluate_$pos.log 2>&1 || echo "evaluate $pos failed (see $OUT.evaluate_$pos.log)"
done) &
wait
