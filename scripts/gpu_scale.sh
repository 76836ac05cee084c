#!/usr/bin/env bash
# One prepared script for a GPU machine: train.py at the paper's scale against Hugging Face's Trainer, the scale
# ladder, and what deterministic algorithms cost (docs/gpu.md). Modes, comma-separated: pack (HERE, before the call), first,
# smoke, bench, determinism, ladder.
#
#   bash scripts/gpu_scale.sh pack                 # here: english_large (gzip text) + its tokenizer and token
#                                                  # file into .gpu_data/ (git-ignored; carry it: run(carry=[".gpu_data"]))
#   bash scripts/gpu_scale.sh first                # there, when the loan is short (15 min of device time): the
#                                                  # headline rows only -- ours vs HF's Trainer at base size, block
#                                                  # 128, compiled, plain and deterministic (three benchmark calls)
#   bash scripts/gpu_scale.sh smoke,bench          # there: one step of every rung, then the whole benchmark
#   bash scripts/gpu_scale.sh determinism          # there: ~4 min; the switch's cost (ours and HF's, base, block 128)
#                                                  # and two deterministic learned-position replicates compared
#   bash scripts/gpu_scale.sh ladder 480           # there: every rung x {learned, none} side by side for 480 s
#   DRY_RUN=1 bash scripts/gpu_scale.sh smoke,bench,ladder    # print the commands only (tests/test_gpu_scale_script.py)
#
# The GPU machine reaches no package registry and receives only the checkout plus carried folders (64 MiB in all):
# the corpus travels as .gpu_data/english_large (built here from Debian packages by scripts/build_english_large.py),
# results come back under $OUT (default ./gpu_out). LADDER_POS (default "learned,none"; add rope), LADDER_SEEDS
# (default "1"), LADDER_RUNGS (default all four) and LADDER_OPTIMIZERS (default "adamw"; add muon,sgd) choose the cells.
set -euo pipefail
cd "$(dirname "$0")/.."
MODES=${1:-smoke,bench}
SECONDS_PER_CELL=${2:-480}
OUT=${OUT:-gpu_out}
DATA=${GPU_DATA:-.gpu_data/english_large}
LADDER_POS=${LADDER_POS:-learned,none}
LADDER_SEEDS=${LADDER_SEEDS:-1}
LADDER_RUNGS=${LADDER_RUNGS:-4x128,6x384,8x512,12x768}
LADDER_OPTIMIZERS=${LADDER_OPTIMIZERS:-adamw}   # the optimizer arms (docs/optimizers.md), e.g. adamw,muon,sgd
run() { echo "+ $*"; if [ -z "${DRY_RUN:-}" ]; then "$@"; fi; }
hms() { printf '00:%02d:%02d:%02d' $(($1 / 3600)) $(($1 % 3600 / 60)) $(($1 % 60)); }
DATA_ARGS=(data=english_large "data.files=[$DATA]" data.num_proc=8)
# tokenizer and token file built by `pack` here and carried (.gpu_data/cache); rebuilt there if the key differs
export OUTLIERLAB_CACHE=${OUTLIERLAB_CACHE:-.gpu_data/cache}

for mode in ${MODES//,/ }; do
  case "$mode" in
    pack)
      run python scripts/build_english_large.py --out "$DATA"
      run python scripts/prepare_data.py "${DATA_ARGS[@]}" ;;
    first)
      # what one short call must bring back, most important first: the comparison with HF's Trainer as a user
      # would run both (compiled), then the same uncompiled and with deterministic algorithms (the switch's cost)
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --compile --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --deterministic --out "$OUT/throughput.csv" ;;
    smoke)
      for rung in ${LADDER_RUNGS//,/ }; do
        run python train.py experiment=scale_ladder "ladder=$rung" pos=learned trainer=gpu "${DATA_ARGS[@]}" \
          trainer.max_steps=2 trainer.val_check_interval=2 export=false \
          "hydra.run.dir=$OUT/smoke/$rung"
      done ;;
    bench)
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --compile --out "$OUT/throughput.csv"
      # what the padded vocabulary alone gives: the same compiled steps with the tokenizer's 50,265 rows
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours --compile --vocab-multiple 1 \
        --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 512 --impl ours,hf --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 512 --impl ours,hf --compile --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model medium --block 128 --impl ours,hf --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model medium --block 512 --impl ours,hf --compile --out "$OUT/throughput.csv" ;;
    determinism)
      # the cost: the same steps with and without deterministic algorithms, ours and HF's (rows say which)
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --out "$OUT/throughput.csv"
      run python benchmarks/gpu_throughput.py --model base --block 128 --impl ours,hf --deterministic --out "$OUT/throughput.csv"
      # what it buys: two replicates of one learned-position cell (the path whose GPU replicates differed) agree
      for rep in a b; do
        run python train.py experiment=scale_ladder ladder=4x128 pos=learned seed=3 trainer=gpu trainer.deterministic=true \
          "${DATA_ARGS[@]}" trainer.max_steps=300 trainer.val_check_interval=100 export=false \
          "hydra.run.dir=$OUT/determinism/$rep"
      done
      run python -m outlierlab.studies.replicates "$OUT/determinism/a" "$OUT/determinism/b" ;;
    ladder)
      cells=$(( $(echo "${LADDER_RUNGS//,/ }" | wc -w) * $(echo "${LADDER_POS//,/ }" | wc -w) * $(echo $LADDER_SEEDS | wc -w) \
                * $(echo "${LADDER_OPTIMIZERS//,/ }" | wc -w) ))
      MAX_TIME=$(hms "$SECONDS_PER_CELL")
      run python train.py -m experiment=scale_ladder "ladder=$LADDER_RUNGS" "pos=$LADDER_POS" \
        "optimizer=$LADDER_OPTIMIZERS" "seed=${LADDER_SEEDS// /,}" trainer=gpu threads=1 "${DATA_ARGS[@]}" "+trainer.max_time=$MAX_TIME" \
        hydra/launcher=joblib "hydra.launcher.n_jobs=$cells" "hydra.sweep.dir=$OUT/ladder"
      run python -m outlierlab.studies.ladder "$OUT/ladder" --out "$OUT/ladder.csv" --markdown "$OUT/ladder.md" ;;
    *) echo "unknown mode $mode (pack, first, smoke, bench, determinism, ladder)" >&2; exit 2 ;;
  esac
done
