#!/usr/bin/env bash
# The geometry toolbox on the bundled all-MiniLM-L6-v2: anisotropy with rogue-dimension shares,
# IsoScore / IsoScore*, query/key outlier features, for every transform; shipped Persuasion sentences (first 2000),
# offline, ~5 min on 2 CPU cores.  Output: docs/geometry/minilm/ (CSV, report.md, PNG), quoted in docs/geometry.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/geometry/minilm
rm -rf "$out"
python evaluate.py 'analyses=[anisotropy,isotropy,qk_outliers]' \
  'transform=[none,clip,whiten,standardize,abtt,center]' \
  progress=false tensorboard=false seed=0 hydra.run.dir="$out"
rm -rf "$out/.hydra" "$out/results.json" "$out/evaluate.log"   # the command and settings: report.md header
# the two long tables committed as xz (pandas reads them as they are): a third of a megabyte instead of one
xz -9e --force "$out/anisotropy_contributions.csv" "$out/qk_outliers.csv"
