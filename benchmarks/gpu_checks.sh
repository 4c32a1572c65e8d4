#!/usr/bin/env bash
# The single-GPU checks behind the README's GPU section, as run on the lent GPU machine:
#   bash benchmarks/gpu_checks.sh tests|syncs|bench|multi|throughput|scaling
# (logs go to $OUT, or ./gpu-logs)
set -uo pipefail
out=${OUT:-gpu-logs}; mkdir -p "$out"
case ${1:-tests} in
  tests)
    python -m volt.env > "$out/env.txt" 2>&1; nvidia-smi >> "$out/env.txt" 2>&1
    /usr/bin/time -f "%e s wall" python train.py paths.outputs_dir=/tmp/outputs > "$out/default_run.log" 2>&1
    grep -E "accelerator=|test/acc|wall|Run directory" "$out/default_run.log" | tail -6
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_build.py tests/test_gpu.py tests/test_training.py tests/test_env.py \
      tests/callbacks tests/strategies/test_data_parallel.py 2>&1 | tee "$out/pytest_gpu.log" | tail -15
    ;;
  multi)  # two GPUs: the mission command, a DDP sweep, and the multi-GPU tests
    quiet="paths.outputs_dir=/tmp/outputs callbacks.progress_bar=null"
    timeout 90 python train.py trainer=ddp precision=16-mixed $quiet > "$out/ddp_mission.log" 2>&1
    echo "mission exit $?"; grep -E "accelerator=|test/acc  |Run directory" "$out/ddp_mission.log" | tail -3
    cp /tmp/outputs/train/runs/*/train_rank1.log "$out/" 2>/dev/null
    timeout 120 python train.py -m trainer=ddp precision=bf16-mixed model.optimizer.lr=1e-3,1e-2 \
      trainer.max_epochs=5 $quiet > "$out/ddp_multirun.log" 2>&1
    echo "multirun exit $?"; ls /tmp/outputs/train/multiruns/*/; cat /tmp/outputs/train/multiruns/*/summary.csv
    bash "$0" throughput
    timeout 175 python -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/strategies \
      2>&1 | tee "$out/pytest_multi.log" | tail -12
    ;;
  throughput)  # CIFAR-sized training throughput: one GPU, ddp, dp (same global batch 256)
    python benchmarks/fake_cifar10.py /tmp/data
    for t in gpu ddp dp; do
      timeout ${THROUGHPUT_TIMEOUT:-150} python train.py experiment=cifar10_resnet data.root=/tmp/data trainer=$t precision=bf16-mixed \
        trainer.max_epochs=3 test=false data.num_workers=8 callbacks.progress_bar=null \
        paths.outputs_dir=/tmp/outputs > "$out/throughput_$t.log" 2>&1
      echo "$t: $(grep -oE "epoch [0-9]+: [0-9]+ training samples/s" "$out/throughput_$t.log" | tr '\n' ' ')"
    done
    ;;
  scaling)  # two GPUs: volt and a plain PyTorch DDP loop, 1 vs 2 GPUs, 256 samples per GPU
    python benchmarks/fake_cifar10.py /tmp/data
    for sbn in ${SYNC_BN:-volt none}; do
      python benchmarks/ddp_scaling.py --root /tmp/data --sides plain volt --gpus 1 2 \
        --batch-per-gpu 256 --sync-bn $sbn --json "$out/scaling_$sbn.json" 2>&1 \
        | grep --line-buffered -vi warn | tee "$out/scaling_$sbn.log" | tail -6
    done
    ;;
  syncs)  # where volt's configured training steps make the CPU wait for the GPU
    python benchmarks/perf.py --steps 20 --find-syncs 2>&1 | grep --line-buffered -vi warn \
      | tee "$out/syncs.log" | tail -12
    ;;
  bench)  # the README's performance table (about 7 minutes on one H100)
    python benchmarks/perf.py --readme --json "$out/perf.json" 2>&1 | grep --line-buffered -vi warn \
      | tee "$out/perf.log" | tail -8
    cp README.md "$out/README.md"
    ;;
esac
