#!/usr/bin/env bash
# ds_compat.sh MODE LIBDIR - scripts written for DeepSpeed (tests/ds_scripts: a Trainer fine-tune with
# --deepspeed, an Accelerate loop, a deepspeed.initialize loop) run unchanged by zeroshard-run, against the same
# scripts under DeepSpeed 0.19.8's own launcher on this CPU (tools/setup_tests.sh installs it; 77 without it).
#   trainer    stage 2: losses and lr per step (1e-5), the files a user looks for in both, a resume from
#              checkpoint-3 continuing the straight run bit for bit, Seq2SeqTrainer (a subclass) bit for bit
#   trainer3   stage 3 (zero.Init, the 16-bit model save) with an evaluation: losses and eval_loss (1e-5)
#   accelerate stage 2, accumulation 3 over 16 batches an epoch (a short window at each epoch's end),
#              gather_for_metrics over a short last batch, save_state: losses (1e-5), accuracy, sample counts;
#              load_state of the first epoch's state continuing the straight run bit for bit
#   loop       stages 0-3 give one params hash; a resume from global_step4 gives the straight run's
#   loop_ds    the loop at stage 2 against DeepSpeed (1e-5)
#   torchrun   a ZeroShard script under torchrun --nproc_per_node 2 fails naming the launcher to use
#   noengine   a script that starts MPI (deepspeed.comm.get_rank) and makes no engine ends cleanly, under
#              zeroshard-run and under a plain mpirun (MPI finalised at exit); the variables zeroshard-run
#              exports; configs as JSON text and base64
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
S=$here/ds_scripts
. "$here/lib.sh"
modules=torch
case $MODE in
  trainer|trainer3) modules="torch, transformers, accelerate, deepspeed" ;;
  accelerate) modules="torch, accelerate, deepspeed" ;;
  loop_ds) modules="torch, deepspeed" ;;
