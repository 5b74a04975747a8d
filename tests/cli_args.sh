#!/usr/bin/env bash
# cli_args.sh MLP GPT DATA [DS_CONFIGS] - both example programs' command lines: --help lists every flag and
# exits 0, a malformed number exits 2 with one error line naming its flag, and a public-style config whose
# batch, optimizer and scheduler values are "auto" trains on the programs' defaults. DS_CONFIGS (the
# public configs, when present) adds Hugging Face's zero2 and zero3 files themselves; zs-train-gpt's --top-k,
# --top-p, --prompt and --repetition-penalty sampling last.
set -u
MLP=$1 GPT=$2 DATA=$3 DS=${4:-}
. "$(dirname "$0")/lib.sh"

for prog in "$MLP" "$GPT"; do
  p=$(basename "$prog")
  out=$("$prog" --help 2>&1); rc=$?
  flags=$(echo "$out" | grep -c '^  --')
  echo "$p --help: rc $rc, $flags flags listed"
  [ $rc -eq 0 ] && echo "$out" | grep -q -- '--steps N' && echo "$out" | grep -q -- '--config PATH' &&
    echo "$out" | grep -q -- '--help' && r=ok || r=bad
  check $r "$p --help: rc $rc: $out"
  for bad in "--steps abc" "--steps 12x" "--lr 1e-3q" "--micro-batch -"; do
    out=$("$prog" --config x.json $bad 2>&1); rc=$?
    flag=${bad%% *}
    echo "$p $bad: rc $rc: $out"
    [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c "^zeroshard: error: $flag: expected")" = 1 ] && r=ok || r=bad
    check $r "$p $bad: rc $rc (want 2 and one error naming $flag): $out"
  done
done

# every batch, optimizer and scheduler value "auto": the programs' defaults fill them
cat > "$tmp/auto.json" <<'JSON'
{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
 "gradient_clipping": "auto", "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
               "warmup_num_steps": "auto", "total_num_steps": "auto"}},
 "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}}
JSON
configs="$tmp/auto.json"
for f in 01_huggingface_transformers_ds_config_zero2.json 02_huggingface_transformers_ds_config_zero3.json; do
  [ -n "$DS" ] && [ -f "$DS/$f" ] && configs="$configs $DS/$f"
done
gpt_small="--data $DATA --steps 4 --layers 1 --dim 16 --heads 2 --ctx 8 --sample 0 --val-batches 1"
for c in $configs; do
  out=$(mpirun --oversubscribe -np 2 "$MLP" --config "$c" --steps 4 --quiet 2>&1); rc=$?
  echo "zs-train-mlp $(basename "$c"): rc $rc, $(echo "$out" | grep '^step 4 ')"
  [ $rc -eq 0 ] && echo "$out" | grep -q '^step 4 loss' && r=ok || r=bad
  check $r "zs-train-mlp with $c: rc $rc: $out"
  out=$(mpirun --oversubscribe -np 2 "$GPT" --config "$c" $gpt_small --quiet 2>&1); rc=$?
  echo "zs-train-gpt $(basename "$c"): rc $rc, $(echo "$out" | grep '^step 4 ' | cut -c1-60)"
  [ $rc -eq 0 ] && echo "$out" | grep -q '^step 4 loss' && r=ok || r=bad
  check $r "zs-train-gpt with $c: rc $rc: $out"
done
# a flag overrides the default that fills "auto": --micro-batch 3 at 2 ranks is a global batch of 6
out=$(mpirun --oversubscribe -np 2 "$GPT" --config "$tmp/auto.json" $gpt_small --micro-batch 3 2>&1); rc=$?
echo "$out" | grep -q '^zeroshard: stage 3, world 2, micro-batch 3, gradient accumulation 1, train batch 6,' &&
  r=ok || r=bad
