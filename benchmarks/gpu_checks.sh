#!/usr/bin/env bash
# The GPU checks behind the README's GPU sections, as run on the lent GPU machines (multi, scaling,
# ddp-compiled, syncbn, gpt, gpt-rounds, gpt-1b, gpt-1b-resume, gpt-trace and sweeps need two GPUs;
# gpt-trace runs on one with TRAINERS=gpu):
#   bash benchmarks/gpu_checks.sh tests|syncs|bench|multi|mission|throughput|scaling|ddp-compiled|syncbn|gpt|gpt-rounds|gpt-1b|gpt-1b-resume|gpt-trace|gpt-host|sweeps|trace|hooks|epochs|pairs
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
  multi)  # two GPUs (issue #23): the whole GPU suite, pytest stopping at SIGTERM, and the
          # README's commands on one GPU against two
    start=$(date +%s)
    timeout -k 10 "${SUITE_TIMEOUT:-480}" python -m pytest -m gpu -q -rfE --durations=12 \
      -p no:cacheprovider tests 2>&1 | tee "$out/pytest_gpu.log" | tail -30
    echo "GPU suite: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py > "$out/pytest_sigterm.log" 2>&1 &
    pid=$!; sleep "${SIGTERM_AFTER:-30}"; kill -TERM $pid; sent=$(date +%s)
    wait $pid; echo "pytest after SIGTERM: exit $? within $(( $(date +%s) - sent )) s"
    tail -2 "$out/pytest_sigterm.log"
    bash "$0" mission
    ;;
  mission)  # the README's commands on one GPU and on two: wall time and training samples/s
    python benchmarks/fake_cifar10.py /tmp/data
    quiet="paths.outputs_dir=/tmp/outputs callbacks.progress_bar=null"
    for job in "precision=16-mixed" "experiment=cifar10_resnet data.root=/tmp/data trainer.max_epochs=4"; do
      for t in gpu ddp; do
        log="$out/mission_${t}_$(echo "$job" | cut -c1-12 | tr -c 'a-z0-9\n' _).log"
        SECONDS=0
        timeout -k 10 240 python train.py trainer=$t $job $quiet > "$log" 2>&1
        code=$?
        rates=$(grep -oE "epoch [0-9]+: [0-9]+ training samples/s" "$(sed -n 's/^Run directory: //p' "$log")/train.log" | tail -2 | tr '\n' ' ')
        echo "$t $job: exit $code, $SECONDS s wall, $rates"
      done
    done
    ;;
  throughput)  # CIFAR-sized training throughput: one GPU, ddp, dp (same global batch 256)
    python benchmarks/fake_cifar10.py /tmp/data
    for t in gpu ddp dp; do
      timeout ${THROUGHPUT_TIMEOUT:-150} python train.py experiment=cifar10_resnet data.root=/tmp/data trainer=$t precision=bf16-mixed \
        trainer.max_epochs=3 test=false data.num_workers=8 callbacks.progress_bar=null \
        paths.outputs_dir=/tmp/outputs > "$out/throughput_$t.log" 2>&1
      echo "$t: $(grep -oE "epoch [0-9]+: [0-9]+ training samples/s" "$(sed -n 's/^Run directory: //p' "$out/throughput_$t.log")/train.log" | tr '\n' ' ')"
    done
    ;;
  scaling)  # two GPUs (issue #23): synthetic, plain and volt, eager and compiled, 1 vs 2 GPUs,
            # 256 samples per GPU; rewrites the README's table
    python benchmarks/fake_cifar10.py /tmp/data
    python benchmarks/ddp_scaling.py --root /tmp/data --batch-per-gpu 256 --readme \
      --json "$out/scaling.json" 2>&1 | grep --line-buffered -vi warn | tee "$out/scaling.log" | tail -16
    cp docs/many_gpus.md "$out/"
    ;;
  ddp-compiled)  # two GPUs (issue #40): the compiled synthetic DDP loop was slower than its eager
                 # one, with DDP warning that gradient strides do not match its buckets (inductor
                 # lays compiled convolutions out channels-last; the weights and buckets are not):
                 # as is, with inductor's layout optimisation off, and with channels-last weights
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    for variant in as-is layout-off channels-last; do
      flags=(); env=()
      [ $variant = layout-off ] && env=(TORCHINDUCTOR_LAYOUT_OPTIMIZATION=0)
      [ $variant = channels-last ] && flags=(--channels-last)
      env "${env[@]}" timeout -k 10 "${RUN_TIMEOUT:-300}" python benchmarks/ddp_scaling.py \
        --root /tmp/data --batch-per-gpu 256 --runs synthetic:off synthetic:default "${flags[@]}" \
        --json "$out/ddp_compiled_$variant.json" > "$out/ddp_compiled_$variant.log" 2>&1
      echo "$variant: exit $?, stride warnings $(grep -c 'strides do not match' \
        "$out/ddp_compiled_$variant.log"), $(grep -h '^{' "$out/ddp_compiled_$variant.log" \
        | tr '\n' ' ')"
    done
    ;;
  syncbn)  # two GPUs (issue #40): SyncBatchNorm in eager mode against CUDA graphs, the cifar10
            # ResNet at 256 per GPU: the synthetic loop with per-GPU BatchNorm and with volt's,
            # volt's trainer=ddp (its SyncBatchNorm, the default), each eager and reduce-overhead
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    scaling="python benchmarks/ddp_scaling.py --root /tmp/data --batch-per-gpu 256 --n-only"
    for sides in "none synthetic" "volt synthetic" "volt volt_syncbn"; do
      set -- $sides
      log="$out/syncbn_${2}_bn_$1"
      timeout -k 10 "${RUN_TIMEOUT:-240}" $scaling --sync-bn "$1" --runs "$2:off" \
        "$2:reduce-overhead" --json "$log.json" > "$log.log" 2>&1
      echo "$2, BatchNorm sync $1: exit $?, $(grep -h '^{' "$log.log" | tr '\n' ' ')"
    done
    ;;
  gpt)  # two GPUs (issue #24): the GPT task under ddp and fsdp beside a plain DDP loop, then the
        # largest GPT each trains; rewrites the README's table from both
    # TORCH_LOGS=recompiles: each run's log says where torch.compile compiled again after its
    # first graph (issue #40: volt's first run on a fresh machine lost 20% to compilation)
    TORCH_LOGS=recompiles python benchmarks/gpt_scaling.py --json "$out/gpt_throughput.json" \
      --work /tmp/gpt-scaling
    python benchmarks/gpt_scaling.py --runs --largest --json "$out/gpt_largest.json" \
      --work /tmp/gpt-scaling
    python benchmarks/gpt_scaling.py --report "$out"/gpt_*.json --readme
    cp /tmp/gpt-scaling/*.log docs/many_gpus.md "$out/" 2>/dev/null
    ;;
  gpt-rounds)  # two GPUs (issue #40): the GPT under ddp and fsdp beside the plain DDP loop in ROUNDS
              # rounds (2), the order reversed every other round, volt / plain per round: each
              # run about 75-90 s on 2 x H200 (2026-11-29), so 2 rounds of 3 runs fill a call
              # (RUNS="plain-ddp volt-ddp" others; GPUS=1: DDP in a world of one, on one GPU;
              # BUCKET_MB=25: DDP's gradient buckets on both sides, torch's default size;
              # STEPS=400: timed steps, 8 of volt's windows; CACHE=shared: one compile cache)
    timeout -k 10 "${ROUNDS_TIMEOUT:-560}" python benchmarks/gpt_scaling.py \
      --runs ${RUNS:-plain-ddp volt-ddp volt-fsdp} ${GPUS:+--gpus $GPUS} ${BUCKET_MB:+--bucket-mb $BUCKET_MB} \
      ${STEPS:+--steps $STEPS} ${CACHE:+--compile-cache $CACHE} \
      --rounds "${ROUNDS:-2}" --timeout 120 --json "$out/gpt_rounds.json" \
      --work /tmp/gpt-rounds > "$out/gpt_rounds.log" 2>&1
    echo "gpt rounds: exit $?"; grep -E " on [0-9]+" "$out/gpt_rounds.log"
    # The tables of what was measured, also when the timeout cut the last runs
    python benchmarks/gpt_scaling.py --report "$out/gpt_rounds.json" | grep -E "^\||^- "
    ;;
  gpt-1b)  # two GPUs (issue #40): gpt_1b's net under trainer=fsdp, 16 x 1024 tokens per GPU, with
           # and without activation checkpointing (tokens/s, MFU), then its sharded checkpoint
           # against a full one (save time, host memory; benchmarks/fsdp_checkpoint.py)
    net="model.net.n_layer=24 model.net.n_head=16 model.net.n_embd=2048"
    for ac in false true; do
      timeout -k 10 "${RUN_TIMEOUT:-240}" python benchmarks/gpt_scaling.py --runs volt-fsdp \
        --warmup 10 --steps 20 --json "$out/gpt_1b_ac_$ac.json" --work /tmp/gpt-1b-$ac \
        --extra $net model.net.activation_checkpointing=$ac 2>&1 | tail -4
    done
    timeout -k 10 "${CKPT_TIMEOUT:-600}" python benchmarks/fsdp_checkpoint.py --outputs /tmp/ckpt-1b \
      --experiment gpt_bytes --devices 2 --repeats 2 -- $net data.batch_size=4 compile=off \
      2>&1 | tee "$out/gpt_1b_checkpoint.log"
    ;;
  gpt-1b-resume)  # two GPUs (issue #40): gpt_1b's sharded checkpoint saved on 2 GPUs, resumed on 1,
                  # then on 2 again: each leg's wall time and peak resident memory (GNU time: the
                  # largest process, rank 0), the checkpoint's size and where each leg began.
                  # EXPERIMENT=gpt_bytes_tiny runs the same on the CPU (2 gloo ranks), to check it.
    exp=${EXPERIMENT:-gpt_1b}; dir=/tmp/gpt-1b-resume; rm -rf "$dir"
    common="experiment=$exp trainer=fsdp name=resume data.batch_size=4 compile=off test=false
      model.scheduler.warmup_steps=1 model.scheduler.max_steps=100
      trainer.limit_val_batches=0 trainer.num_sanity_val_steps=0 callbacks.text_samples=null
      callbacks.early_stopping=null callbacks.progress_bar=null paths.outputs_dir=$dir"
    for leg in "2 2" "1 4" "2 6"; do
      set -- $leg
      log="$out/gpt_1b_resume_${1}gpus_to_step_$2.log"
      /usr/bin/time -v timeout -k 10 "${LEG_TIMEOUT:-150}" python train.py $common \
        trainer.devices=$1 trainer.max_steps=$2 > "$log" 2>&1
      echo "$1 GPU(s) to step $2: exit $(sed -n 's/^\s*Exit status: //p' "$log"), $(sed -n \
        's/^\s*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log") wall, peak RSS $(sed -n \
        's/^\s*Maximum resident set size (kbytes): //p' "$log") kB" | tee -a "$out/gpt_1b_resume.txt"
      du -sh "$dir/train/runs/resume/checkpoints/last.ckpt" >> "$out/gpt_1b_resume.txt" 2>&1
      # A finished run is not continued: as if killed after its last checkpoint (as the tests do)
      rm -f "$dir/train/runs/resume/metrics.json"
    done
    grep -hE "resuming run|starting it from|Restor|global_step|max_steps" "$dir/train/runs/resume/train.log" \
      | cut -c1-200 >> "$out/gpt_1b_resume.txt" 2>/dev/null
    ;;
  gpt-trace)  # two GPUs (issue #40): torch.profiler over 5 steps of volt's GPT after 60 (its
              # compilation) under each trainer (TRAINERS="fsdp ddp"), 16 x 1024 bytes per GPU:
              # rank 0's op table, every rank's Chrome trace gzipped, graph breaks and recompiles logged
              # (EXPERIMENT=gpt_bytes_tiny: the same on the CPU, to check the script; EXTRA="k=v ..."
              # more overrides, TAG a name for their files; GPUS=1 with TRAINERS=ddp: DDP in a world
              # of one, on one GPU), then the plain DDP loop over the same
              # steps (gpt_scaling.py --trace); each trace's steps read by trace_steps.py (host,
              # GPU busy, collectives, GPU idle). Lightning's record_module_names is off:
              # its record_function around every module's forward breaks torch.compile's graphs.
    for t in ${TRAINERS:-fsdp ddp}; do
      name=$t${TAG:+_$TAG}; dir=/tmp/gpt-trace-$name; rm -rf "$dir"
      TORCH_LOGS=graph_breaks,recompiles timeout -k 10 "${TRACE_TIMEOUT:-240}" python train.py \
        experiment=${EXPERIMENT:-gpt_bytes} trainer=$t data.batch_size=${BATCH:-$((16 * ${GPUS:-2}))} debug=profiler \
        trainer.limit_train_batches=68 trainer.profiler.schedule.wait=60 \
        trainer.profiler.profile_memory=false trainer.profiler.record_shapes=false \
        +trainer.profiler.record_module_names=false ${GPUS:+trainer.devices=$GPUS} ${EXTRA:-} \
        trainer.limit_val_batches=0 trainer.num_sanity_val_steps=0 test=false \
        callbacks.model_checkpoint=null callbacks.early_stopping=null callbacks.text_samples=null \
        paths.outputs_dir="$dir" > "$out/gpt_trace_$name.log" 2>&1
      echo "gpt $name traced: exit $?"
      profiler=$(ls -d "$dir"/train/runs/*/tensorboard/profiler 2>/dev/null | head -1)
      [ -n "$profiler" ] || { echo "gpt $name: no profiler folder (see gpt_trace_$name.log)"; continue; }
      cp "$(ls "$profiler"/fit-profile*.txt | head -1)" "$out/gpt_trace_$name.txt"  # (-0: rank 0; none on one device)
      for f in "$profiler"/*.pt.trace.json; do  # every rank's, named by host and pid
        [ -f "$f" ] || continue
        gzip -c "$f" > "$out/gpt_trace_${name}_$(basename "$f" .pt.trace.json).json.gz"
      done
    done
    # The plain DDP loop traced on every rank over the same steps as volt's runs (63-67 of each,
    # Lightning's profiler after `wait` 60 and `warmup` 2; 16 x 1024 bytes per GPU): what volt's
    # ddp trace is compared with (PLAIN=0 skips it; on one GPU: TRAINERS=gpu BATCH=16 PLAIN_RUN=plain-1)
    if [ "${PLAIN:-1}" = 1 ]; then
      dir=/tmp/gpt-trace-plain; rm -rf "$dir"; tiny=(); [ "${EXPERIMENT:-}" = gpt_bytes_tiny ] && tiny=(--tiny)
      timeout -k 10 "${TRACE_TIMEOUT:-240}" python benchmarks/gpt_scaling.py "${tiny[@]}" --runs "${PLAIN_RUN:-plain-ddp}" \
        ${GPUS:+--gpus $GPUS} --warmup 62 --steps 8 --trace "$dir" --work "$dir/work" \
        > "$out/gpt_trace_plain.log" 2>&1
      echo "gpt plain loop (${PLAIN_RUN:-plain-ddp}) traced: exit $?"
      cp "$dir"/plain-*-rank0.txt "$out/gpt_trace_plain.txt" 2>/dev/null
      for f in "$dir"/plain-*.pt.trace.json; do
        [ -f "$f" ] || continue
        gzip -c "$f" > "$out/gpt_trace_$(basename "$f" .pt.trace.json).json.gz"
      done
    fi
    # Each trace's whole steps: host, GPU, busy, collectives, idle (the header names the rank)
    python benchmarks/trace_steps.py "$out"/gpt_trace_*.json.gz | tee "$out/gpt_trace_steps.txt"
    ;;
  sweeps)  # two GPUs (issue #25): sweeps side by side, a DDP queue, an Optuna search, a failed job
          # (needs the optuna and colorlog wheels beside Hydra's)
    python benchmarks/gpu_sweeps.py --outputs /tmp/gpu-sweeps --json "$out/gpu_sweeps.json"
    cp /tmp/gpu-sweeps/*.log "$out/" 2>/dev/null
    ;;
  trace)  # issue #40: where volt's step goes beside bare Lightning's, for one perf.py row
          # (ROW="digits 32-true" or "cifar10_resnet bf16-mixed + CUDA graphs"): bare Lightning
          # and volt, the host's waits, cProfile and torch.profiler traces (the synthetic side's
          # too), then volt with each default callback left out (PARTS="" skips those). Each result is
          # appended to $out/trace_<row>.txt as it comes (a pipe's buffer lost all of them when a
          # timeout struck, 2026-11-28).
    row=${ROW:-digits 32-true}; tag=$(echo "$row" | tr -c 'a-z0-9\n' _); txt="$out/trace_$tag.txt"
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    perf() { timeout -k 10 "${SIDE_TIMEOUT:-300}" python benchmarks/perf.py --data-root /tmp/data --only "$row" "$@" 2>>"$out/trace_$tag.err"; }
    ms() { python -c 'import json,sys,statistics as s
for line in filter(lambda line: line.startswith("{"), sys.stdin):
    for side, r in json.loads(line)["results"].items():
        ms = r["ms"]; print(f"  {side}: {s.median(ms):.3f} ms/step, windows {[round(m, 3) for m in ms]}")'; }
    say() { echo "$@" | tee -a "$txt"; }
    # The traces first: on 2026-11-28 the leave-one-out runs below took the whole call's time
    # and moved the step by less than the runs' own noise. The lent machines send back at most 8
    # files, so the traces' folders go back as one tarball.
    say "$row, both sides:"; perf --sides lightning volt | ms | tee -a "$txt"
    perf --find-syncs --steps 20 | tee -a "$txt"
    perf --profile "$out/profile_$tag" > /dev/null
    perf --steps 20 --repeats 1 --trace "$out/trace_$tag" > /dev/null
    perf --sides synthetic --steps 20 --repeats 1 --trace "$out/trace_$tag" > /dev/null
    head -qn 1 "$out/profile_$tag"/*.txt "$out/trace_$tag"/*.txt | tee -a "$txt"
    gzip -f "$out/trace_$tag"/*.json
    tar czf "$out/traces_$tag.tgz" -C "$out" --remove-files "profile_$tag" "trace_$tag"
    parts=${PARTS-model_summary progress_bar lr_monitor gpu_memory throughput grad_norm finite_guard graceful_shutdown garbage_collection}
    for part in $parts; do
      say "volt less callbacks.$part:"; perf --sides volt --extra "callbacks.$part=null" | ms | tee -a "$txt"
    done
    if [ -n "$parts" ]; then
      say "volt less its logger:"; perf --sides volt --extra logger=none | ms | tee -a "$txt"
      # (not callbacks=none: perf.py sets callbacks.model_checkpoint, which that option lacks)
      say "volt less all of these and its logger:"
      perf --sides volt --extra $(printf 'callbacks.%s=null ' $parts) logger=none | ms | tee -a "$txt"
    fi
    ;;
  hooks)  # issue #40: each hook's µs a step on the GPU's host, after a warm-up (hook_cost.py):
          # digits, digits logging at every step (what a logging step costs), the CUDA-graphs ResNet
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    hooks() { name=$1; shift; timeout -k 10 "${RUN_TIMEOUT:-120}" python benchmarks/hook_cost.py \
      "$@" > "$out/hooks_$name.txt" 2>&1; grep -E "fit:|µs a step" "$out/hooks_$name.txt" | head -12; }
    hooks digits --steps 2000 --warmup 200
    hooks digits_every_step --steps 1000 --warmup 200 --every-step
    hooks resnet_graphs --steps 700 --warmup 100 experiment=cifar10_resnet data.root=/tmp/data \
      data.download=false precision=bf16-mixed compile=reduce-overhead
    ;;
  gpt-host)  # issue #40, one GPU: the GPT's host cost a step under each trainer (TRAINERS="gpu ddp
             # fsdp"), DDP and FSDP in a world of one, 2 x 1024 tokens (too little for the GPU to
             # hide the host): each hook's µs, and cProfile's top functions (hook_cost.py --profile;
             # every figure holds cProfile's own cost), the profiles kept for pstats
    for t in ${TRAINERS:-gpu ddp fsdp}; do
      devices=""; [ "$t" = gpu ] || devices=trainer.devices=1
      timeout -k 10 "${RUN_TIMEOUT:-150}" python benchmarks/hook_cost.py experiment=gpt_bytes \
        data.batch_size=2 trainer=$t $devices --warmup 60 --steps 300 --profile "$out/gpt_host_$t.prof" \
        > "$out/gpt_host_$t.txt" 2>&1
      echo "gpt $t: exit $?"; grep -E "fit:|µs a step" "$out/gpt_host_$t.txt" | head -8
    done
    ;;
  epochs)  # issue #40: what an epoch's end and start cost the host, bare Lightning and volt, on
          # ROW (default the CUDA-graphs ResNet): torch.profiler over 300 steps after the warm-up,
          # two epoch starts (every 175 steps); each trace's text opens with the longest gaps
          # between optimizer steps and the ops in them (the same perf.py run took 2 minutes on
          # one H200, 2026-11-29)
    row=${ROW:-cifar10_resnet bf16-mixed + CUDA graphs}
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    rm -rf /tmp/epoch_traces
    timeout -k 10 "${ROW_TIMEOUT:-300}" python benchmarks/perf.py --data-root /tmp/data \
      --only "$row" --sides lightning volt --steps 300 --repeats 1 --trace /tmp/epoch_traces \
      > "$out/epochs.jsonl" 2> "$out/epochs.err"
    echo "epochs: exit $?"
    for f in /tmp/epoch_traces/*.txt; do [ -f "$f" ] && head -n 7 "$f" && cp "$f" "$out/"; done
    ;;
  pairs)  # issue #40: volt's step over bare Lightning's, measured in rounds that alternate the
          # sides' order (L V, V L, L V), on the rows the CPU bounds: the host's speed drifts by 20%
          # or more between runs minutes apart, so only sides measured side by side compare
          # (2026-11-29); the eager ResNet beside its synthetic side too (95% of it is #40's target)
          # A row takes 2 to 6 minutes on one H200 (2026-11-29): within a 10-minute call, name one
          # or two in ROWS (a |-separated list of perf.py's row names).
    python benchmarks/fake_cifar10.py /tmp/data > /dev/null
    IFS='|' read -ra rows <<< "${ROWS:-digits 32-true|cifar10_resnet bf16-mixed|cifar10_resnet bf16-mixed + CUDA graphs}"
    for row in "${rows[@]}"; do
      sides="lightning volt"; [ "$row" = "cifar10_resnet bf16-mixed" ] && sides="synthetic $sides"
      timeout -k 10 "${ROW_TIMEOUT:-540}" python benchmarks/perf.py --data-root /tmp/data \
        --only "$row" --sides $sides --steps "${STEPS:-200}" --repeats "${REPEATS:-5}" \
        --rounds "${ROUNDS:-3}" 2>>"$out/pairs.err" | tee -a "$out/pairs.jsonl" \
        | python -c 'import json,sys,statistics as s
for r in map(json.loads, filter(lambda line: line.startswith("{"), sys.stdin)):
    for side, v in r["results"]["volt"].get("paired", {}).items():  # (ROUNDS=1: none)
        print(r["row"]["workload"], r["row"]["variant"], f"volt / {side} by round:",
              [round(x, 3) for x in v], "median", round(s.median(v), 3))'
    done
    ;;
  syncs)  # where volt's configured training steps make the CPU wait for the GPU
    python benchmarks/perf.py --steps 20 --find-syncs 2>&1 | grep --line-buffered -vi warn \
      | tee "$out/syncs.log" | tail -12
    ;;
  bench)  # the README's performance table (about 7 minutes on one H100)
    python benchmarks/perf.py --readme --json "$out/perf.json" 2>&1 | grep --line-buffered -vi warn \
      | tee "$out/perf.log" | tail -8
    cp docs/performance.md "$out/"
    ;;
esac