esac
py_test_env ds_compat "$modules" "$LIBDIR"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
zs() { python3 -m zeroshard.run -np 2 "$@"; }
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
# DeepSpeed's launcher, 2 CPU ranks; Accelerate's CPU backend as zeroshard-run gives it (ds_site). DeepSpeed's
# CPU ranks leave their shared-memory all-reduce buffers (69 MB each) in /dev/shm: removed by port after the run.
ds() {
  local p rc=0
  p=$(port)
  PYTHONPATH=$S/ds_site ZS_ACCELERATE_CPU_PY=$here/../python/zeroshard/_accelerate_cpu.py \
    deepspeed --num_gpus 2 --no_local_rank --master_port "$p" "$@" || rc=$?
  rm -f /dev/shm/deepspeed_allreduce_buffer_*_"$p"_*
  return $rc
}
ds_accelerate() { # what `accelerate launch --use_deepspeed --deepspeed_config_file F` exports, then ds
  local f=$1
  shift
  ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_CONFIG_FILE=$f ds "$@"
}
step() { # name log command...: runs it, its output in log; a failure is counted and shown
  local name=$1 log=$2
  shift 2
  if "$@" > "$log" 2>&1; then echo "ds_compat: $name: ran"; else run_failed "$name"; grep -v '^\[rank.\]:  ' "$log" | tail -25; fi
}
cmp_runs() { local out; out=$(python3 "$here/ds_compare.py" "$@") && check ok "$out" || check no "$out"; echo "$out"; }
has_files() { # dir files...: every file is there
  local d=$1 f miss=""
  shift
  for f in "$@"; do [ -e "$d/$f" ] || miss="$miss $f"; done
  [ -z "$miss" ] && check ok "$d" || check no "missing in $d:$miss"
  [ -z "$miss" ] && echo "ds_compat: $d holds $*"
}
TR="--max_steps 6 --per_device_train_batch_size 4 --learning_rate 1e-3 --warmup_steps 2 --logging_steps 1 --report_to none"
case $MODE in
  trainer)
    step "deepspeed trainer" "$tmp/ds.log" ds "$S/clm_trainer.py" --deepspeed "$S/ds_z2.json" --output_dir "$tmp/ds" $TR --save_steps 3
    step "zeroshard-run trainer" "$tmp/zs.log" zs "$S/clm_trainer.py" --deepspeed "$S/ds_z2.json" --output_dir "$tmp/zs" $TR --save_steps 3
    cmp_runs trainer "$tmp/ds/losses.json" "$tmp/zs/losses.json" 1e-5
    for run in ds zs; do
      has_files "$tmp/$run" config.json generation_config.json model.safetensors training_args.bin
      has_files "$tmp/$run/checkpoint-6" trainer_state.json latest global_step6 model.safetensors rng_state_1.pth
    done
    # zero_to_fp32 on ZeroShard's checkpoint: the Trainer's own model.safetensors of that step (fp32), key by key
    step "zero_to_fp32" "$tmp/fp32.log" python3 -m zeroshard.zero_to_fp32 "$tmp/zs/checkpoint-6" "$tmp/fp32" --safe_serialization
    out=$(python3 -c "import sys, safetensors.torch as st, torch
a, b = st.load_file(sys.argv[1]), st.load_file(sys.argv[2])
common = sorted(set(a) & set(b))
bad = [k for k in common if not torch.equal(a[k], b[k])]
print(f'{len(common)} tensors in common, {len(bad)} differ', *bad[:3])
sys.exit(1 if bad or len(common) < len(b) - 1 else 0)" "$tmp/fp32/model.safetensors" "$tmp/zs/checkpoint-6/model.safetensors" 2>&1) &&
      check ok "$out" || check no "zero_to_fp32 against the Trainer's model.safetensors: $out"
    echo "ds_compat: zero_to_fp32 of checkpoint-6 against its model.safetensors: $out"
    mkdir "$tmp/re" && cp -r "$tmp/zs/checkpoint-3" "$tmp/re/"
    step "zeroshard-run trainer resumed" "$tmp/re.log" zs "$S/clm_trainer.py" --deepspeed "$S/ds_z2.json" --output_dir "$tmp/re" $TR --save_steps 3 --resume_from_checkpoint "$tmp/re/checkpoint-3"
    cmp_runs trainer "$tmp/zs/losses.json" "$tmp/re/losses.json" 0
    # a Trainer subclass (Seq2SeqTrainer) takes the same DeepSpeed path: the same losses, bit for bit
    step "zeroshard-run Seq2SeqTrainer" "$tmp/s2s.log" zs "$S/clm_trainer.py" --deepspeed "$S/ds_z2.json" --output_dir "$tmp/s2s" $TR --save_steps 6 --seq2seq
    grep -q '"trainer": "Seq2SeqTrainer"' "$tmp/s2s/losses.json" 2> /dev/null && check ok seq2seq || check no "not trained by Seq2SeqTrainer"
    cmp_runs trainer "$tmp/zs/losses.json" "$tmp/s2s/losses.json" 0 ;;
  trainer3)
    step "deepspeed trainer stage 3" "$tmp/ds.log" ds "$S/clm_trainer.py" --deepspeed "$S/ds_z3.json" --output_dir "$tmp/ds" $TR --save_steps 6 --do_eval
    step "zeroshard-run trainer stage 3" "$tmp/zs.log" zs "$S/clm_trainer.py" --deepspeed "$S/ds_z3.json" --output_dir "$tmp/zs" $TR --save_steps 6 --do_eval
    cmp_runs trainer "$tmp/ds/losses.json" "$tmp/zs/losses.json" 1e-5
    has_files "$tmp/zs" config.json generation_config.json model.safetensors ;;
  accelerate)
    A="--use_deepspeed --deepspeed_config_file $S/ds_accel.json"
    mkdir "$tmp/ds" "$tmp/zs"
    step "deepspeed accelerate" "$tmp/ds.log" ds_accelerate "$S/ds_accel.json" "$S/accel_loop.py" "$tmp/ds" --gas 3 --batches 16
    step "zeroshard-run accelerate" "$tmp/zs.log" zs $A "$S/accel_loop.py" "$tmp/zs" --gas 3 --batches 16
    cmp_runs accel "$tmp/ds/log.json" "$tmp/zs/log.json" 1e-5
    has_files "$tmp/zs/state1" latest random_states_0.pkl random_states_1.pkl scheduler.bin
    # load_state from the first epoch's save_state (the torch scheduler Accelerate steps itself restored beside
    # the engine's checkpoint): the second epoch as the straight run's, bit for bit
    step "zeroshard-run accelerate resumed" "$tmp/re.log" zs $A "$S/accel_loop.py" "$tmp/zs" --gas 3 --batches 16 --resume "$tmp/zs/state1" --start-epoch 1
    cmp_runs resumed "$tmp/zs/log.json" "$tmp/zs/log-resumed.json" 0 ;;
  loop)
    for s in 0 1 2 3; do
      sed "s/\"stage\": 2/\"stage\": $s/" "$S/ds_loop.json" > "$tmp/z$s.json"
      step "stage $s" "$tmp/z$s.log" zs "$S/ds_loop.py" --deepspeed_config "$tmp/z$s.json" --out "$tmp/z$s"
      h=$(grep -o 'params-sha256 [0-9a-f]*' "$tmp/z$s.log")
      echo "ds_compat: stage $s: $h"
      hashes="${hashes:-} ${h#* }"
    done
    [ "$(echo $hashes | tr ' ' '\n' | sort -u | wc -l)" = 1 ] && check ok "stages" || check no "stages 0-3 give$hashes"
    [ -d "$tmp/z2/experiment/global_step8" ] && check ok ckpt || check no "no global_step8 under the experiment folder"
    rm -rf "$tmp/z2/experiment/global_step8" && printf global_step4 > "$tmp/z2/experiment/latest"
    step "stage 2 resumed" "$tmp/re.log" zs "$S/ds_loop.py" --deepspeed_config "$tmp/z2.json" --out "$tmp/z2" --load
    cmp_runs loop "$tmp/z2/losses.json" "$tmp/z2/losses-resumed.json" 0 ;;
  loop_ds)
    step "deepspeed loop" "$tmp/ds.log" ds "$S/ds_loop.py" --deepspeed_config "$S/ds_loop.json" --out "$tmp/ds"
    step "zeroshard-run loop" "$tmp/zs.log" zs "$S/ds_loop.py" --deepspeed_config "$S/ds_loop.json" --out "$tmp/zs"
    cmp_runs loop "$tmp/ds/losses.json" "$tmp/zs/losses.json" 1e-5 ;;
  torchrun)
    printf 'import zeroshard as deepspeed\nprint("trained alone")\n' > "$tmp/script.py"
    out=$(timeout 300 torchrun --nproc_per_node 2 --master_port "$(port)" "$tmp/script.py" 2>&1)
    rc=$?
    echo "$out" | grep -m1 'RuntimeError: zeroshard'
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'started by torchrun.*zeroshard-run -np 2' <<< "$out" &&
       ! grep -q 'trained alone' <<< "$out"; then check ok torchrun; else check no "torchrun (exit $rc): $(tail -3 <<< "$out")"; fi ;;
  noengine)
    # each rank also leaves a file: mpirun may interleave the ranks' output mid-line, so "rank 1" is not grepped
    printf 'import os, sys, deepspeed\nr = deepspeed.comm.get_rank()\nprint("rank", r, "of", deepspeed.comm.get_world_size())\nprint("env", *(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")))\nopen(os.path.join(sys.argv[1], f"seen.{r}"), "w").write(" ".join(["env"] + [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")]))\n' > "$tmp/a.py"
    # the variables torchrun and DeepSpeed's launcher export, from MPI; DeepSpeed's launcher flags taken
    out=$(zs --no_local_rank --master_port 29917 "$tmp/a.py" "$tmp" 2>&1)
    [ "$(cat "$tmp/seen.0" 2>&1)" = "env 0 2 0 2 29917" ] && [ "$(cat "$tmp/seen.1" 2>&1)" = "env 1 2 1 2 29917" ] &&
      check ok env || check no "zeroshard-run's exported variables: $(cat "$tmp"/seen.* 2>&1); $out"
    printf 'import os, sys, zeroshard.comm\nr = zeroshard.comm.get_rank()\nprint("rank", r)\nopen(os.path.join(sys.argv[1], f"seen.{r}"), "w").close()\n' > "$tmp/b.py"
    for run in "zs $tmp/a.py $tmp" "mpirun --oversubscribe -np 2 python3 $tmp/b.py $tmp"; do
      rm -f "$tmp"/seen.*
      out=$($run 2>&1)
      rc=$?
      if [ $rc -eq 0 ] && [ -e "$tmp/seen.0" ] && [ -e "$tmp/seen.1" ] && ! grep -q 'exiting improperly' <<< "$out"; then
        check ok "$run"; echo "ds_compat: '$run' ended cleanly"
      else check no "'$run' (exit $rc): $(tail -5 <<< "$out")"; fi
    done
    # configs as DeepSpeed takes them besides a path (JSON text, base64 JSON, a dict), Accelerate's infinite
    # steps_per_print as "never", any other non-finite value refused naming its key
    out=$(python3 - <<'PY' 2>&1
import base64, json
from zeroshard._plan import load_config
cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
text = json.dumps(cfg)
assert load_config(text) == cfg, "JSON text"
assert load_config(base64.urlsafe_b64encode(text.encode()).decode()) == cfg, "base64 JSON"
assert load_config(dict(cfg, steps_per_print=float("inf")))["steps_per_print"] == 0, "steps_per_print inf"
try:
    load_config({"optimizer": {"params": {"lr": float("nan")}}})
    raise SystemExit("a NaN lr was accepted")
except ValueError as e:
    assert "optimizer.params.lr" in str(e), e
try:
    load_config("no-such-file.json")
    raise SystemExit("a missing file was accepted")
except FileNotFoundError as e:
    assert "no-such-file.json" in str(e), e
print("configs: JSON text, base64, a dict with steps_per_print infinity; NaN and a missing file named")
PY
)
    echo "ds_compat: $out"
    grep -q '^configs:' <<< "$out" && check ok configs || check no "configs: $out" ;;
  *) echo "ds_compat.sh: unknown mode $MODE"; exit 2 ;;
esac
finish "ds_compat $MODE"
