#!/usr/bin/env bash
# The order-use recipe sweep on one GPU (docs/order_use.md): every cell of the sweep at once, one process each, for
# a fixed wall-clock budget. Real text (experiment=emergence_cpu, 20k steps, validation with order use every 1k):
# learned-position candidates beside their no-position references and rope; plus the synthetic order task per
# position scheme. Small files of every run end in $OUT/order_recipe_gpu_<mode>.tgz.part_* (or ./...).
#   bash scripts/order_recipe_gpu.sh sweep [SECONDS_PER_CELL]     # the candidates
#   bash scripts/order_recipe_gpu.sh study [SECONDS_PER_CELL]     # experiment=order_recipe, learned/none x STUDY_SEEDS
#     (1 2 3 4 5; STUDY_SEEDS="6 7 8 9 10" for more: does the learned table's dimension settle as order use begins,
#     3 of 5 so far: outlierlab.studies.dim_identity on the exported cells)
#   bash scripts/order_recipe_gpu.sh haviv [SECONDS_PER_CELL]     # {mlm, clm} x {learned, none} x 5 seeds of
#     experiment=order_recipe: Haviv et al.'s masked-vs-causal interaction with a masked model that uses its
#     positions (measured: 12 cells, SEEDS="1 2 3", 250 s on one H100 took the mlm cells to 6,000 steps and the
#     clm cells -- slower -- to ~5,500; 20 cells need about 8 minutes); then
#     python scripts/export_cells.py gpu_runs/haviv docs/order_use/cells_objectives.parquet --stopped and
#     python -m lab.objectives_report docs/order_use/cells_objectives.parquet --until 5000 \
#       --out docs/order_use/study_objectives   (docs/order_use.md, "Haviv's interaction")
#   bash scripts/order_recipe_gpu.sh schemes [SECONDS_PER_CELL]   # sinusoidal, relative, rope, alibi x SCHEMES_SEEDS (1 2 3) of
#     experiment=order_recipe (12 cells), beside the study's learned and none
#   bash scripts/order_recipe_gpu.sh large [SECONDS_PER_CELL]     # LARGE_OBJECTIVES (default clm) x {learned, none}
#     on data=english_large (seeds LARGE_SEEDS, default 1): does the no-position causal model still match the learned
#     one when it does not overfit the embedded corpus (clm)? does the masked model still learn to use its table
#     there (LARGE_OBJECTIVES="mlm clm"; LARGE_SEEDS_MLM, LARGE_SEEDS_CLM override LARGE_SEEDS per objective)? Needs .gpu_cache/corpora/english_large (scripts/build_english_large.py --out) and
#     its token cache built here first (train.py ... data=english_large objective=clm trainer.max_steps=2)
#   bash scripts/order_recipe_gpu.sh long [SECONDS_PER_CELL]      # LONG_SCHEMES (sinusoidal learned rope none) x
#     LONG_SEEDS (1), LONG_STEPS (20000) steps on data=english_large, masked (4 cells: unmeasured; 6,000 steps took
#     ~250 s with 14 cells sharing the GPU, so give a warm machine the call's 540 s and use --stopped/--until)
#   bash scripts/order_recipe_gpu.sh switches [SECONDS_PER_CELL]  # arch=default,op,pre_ln x SWITCH_SEEDS (1 2 3), learned
#     positions, english_large, masked (9 cells; then python -m outlierlab.studies.aggregate <exported cells>
#     --contrast arch=default,op --contrast arch=default,pre_ln --primary val/loss@model,hidden/kurtosis@max_layer)
#   bash scripts/order_recipe_gpu.sh haviv,schemes 450           # several modes at once, one process per cell
#     (measured: SEEDS="4 5" ... haviv,schemes,large 470 ran 22 cells at once on one H100 and every one finished its
#     6,000 steps; the whole call took 420 s. LARGE_SEEDS="2 3" ... large 290: 4 cells, 257 s. LARGE_OBJECTIVES="mlm
#     clm" LARGE_SEEDS_MLM="1 2 3 4 5" LARGE_SEEDS_CLM="4 5" ... large 450: 14 cells, all finished, 286 s.)
#   EXTRA="data=english_large objective=mlm" bash scripts/order_recipe_gpu.sh schemes 330   # EXTRA: overrides added
#     to every cell, so a mode can run on other data (measured, with the same overrides spliced through TRAINER's
#     value, TRAINER="gpu data=english_large objective=mlm", before EXTRA existed: 12 cells, all finished, 234 s).
#     Budget a FRESH machine more: SCHEMES_SEEDS="4 5" ... schemes 220 (8 cells, the first call on a new machine)
#     cut every cell at 4,319-4,999 of 6,000 steps -- give a first call at least 330 s per cell.
# On a GPU machine (the device tool sends the checkout, which must stay under 64 MiB with what it carries):
#   here, once: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
#       datasets==5.2.0 dill==0.4.0 multiprocess==0.70.18      # (the device image lacks these)
#     python train.py experiment=order_recipe trainer.max_steps=2 paths.cache_dir=$PWD/.gpu_cache   # token cache
#   then one call, carry [".whl", ".gpu_cache"], timeout ~ SECONDS_PER_CELL + 60:
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site && bash scripts/order_recipe_gpu.sh schemes 400
#   (.whl, .gpu_cache and gpu_runs are in .git/info/exclude.) Everything must come back with that call.
#   The tree that travels is limited to 64 MiB: with the english_large cache (~39 MB: corpus, tokenizer, token
#   file) beside the tracked files (scripts/checkout_size.py prints them), move docs/ aside for the call if the two
#   do not fit (mv docs /tmp/docs_aside; after it, mv /tmp/docs_aside docs) -- the cells need none of it.
#   Export the cells that come back into a study table: python scripts/export_cells.py <runs> docs/<area>/<name>.parquet
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-sweep}
BUDGET=${2:-460}
OUTDIR=${OUT:-.}
ROOT=${GPU_RUNS:-gpu_runs}   # where the cells run (tests/test_gpu_script.py points it elsewhere)
mkdir -p "$ROOT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# MPS lets the many small processes' kernels run side by side instead of time-slicing the GPU; optional.
if nvidia-cuda-mps-control -d 2>/dev/null; then
  python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" || echo quit | nvidia-cuda-mps-control
