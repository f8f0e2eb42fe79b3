#!/usr/bin/env bash
# Does pretraining pay when labels are scarce? The whole study on one GPU, in one sitting:
#   1. smoke: 40 pretraining steps, then JOBS fine-tuning runs of 40 steps side by side (each with a
#      validation), then one held-out evaluation: every GPU code path once, and the step times
#      the budgets below are divided by;
#   2. stage=pretrain on the corpus's training pages (unlabelled: pretraining reads no label) mixed
#      with synthetic ones, for about PRETRAIN_SECONDS, with the unit-class probe as a curve;
#   3. scripts/eval_pretraining.py: fine-tuning from that checkpoint and from random encoders with
#      50, 200 and all labelled real pages and with no labelled page of GENRE, two seeds each, JOBS
#      runs at a time, for about FINETUNE_SECONDS; every checkpoint scored on the held-out split.
#
#   CORPUS=data/corpus_384 WORK=outputs/gpu_study bash scripts/pretraining_study_gpu.sh
#
# FINETUNE_SECONDS=0 stops after the pretraining (no fine-tuning smoke either): the arms are then trained
# elsewhere, e.g. on the CPU with scripts/eval_pretraining.py --pretrain-ckpt <its last.ckpt>.
#
# Writes WORK/study.json (the eval_pretraining JSON), WORK/pretrain/ (the run) and WORK/timings.txt.
# docs/pretrain.md, "At GPU scale", describes the study; tests/test_eval_pretraining.py runs it on the CPU.
set -euo pipefail
CORPUS=${CORPUS:-data/corpus_384}
WORK=${WORK:-outputs/gpu_study}
JOBS=${JOBS:-16}
PRETRAIN_SECONDS=${PRETRAIN_SECONDS:-180}
FINETUNE_SECONDS=${FINETUNE_SECONDS:-240}
PRETRAIN_BATCH=${PRETRAIN_BATCH:-64}
PRETRAIN_WORKERS=${PRETRAIN_WORKERS:-12}
PRETRAIN_VALIDATIONS=${PRETRAIN_VALIDATIONS:-2}   # validations (each with the probe) after the one at step 0
GENRE=${GENRE:-python3.11-doc}
FINETUNE_SIZE=${FINETUNE_SIZE:-384}
MAX_FINETUNE_STEPS=${MAX_FINETUNE_STEPS:-1200}
SMOKE_STEPS=${SMOKE_STEPS:-40}   # at least 12: the step time is read over the last 10
# PRETRAIN_STEPS: the pretraining's length outright instead of PRETRAIN_SECONDS / the smoke's step time.
# The smoke's estimate is pessimistic on an H200: batches/s rose from ~2.5 at step 30 to ~8 after
# step 200 (docs/pretrain.md, "2,400 steps on an H200").
PRETRAIN_STEPS=${PRETRAIN_STEPS:-}
TRAINER=${TRAINER:-gpu}
EXTRA=${EXTRA:-}          # more Hydra overrides for every run (a CPU dry run: smaller pages)
EVAL_PAGES=${EVAL_PAGES:-}  # held-out pages scored per checkpoint (default: all)
PY=${PY:-python3}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
TIMES="$WORK/timings.txt"
stamp() { echo "$(date +%s) $*" | tee -a "$TIMES"; }

read -r -a EXTRA_ARGS <<< "$EXTRA"
PRETRAIN=(stage=pretrain data=corpus_mixed "trainer=$TRAINER" "paths.corpus_dir=$CORPUS" "data.batch_size=$PRETRAIN_BATCH"
          "data.num_workers=$PRETRAIN_WORKERS" trainer.enable_progress_bar=false
          callbacks.unit_probe.train_pages=96 callbacks.unit_probe.test_pages=48 "${EXTRA_ARGS[@]}")
# what every fine-tuning run adds to eval_pretraining's own data=corpus_mixed on CORPUS
FINETUNE_EXTRA=("trainer=$TRAINER" "model.image_size=$FINETUNE_SIZE" trainer.enable_progress_bar=false
                trainer.limit_val_batches=8 "${EXTRA_ARGS[@]}")
FINETUNE=(stage=finetune data=corpus_mixed "paths.corpus_dir=$CORPUS" "${FINETUNE_EXTRA[@]}")

profiled() {   # profiled DIR: the overrides that write DIR/fit-profile.txt
  echo "+trainer.profiler._target_=lightning.pytorch.profilers.SimpleProfiler" "+trainer.profiler.dirpath=$1" \
       "+trainer.profiler.filename=profile"
}
step_seconds() {   # step_seconds RUN_DIR: the step time over the run's last logged window of steps
  # (ThroughputMonitor, CUDA-synchronised); a mean over a short run would count the first steps'
  # one-off costs (CUDA init, kernel autotuning), tens of times a step on a GPU
  $PY - "$1/csv/metrics.csv" <<'EOF'
import csv, sys
rates = [float(r["train/device/batches_per_sec"]) for r in csv.DictReader(open(sys.argv[1]))
         if r.get("train/device/batches_per_sec")]
print(f"{1 / rates[-1]:.4f}")
EOF
}
validation_seconds() {   # validation_seconds PROFILE: one validation with its probe, in a SimpleProfiler report
  awk -F'|' '/UnitClassProbe.on_validation_epoch_end|SingleDeviceStrategy.validation_step/ {gsub(/[ \t]/, "", $5); t += $5}
             END {printf "%.2f\n", t}' "$1"
}

