#!/usr/bin/env bash
# Runs on the lent GPU machine, from the repository root there (packed by scripts/pack_gpu_study.sh
# into .gpu/ with what that machine lacks): unpack, run scripts/pretraining_study_gpu.sh within
# STUDY_TIMEOUT, and copy what comes back to $OUT (at most 8 files: the study JSON, timings,
# the pretraining's metrics, the logs and learning curves, and the pretrained weights in bf16:
# pretrain_model_bf16.ckpt and pretrain_target_bf16.ckpt).
#
#   run(command="PRETRAIN_SECONDS=150 FINETUNE_SECONDS=180 STUDY_TIMEOUT=540 bash .gpu/run.sh", carry=[".gpu"])
#
# BENCH_OPTIM="--optimizers ..." then runs scripts/bench_optim.py --device cuda with those arguments
# (within BENCH_TIMEOUT) and brings back its JSON (its table is in logs.tar.gz).
#
# STUDY=objectives runs scripts/objectives_study_gpu.sh instead (its settings pass through: STEPS,
# BATCH, RUN_SECONDS, ...) and brings back objectives.json, the runs' metrics and logs, and per
# objective the online and EMA-target image encoders of every seed in bf16 (encoders_<arm>.pt,
# {run: {"state_dict": ...}}; `torch.save(d[run], path)` is a checkpoint init.image_encoder reads).
#
#   run(command="STUDY=objectives STEPS=800 RUN_SECONDS=480 bash .gpu/run.sh", carry=[".gpu"])
#
# BENCH_MEMORY="adamw,sngd_coordinates" also measures, beside the study, the optimizers' CUDA memory on
# model=base (scripts/bench_optim_memory.py --device cuda) and brings back bench_optim_memory_cuda.json.
set -uo pipefail
START=$(date +%s)
mkdir -p /tmp/site data
tar -C /tmp/site -xJf .gpu/site.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
tar -C data -xJf .gpu/corpus_384.tar.xz
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2;
  python3 -c "import torch, lightning, timm, transformers; print(torch.__version__, lightning.__version__, timm.__version__, transformers.__version__)"; } > /tmp/machine.txt 2>&1
cat /tmp/machine.txt
echo "setup took $(( $(date +%s) - START )) s"
if [ "${STUDY:-}" = objectives ]; then
  W=outputs/objectives
  rm -rf $W; mkdir -p $W   # a machine still warm from an earlier call keeps its runs: start clean
  if [ -n "${BENCH_MEMORY:-}" ]; then
    timeout "${BENCH_TIMEOUT:-300}" python3 scripts/bench_optim_memory.py --device cuda --world 1 --optimizers "$BENCH_MEMORY" \
        --json "$OUT/bench_optim_memory_cuda.json" > $W/bench_memory.log 2>&1 &
  fi
  WORK=$W CORPUS=data/corpus_384 bash scripts/objectives_study_gpu.sh
  echo "study rc=$? after $(( $(date +%s) - START )) s"
  wait
  cp /tmp/machine.txt $W/objectives.json "$OUT/" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" $W/*.log $W/*/csv/metrics.csv $W/*/.hydra 2>/dev/null
  python3 - "$W" <<'PY'
import glob, os, sys, torch
# the online and EMA-target image encoders of each run in bf16, one file per objective
runs = {}
for ckpt in sorted(glob.glob(os.path.join(sys.argv[1], "*_s*", "checkpoints", "last.ckpt"))):
    run = ckpt.split(os.sep)[-3]
    c = torch.load(ckpt, map_location="cpu", weights_only=False)
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in c["state_dict"].items()
          if ("image_encoder." in k and "predictor" not in k) or k.startswith("target_encoder.")}
    runs.setdefault(run.rsplit("_s", 1)[0], {})[run] = {"state_dict": sd, "global_step": c["global_step"]}
for arm, d in runs.items():
    torch.save(d, os.path.join(os.environ["OUT"], f"encoders_{arm}.pt"))
PY
  ls -la "$OUT"
  exit 0
fi
W=outputs/gpu_study
WORK=$W timeout "${STUDY_TIMEOUT:-530}" bash scripts/pretraining_study_gpu.sh
echo "study rc=$? after $(( $(date +%s) - START )) s"
if [ -n "${BENCH_OPTIM:-}" ]; then
  read -r -a BENCH_ARGS <<< "$BENCH_OPTIM"
  timeout "${BENCH_TIMEOUT:-60}" python3 scripts/bench_optim.py --device cuda --no-plots \
      --json "$OUT/bench_optim_cuda.json" "${BENCH_ARGS[@]}" > "$W/bench_optim_cuda.log" 2>&1
  echo "bench rc=$? after $(( $(date +%s) - START )) s"
fi
cp /tmp/machine.txt "$OUT/" 2>/dev/null
cp $W/study.json $W/timings.txt "$OUT/" 2>/dev/null
cp $W/pretrain/csv/metrics.csv "$OUT/pretrain_metrics.csv" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" $W/*.log $W/smoke/*/fit-profile.txt $W/smoke/*/csv/metrics.csv $W/finetune/*/csv/metrics.csv \
    $W/finetune/*/train_stdout.log $W/pretrain/.hydra $W/finetune/*/eval_real*.json 2>/dev/null
python3 - <<'PY'
import glob, os, torch
# the pretrained weights in bf16, small enough to come back: the online model (init.from reads it)
# and the EMA target encoder (for the probe's ':target') as two files, each under the 16 MiB a file
# may have; last.ckpt, or the newest validation's when the time limit came first
found = glob.glob("outputs/gpu_study/pretrain/checkpoints/last.ckpt") or \
    sorted(glob.glob("outputs/gpu_study/pretrain/checkpoints/step_*.ckpt"))[-1:]
if found:
    print("exporting", found[0])
    c = torch.load(found[0], map_location="cpu", weights_only=False)
    for part, prefix in (("model", "model."), ("target", "target_encoder.")):
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in c["state_dict"].items()
              if k.startswith(prefix)}
        torch.save({"state_dict": sd, "global_step": c["global_step"], "hyper_parameters": c["hyper_parameters"]},
                   os.path.join(os.environ["OUT"], f"pretrain_{part}_bf16.ckpt"))
PY
ls -la "$OUT"; tail -30 $W/study.log 2>/dev/null