fi
COMMON="trainer=${TRAINER:-gpu} threads=1 paths.cache_dir=$PWD/.gpu_cache ${EXTRA:-}"
cell() {  # name, overrides...
  local name=$1; shift
  if [ -n "${DRY:-}" ]; then python3 train.py $COMMON "hydra.run.dir=\"$ROOT/$name\"" "$@" --cfg job >/dev/null || echo "BAD $name"; return; fi
  mkdir -p "$(dirname "$ROOT/$name")"
  timeout -s INT -k 45 "$BUDGET" python3 train.py $COMMON "hydra.run.dir=\"$ROOT/$name\"" "$@" >"$ROOT/$name.log" 2>&1 &
}
has() { case ",$MODE," in *",$1,"*) return 0;; esac; return 1; }
if has study; then
  for seed in ${STUDY_SEEDS:-1 2 3 4 5}; do for p in learned none; do
    cell "study/pos=$p,seed=$seed" experiment=order_recipe pos=$p seed=$seed callbacks.model_checkpoint.every_n_train_steps=100000
  done; done
  # what moved it: the batch or the learning rate (6,000 steps each, like the study)
  cell recipe_b32_lr1e-3  experiment=order_recipe pos=learned data.batch_size=32
  cell recipe_b128_lr2e-3 experiment=order_recipe pos=learned lr=2e-3
  cell recipe_b64_lr1e-3  experiment=order_recipe pos=learned data.batch_size=64
fi
if has haviv; then
  for seed in ${SEEDS:-1 2 3 4 5}; do for o in mlm clm; do for p in learned none; do
    cell "haviv/objective=$o,pos=$p,seed=$seed" experiment=order_recipe objective=$o pos=$p seed=$seed \
      callbacks.model_checkpoint.every_n_train_steps=100000
  done; done; done
