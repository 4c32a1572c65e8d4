#!/usr/bin/env bash
# The single-GPU checks behind the README's GPU section, as run on the lent GPU machine:
#   bash benchmarks/gpu_checks.sh tests|bench   (logs go to $OUT, or ./gpu-logs)
set -uo pipefail
out=${OUT:-gpu-logs}; mkdir -p "$out"
case ${1:-tests} in
  tests)
    python -m volt.env > "$out/env.txt" 2>&1; nvidia-smi >> "$out/env.txt" 2>&1
    /usr/bin/time -f "%e s wall" python train.py paths.outputs_dir=/tmp/outputs > "$out/default_run.log" 2>&1
    grep -E "accelerator=|test/acc|wall|Run directory" "$out/default_run.log" | tail -6
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_toggles.py tests/test_env.py \
      tests/callbacks tests/strategies/test_data_parallel.py 2>&1 | tee "$out/pytest_gpu.log" | tail -15
    ;;
  bench)
    for w in digits cifar; do
      python benchmarks/step_time.py --workload $w --json "$out/bench_$w.json" 2>&1 | tee "$out/bench_$w.log" | tail -7
    done
    ;;
esac