echo "zs-train-gpt --micro-batch 3: rc $rc, $(echo "$out" | grep -m1 -o 'micro-batch 3.*train batch [0-9]*')"
check $r "--micro-batch 3 did not give a global batch of 6: $out"
# --top-k: 1 keeps only the likeliest byte, so its sample at temperature 1 is the greedy one (temperature
# 1e-9), which differs from the full distribution's; 256 is all bytes (as 0); outside 0-256 is refused
sample() {
  mpirun --oversubscribe -np 1 "$GPT" --config "$tmp/auto.json" ${gpt_small/--sample 0/--sample 64} --quiet "$@" 2>&1 |
    sed -n '/^sample (/,/^--- end of sample/p' | sed '1d'
}
k1=$(sample --temperature 1 --top-k 1); greedy=$(sample --temperature 1e-9); all=$(sample --temperature 1)
k256=$(sample --temperature 1 --top-k 256)
echo "zs-train-gpt sample, top-k 1: $(echo "$k1" | head -c 40 | tr '\n' '|'); all bytes: $(echo "$all" | head -c 40 | tr '\n' '|')"
[ -n "$k1" ] && [ "$k1" = "$greedy" ] && [ "$k1" != "$all" ] && [ "$k256" = "$all" ] && r=ok || r=bad
check $r "--top-k 1 is not the greedy sample, or --top-k 256 not the full one: k1 '$k1' greedy '$greedy' all '$all' k256 '$k256'"
# --top-p: a nucleus of 1e-9 keeps only the likeliest byte (the greedy sample), 1 keeps every byte, 0.5 is
# neither; outside (0, 1] is refused
p0=$(sample --temperature 1 --top-p 1e-9); p1=$(sample --temperature 1 --top-p 1)
p5=$(sample --temperature 1 --top-p 0.5)
echo "zs-train-gpt sample, top-p 0.5: $(echo "$p5" | head -c 40 | tr '\n' '|')"
[ "$p0" = "$greedy" ] && [ "$p1" = "$all" ] && [ "$p5" != "$all" ] && [ "$p5" != "$greedy" ] && r=ok || r=bad
check $r "--top-p 1e-9 is not the greedy sample, 1 not the full one, or 0.5 one of them: p0 '$p0' p1 '$p1' p5 '$p5'"
# --prompt: printed before the sample, and a prompt that is an earlier sample's beginning continues that
# sample byte for byte (each byte's draw is indexed by its position in the text), which no prompt does;
# 40 steps at lr 1e-2 make the 8 likeliest bytes printable ones (a '?' in the prompt would not be the byte)
fit="--steps 40 --lr 1e-2 --temperature 1 --top-k 8"
long=$(sample $fit --prompt "Th")
head=${long:0:24}
cont=$(sample $fit --prompt "$head" --sample 42)
none=$(sample $fit --sample 64)
echo "zs-train-gpt --prompt Th: $(echo "$long" | head -c 40 | tr '\n' '|'); continued from '$(echo "$head" | tr '\n' '|')'"
[ "${long:0:2}" = "Th" ] && [ "${head#*\?}" = "$head" ] && [ "$cont" = "$long" ] && [ "$none" != "$long" ] &&
  r=ok || r=bad
check $r "--prompt: not printed first, or the continuation differs: long '$long' cont '$cont' none '$none'"
# --repetition-penalty: this tiny model's greedy sample without it is one byte over and over; with the
# default (1.5 over a window of 16) no byte runs past the window, which the penalty guarantees
rep0=$(sample --temperature 1 --top-k 1 --repetition-penalty 0); rep=$(sample --temperature 1 --top-k 1)
echo "zs-train-gpt greedy sample, no repetition penalty: $(echo "$rep0" | head -c 40 | tr '\n' '|')"
echo "zs-train-gpt greedy sample, the default penalty: $(echo "$rep" | head -c 40 | tr '\n' '|')"
echo "$rep0" | grep -qE '(.)\1{16}' && ! echo "$rep" | grep -qE '(.)\1{16}' && r=ok || r=bad
check $r "--repetition-penalty: the greedy sample without it is not a long run, or with it still is: '$rep0' '$rep'"
for bad in "--top-k -1" "--top-k 257" "--top-p 0" "--top-p 1.01" "--top-p -0.5" "--repetition-penalty -1" \
           "--repetition-window 0"; do
  out=$("$GPT" --config x.json $bad 2>&1); rc=$?
  flag=${bad%% *}
  echo "zs-train-gpt $bad: rc $rc: $out"
  [ $rc -eq 2 ] && echo "$out" | grep -q "^zeroshard: error: $flag" && r=ok || r=bad
  check $r "$bad: rc $rc (want 2 and an error naming $flag): $out"
done
finish "cli_args"
