#!/usr/bin/env bash
# Architecture switches x position schemes at the emergence CPU budget (issue 13; docs/emergence.md table).
# Every run: experiment=emergence_cpu with a fixed step budget; one switch changed from plain RoBERTa.
# clipped softmax keeps Bondarenko et al.'s BERT alpha = -gamma*T = 3.2 (gamma -0.025 at T=128): T = 64 here -> gamma = -0.05.
# Then: python -m outlierlab.jobs.posthoc OUT/<pos>_<switch>   and
#   python scripts/summarize_emergence.py table --runs OUT/* --out docs/emergence/switches.csv
# usage: scripts/switch_sweep.sh OUT_DIR [STEPS=600] [POS_LIST="learned none"] [SWITCHES="softmax clipped ..."]
set -euo pipefail
OUT=${1:?usage: switch_sweep.sh OUT_DIR [STEPS] [POS_LIST] [SWITCHES]}
STEPS=${2:-600}
POS_LIST=${3:-"learned none"}
SWITCHES=${4:-"softmax clipped_softmax gated pre_ln noaffine rmsnorm op"}
WARM=$((STEPS / 6))
COMMON="experiment=emergence_cpu trainer.max_steps=$STEPS module.scheduler.num_warmup_steps=$WARM
 trainer.val_check_interval=$STEPS trainer.enable_progress_bar=false export=false
 callbacks.model_checkpoint.every_n_train_steps=$((STEPS / 3))
 callbacks.layernorm_monitor.every_n_steps=$((STEPS / 6)) callbacks.hidden_state_monitor.every_n_steps=$((STEPS / 6))"
declare -A SW=(
  [softmax]=""
  [clipped_softmax]="model.attention=clipped_softmax model.clip_gamma=-0.05"
  # ours, not the paper's: half the largest |gamma| that leaves a uniform row (p = 1/T) unclipped, 1/(2T) at T = 64
  # (at the paper's alpha every probability of this small model is clipped from initialisation on: docs/emergence.md)
  [clipped_softmax_alive]="model.attention=clipped_softmax model.clip_gamma=-0.0078"
  [gated]="model.attention=gated"
  [pre_ln]="model.norm_placement=pre"
  [noaffine]="model.norm=layernorm_noaffine"
  [rmsnorm]="model.norm=rmsnorm"
  [op]="model.block=op"
)
for pos in $POS_LIST; do
  for sw in $SWITCHES; do
    dir="$OUT/${pos}_${sw}"
    if [ -f "$dir/done" ]; then continue; fi
    # shellcheck disable=SC2086
    python train.py $COMMON pos=$pos ${SW[$sw]} hydra.run.dir="$dir"
    touch "$dir/done"
  done
done
