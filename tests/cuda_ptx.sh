#!/usr/bin/env bash
# cuda_ptx.sh PTX... - the CUDA kernels as built (same flags, PTX) do IEEE arithmetic only: every fp32 add,
# subtract and multiply rounds on its own (.rn: never contracted into an fma the source did not write),
# division and square root are the correctly rounded .rn forms, and nothing flushes subnormals (.ftz) or
# approximates (.approx). What makes a GPU step give the CPU's bits, checked where no GPU runs.
set -u
fail=0
for f in "$@"; do
  name=$(basename "$f")
  loose=$(grep -cE '\b(add|sub|mul)\.f(32|64)\b' "$f")
  flush=$(grep -cE '\.(ftz|approx)\b' "$f")
  fma=$(grep -cE '\bfma\.rn\.f32\b' "$f")
  div=$(grep -cE '\bdiv\.rn\.f32\b' "$f")
  sqrt=$(grep -cE '\bsqrt\.rn\.f32\b' "$f")
  echo "$name: fma.rn $fma, div.rn $div, sqrt.rn $sqrt, contractible add/sub/mul $loose, ftz/approx $flush"
  [ "$loose" = 0 ] && [ "$flush" = 0 ] || { echo "FAIL: $name has arithmetic that is not IEEE round-to-nearest"; fail=1; }
  grep -E '\b(add|sub|mul)\.f(32|64)\b|\.(ftz|approx)\b' "$f" | head -3
done
case " $* " in
  *optim_cuda*) ;;
  *) echo "FAIL: no optim_cuda PTX given"; fail=1 ;;
esac
[ $fail = 0 ] && echo "cuda_ptx: $# files, IEEE only" || exit 1