fi
if has schemes; then
  for seed in ${SCHEMES_SEEDS:-1 2 3}; do for p in sinusoidal relative rope alibi; do
    cell "schemes/pos=$p,seed=$seed" experiment=order_recipe pos=$p seed=$seed \
      callbacks.model_checkpoint.every_n_train_steps=100000
  done; done
fi
if has large; then  # the pair on data=english_large (11.3M tokens: ~5x fewer epochs than the embedded corpus)
  for o in ${LARGE_OBJECTIVES:-clm}; do seeds=LARGE_SEEDS_${o^^}; for seed in ${!seeds:-${LARGE_SEEDS:-1}}; do
  for p in learned none; do
    cell "large/objective=$o,pos=$p,seed=$seed" experiment=order_recipe data=english_large objective=$o pos=$p \
      seed=$seed callbacks.model_checkpoint.every_n_train_steps=100000
  done; done; done
fi
if has long; then  # LONG_STEPS (20,000) of LONG_SCHEMES on data=english_large, masked: do the absolute schemes'
  # heavier-tailed middle layers become Luo-type dimensions (|x| argmax share near 1) with training, and is it one
  # dimension through the layers? (python -m outlierlab.studies.dim_identity <exported cells> --out <dir>)
  for seed in ${LONG_SEEDS:-1}; do for p in ${LONG_SCHEMES:-sinusoidal learned rope none}; do
    cell "long/pos=$p,seed=$seed" experiment=order_recipe data=english_large objective=mlm pos=$p seed=$seed \
      trainer.max_steps=${LONG_STEPS:-20000} callbacks.model_checkpoint.every_n_train_steps=100000
  done; done
fi
if has switches; then  # He et al.'s Outlier-Protected block and pre-LN against plain RoBERTa (experiment=switch_seeds'
  # arches) where the learned table is used: the switch study's contrasts outside the bag-of-words regime
  for seed in ${SWITCH_SEEDS:-1 2 3}; do for a in default op pre_ln; do
    cell "switches/arch=$a,seed=$seed" experiment=order_recipe data=english_large objective=mlm pos=learned arch=$a \
      seed=$seed callbacks.model_checkpoint.every_n_train_steps=100000
  done; done
fi
if has sweep; then
REAL="experiment=emergence_cpu trainer.max_steps=20000 callbacks.model_checkpoint.every_n_train_steps=5000"
cell real_learned           $REAL pos=learned
cell real_none              $REAL pos=none
cell real_rope              $REAL pos=rope
cell real_learned_sininit   $REAL pos=learned pos.init=sinusoidal
cell real_learned_init10x   $REAL pos=learned pos.init_scale=10
cell real_learned_preln     $REAL pos=learned model.norm_placement=pre
cell real_learned_b128      $REAL pos=learned data.batch_size=128 lr=1e-3
cell real_none_b128         $REAL pos=none data.batch_size=128 lr=1e-3
TASK="experiment=order_task"
for p in learned none sinusoidal relative rope alibi; do cell task_$p $TASK pos=$p; done
cell task_learned_sininit $TASK pos=learned pos.init=sinusoidal
cell task_learned_preln   $TASK pos=learned model.norm_placement=pre
fi
wait
nvidia-smi --query-gpu=name,memory.used --format=csv > "$ROOT/gpu.txt" 2>&1
# in parts of 15 MiB: the device tool returns no file over 16 MiB, and a later call's copy of the working tree
# removes gpu_runs/, so what does not come back with this call is lost
tar czf - --exclude='*.ckpt' --exclude='*.safetensors' --exclude='*.bin' \
  --exclude='events.out.*' "$ROOT" | split -b 15M - "$OUTDIR/order_recipe_gpu_${MODE//,/_}.tgz.part_"
ls -la "$OUTDIR"   # here: cat order_recipe_gpu_<mode>.tgz.part_* | tar xz
