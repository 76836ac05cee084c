#!/usr/bin/env bash
# Short sweep at a fixed step budget over what the literature says drives outlier emergence
# (He et al. 2024; Kovaleva et al. 2021): learning rate, Adam eps, dropout, width, weight-decay scope.
# One factor at a time from experiment=emergence_cpu (pos=learned); then
#   python -m outlierlab.jobs.posthoc OUT/<name>    (kurtosis, max/median, argmax share per checkpoint)
#   python scripts/summarize_emergence.py table --runs OUT/* --out docs/emergence/sweep.csv
# wd_all: weight decay on LayerNorm gains and biases too (fairseq's scope; the default exempts them).
# usage: scripts/emergence_sweep.sh OUT_DIR [STEPS=600] [POS=learned]
set -euo pipefail
OUT=${1:?usage: emergence_sweep.sh OUT_DIR [STEPS] [POS]}
STEPS=${2:-600}
POS=${3:-learned}
WARM=$((STEPS / 6))
COMMON="experiment=emergence_cpu pos=$POS trainer.max_steps=$STEPS module.scheduler.num_warmup_steps=$WARM
 trainer.val_check_interval=$STEPS trainer.enable_progress_bar=false export=false
 callbacks.model_checkpoint.every_n_train_steps=$((STEPS / 3))
 callbacks.layernorm_monitor.every_n_steps=$((STEPS / 6)) callbacks.hidden_state_monitor.every_n_steps=$((STEPS / 6))"
declare -A RUNS=(
  [base]=""
  [lr3e-4]="module.optimizer.lr=3e-4"
  [lr1e-3]="module.optimizer.lr=1e-3"
  [eps1e-6]="module.optimizer.eps=1e-6"
  [dropout0.1]="model.dropout=0.1 model.attention_dropout=0.1"
  [width256]="model.hidden_size=256 model.intermediate_size=1024"
  [wd_all]="module.weight_decay_scope=all"
)
# SWEEP_RUNS="base eps1e-6" runs a subset (names above)
for name in ${SWEEP_RUNS:-base lr3e-4 lr1e-3 eps1e-6 dropout0.1 width256 wd_all}; do
  if [ -f "$OUT/$name/checkpoints/last.ckpt" ] && [ -f "$OUT/$name/done" ]; then continue; fi
  # shellcheck disable=SC2086
  python train.py $COMMON ${RUNS[$name]} hydra.run.dir="$OUT/$name"
  touch "$OUT/$name/done"
done