stamp "smoke: pretraining"
$PY train.py "${PRETRAIN[@]}" "trainer.max_steps=$SMOKE_STEPS" "trainer.val_check_interval=$SMOKE_STEPS" trainer.log_every_n_steps=1 \
    "paths.output_dir=$WORK/smoke/pretrain" $(profiled "$WORK/smoke/pretrain") > "$WORK/smoke_pretrain.log" 2>&1
T_PRETRAIN=$(step_seconds "$WORK/smoke/pretrain")
T_VALIDATION=$(validation_seconds "$WORK/smoke/pretrain/fit-profile.txt")
if [ "$FINETUNE_SECONDS" -gt 0 ]; then
  stamp "smoke: $JOBS fine-tuning runs side by side (pretraining step ${T_PRETRAIN}s, validation with probe ${T_VALIDATION}s)"
  pids=()
  for i in $(seq 1 "$JOBS"); do
    OMP_NUM_THREADS=1 $PY train.py "${FINETUNE[@]}" "trainer.max_steps=$SMOKE_STEPS" "trainer.val_check_interval=$SMOKE_STEPS" trainer.log_every_n_steps=1 seed=$i \
        "init.from=$WORK/smoke/pretrain/checkpoints/last.ckpt" "paths.output_dir=$WORK/smoke/finetune_$i" \
        $(profiled "$WORK/smoke/finetune_$i") > "$WORK/smoke_finetune_$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  T_FINETUNE=$(for i in $(seq 1 "$JOBS"); do step_seconds "$WORK/smoke/finetune_$i"; done | sort -g | tail -1)
  stamp "smoke: held-out evaluation (fine-tuning step ${T_FINETUNE}s with $JOBS side by side)"
  $PY - "$WORK/smoke/finetune_1/checkpoints/last.ckpt" "$CORPUS" <<'EOF' > "$WORK/smoke_eval.log" 2>&1
import sys
sys.path.insert(0, "scripts")
from eval_pretraining import evaluate_checkpoint
print(evaluate_checkpoint(sys.argv[1], sys.argv[2], 8, None)["question"])
EOF
else
  stamp "smoke done (pretraining step ${T_PRETRAIN}s, validation with probe ${T_VALIDATION}s); no fine-tuning here"
  T_FINETUNE=1
fi

# the budgets as steps: pretraining as long as PRETRAIN_SECONDS allows, fine-tuning runs of equal
# length that finish together in FINETUNE_SECONDS (16 runs: 8 arms x 2 seeds)
# pretraining validates (and probes) at its start and PRETRAIN_VALIDATIONS times, the last at its end
read -r BUDGET_PRETRAIN_STEPS FINETUNE_STEPS < <($PY - "$T_PRETRAIN" "$T_FINETUNE" "$PRETRAIN_SECONDS" "$FINETUNE_SECONDS" \
    "$JOBS" "$MAX_FINETUNE_STEPS" "$T_VALIDATION" "$PRETRAIN_VALIDATIONS" <<'EOF'
import math, sys
tp, tf, sp, sf, jobs, most, tv, nv = map(float, sys.argv[1:])
runs = 16
step = 10 * int(nv)   # the validations fall on whole steps
pretrain = max(step, int((sp - (nv + 1) * tv) / tp) // step * step)
finetune = min(int(most), max(20, int(sf / (tf * math.ceil(runs / jobs))) // 20 * 20))
print(pretrain, finetune)
EOF
)
PRETRAIN_STEPS=${PRETRAIN_STEPS:-$BUDGET_PRETRAIN_STEPS}
stamp "pretraining: $PRETRAIN_STEPS steps of $PRETRAIN_BATCH pages"
$PY train.py "${PRETRAIN[@]}" "trainer.max_steps=$PRETRAIN_STEPS" "trainer.val_check_interval=$((PRETRAIN_STEPS / PRETRAIN_VALIDATIONS))" \
    "optim.scheduler.warmup_steps=$((PRETRAIN_STEPS / 20))" "paths.output_dir=$WORK/pretrain" > "$WORK/pretrain.log" 2>&1
if [ "$FINETUNE_SECONDS" -eq 0 ]; then stamp "done (pretraining only)"; exit 0; fi
stamp "fine-tuning: 16 runs of $FINETUNE_STEPS steps, $JOBS at a time, then evaluation"
$PY scripts/eval_pretraining.py --json "$WORK/study.json" --corpus "$CORPUS" --workdir "$WORK/finetune" \
    --pretrain-ckpt "$WORK/pretrain/checkpoints/last.ckpt" --jobs "$JOBS" --seeds 0 1 --genre-package "$GENRE" \
    --steps "$FINETUNE_STEPS" --val-every "$((FINETUNE_STEPS / 4))" \
    --arms pretrained/labels-50 random/labels-50 pretrained/labels-200 random/labels-200 pretrained random \
           pretrained/genre random/genre \
    ${EVAL_PAGES:+--eval-pages "$EVAL_PAGES"} $(for o in "${FINETUNE_EXTRA[@]}"; do echo "--override=$o"; done) \
    > "$WORK/study.log" 2>&1
stamp "done"
