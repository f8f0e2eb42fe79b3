#!/usr/bin/env bash
# Which pretraining objective moves the image encoder? Image-only I-JEPA (`stage=ijepa`), MIM alone
# (`stage=pretrain` with D-JEPA and MLM off) and the joint D-JEPA + MLM + MIM (`stage=pretrain`), each at
# every seed of SEEDS, all side by side on one GPU, on the same pages (data=corpus_mixed on CORPUS),
# steps and batch; the unit-class probe (PROBE_PAGES: 96 training / 48 held-out pages) at the start and
# VALIDATIONS times more, the last at the end of each run. A run still going after RUN_SECONDS gets SIGTERM (Lightning stops at its next
# step and keeps the metrics so far; SIGINT would be ignored by a job started in the background), so
# a slower machine gives shorter curves, not none.
#
#   CORPUS=data/corpus_384 WORK=outputs/objectives STEPS=800 bash scripts/objectives_study_gpu.sh
#   TRAINER=cpu STEPS=4 BATCH=2 WORKERS=0 EXTRA="model.image_size=128" ...     # a CPU dry run
#
# An arm is an objective with optional variants after dashes, e.g. ARMS="ijepa ijepa-rope djepa-rope-small":
# rope = rotary positions in the predictor (model.predictor.positions=rope); small = target blocks of
# 1-2 units (target_scale 0.015-0.035 of the page, no context floor).
#
# Writes WORK/<arm>_s<seed>/ (each run: csv/metrics.csv, checkpoints/), WORK/<arm>_s<seed>.log and
# WORK/objectives.json (per run: the probe curves, the last `unexplained` and MLM accuracy, steps/s).
# docs/pretrain.md, "Three objectives at GPU scale", has the result.
set -uo pipefail
CORPUS=${CORPUS:-data/corpus_384}
WORK=${WORK:-outputs/objectives}
STEPS=${STEPS:-800}
BATCH=${BATCH:-32}
WORKERS=${WORKERS:-2}
VALIDATIONS=${VALIDATIONS:-2}   # validations (each with the probe) after the one at step 0, the last at the end
PROBE_PAGES=${PROBE_PAGES:-96 48}   # the probe's training and held-out pages
SEEDS=${SEEDS:-0 1}
ARMS=${ARMS:-ijepa mim djepa}
TRAINER=${TRAINER:-gpu}
RUN_SECONDS=${RUN_SECONDS:-480}
EXTRA=${EXTRA:-}
PY=${PY:-python3}
mkdir -p "$WORK"
read -r -a EXTRA_ARGS <<< "$EXTRA"

overrides() {   # overrides ARM: the stage and losses that make the objective, then those of its variants
  local objective=${1%%-*} variants=() v
  [ "$objective" != "$1" ] && IFS=- read -r -a variants <<< "${1#*-}"
  case "$objective" in
    ijepa) echo -n "stage=ijepa" ;;
    mim) echo -n "stage=pretrain task.loss.djepa=0 task.loss.mlm=0" ;;
    djepa) echo -n "stage=pretrain" ;;
    *) echo "unknown objective '$objective' in arm '$1': ijepa, mim or djepa" >&2; return 2 ;;
  esac
  for v in "${variants[@]}"; do
    case "$v" in
      rope) echo -n " model.predictor.positions=rope" ;;   # rotary positions in the predictor
      small) echo -n " data.image_masking.target_scale=[0.015,0.035] data.image_masking.min_keep=0" ;;  # 1-2-unit targets
      *) echo "unknown variant '$v' in arm '$1': rope or small" >&2; return 2 ;;
    esac
  done
  echo
}

pids=(); names=()
for arm in $ARMS; do
  read -r -a ARM_ARGS <<< "$(overrides "$arm")" || exit 2
  for seed in $SEEDS; do
    run="${arm}_s${seed}"
    # one OpenMP thread each: the runs share the machine's cores with each other's loader workers
    OMP_NUM_THREADS=1 timeout -k 30 "$RUN_SECONDS" $PY train.py "${ARM_ARGS[@]}" data=corpus_mixed "trainer=$TRAINER" \
        "paths.corpus_dir=$CORPUS" "data.batch_size=$BATCH" "data.num_workers=$WORKERS" "seed=$seed" \
        "trainer.max_steps=$STEPS" "trainer.val_check_interval=$((STEPS / VALIDATIONS))" \
        "optim.scheduler.warmup_steps=$((STEPS / 20 > 0 ? STEPS / 20 : 1))" trainer.enable_progress_bar=false \
        "callbacks.unit_probe.train_pages=${PROBE_PAGES% *}" "callbacks.unit_probe.test_pages=${PROBE_PAGES#* }" \
        "paths.output_dir=$WORK/$run" "${EXTRA_ARGS[@]}" > "$WORK/$run.log" 2>&1 &
    pids+=($!); names+=("$run")
  done
done
failed=0
for i in "${!pids[@]}"; do   # 124: stopped at RUN_SECONDS, its curve so far kept
  wait "${pids[$i]}"; rc=$?
  if [ "$rc" -eq 124 ]; then echo "${names[$i]}: stopped after ${RUN_SECONDS} s";
  elif [ "$rc" -ne 0 ]; then echo "${names[$i]} failed (exit $rc): $WORK/${names[$i]}.log" >&2; tail -n 5 "$WORK/${names[$i]}.log" >&2; failed=1; fi
done

$PY - "$WORK" <<'EOF'
import csv, glob, json, os, sys
work = sys.argv[1]
out = {}
for metrics in sorted(glob.glob(os.path.join(work, "*_s*", "csv", "metrics.csv"))):
    run = metrics.split(os.sep)[-3]
    rows = list(csv.DictReader(open(metrics)))
    def curve(key):
        return [[int(r["step"]), round(float(r[key]), 4)] for r in rows if r.get(key)]
    last = lambda key: (curve(key) or [[None, None]])[-1][1]
    rates = curve("train/device/batches_per_sec")
    out[run] = {"probe": curve("val/probe_bacc"), "probe_target": curve("val/probe_bacc_target"),
                "unexplained": last("val/unexplained"), "mlm_acc": last("val/mlm_acc"),
                "last_step": max((int(r["step"]) for r in rows if r.get("step")), default=0),
                "batches_per_sec_last": rates[-1][1] if rates else None}
json.dump(out, open(os.path.join(work, "objectives.json"), "w"), indent=1)
print("| run | probe, online (step: value) | probe, EMA target | unexplained | MLM acc. | last step | batches/s |")
print("|---|---|---|---|---|---|---|")
for run, r in out.items():
    fmt = lambda c: " / ".join(f"{s}: {v:.3f}" for s, v in c) or "-"
    print(f"| {run} | {fmt(r['probe'])} | {fmt(r['probe_target'])} | {r['unexplained']} | {r['mlm_acc']} | "
          f"{r['last_step']} | {r['batches_per_sec_last']} |")
EOF
exit $failed
