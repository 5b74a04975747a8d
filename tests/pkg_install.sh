#!/usr/bin/env bash
# pkg_install.sh - the package the way Python users install it: a fresh venv (--system-site-packages: torch
# and the frameworks come from the system), `pip install ./python` (which compiles libzeroshard into the
# package), then examples/pytorch/fortunes_fabric.py under mpirun from a scratch directory with no
# ZEROSHARD_LIB, ZEROSHARD_PREFIX or PYTHONPATH and no build tree in sight. Every rank must have loaded the
# package and the library from the venv. The build is offline (--no-build-isolation --no-index), so
# scikit-build-core must be installed (tools/setup_tests.sh does); exits 77 (skip) saying what is missing.
# The build is the default one users get (the CUDA backend too where nvcc and NCCL are found): its three
# kernels add about half to the CPU-only build's compile time, which the test accepts to cover that path.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
skip() { echo "pkg_install: SKIP: $1"; exit 77; }
fail() { echo "pkg_install: FAIL: $1"; exit 1; }

need="torch, lightning, transformers, scikit_build_core"
err=$(python3 -c "import $need" 2>&1) ||
  skip "python3 cannot import $need (${err##*$'\n'}); bash tools/setup_tests.sh installs them"
command -v mpirun > /dev/null || skip "no mpirun (apt-get install openmpi-bin)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv
start=$SECONDS
python3 -m venv --system-site-packages "$venv" > "$tmp/venv.log" 2>&1 ||
  skip "python3 -m venv failed ($(tail -n 1 "$tmp/venv.log")); Debian/Ubuntu: apt-get install python3-venv"

echo "pkg_install: python3 -m venv: $((SECONDS - start)) s"
# the build: offline, two jobs, with the caller's library settings out of the way
start=$SECONDS
env -u ZEROSHARD_LIB -u ZEROSHARD_PREFIX -u PYTHONPATH CMAKE_BUILD_PARALLEL_LEVEL=2 \
  "$venv/bin/python" -m pip install --no-build-isolation --no-index "$src/python" \
  > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install ./python"; }
echo "pkg_install: pip install ./python into a fresh venv: $((SECONDS - start)) s"
# what the wheel held: the package's modules and the library, nothing else compiled
files=$("$venv/bin/python" -m pip show -f zeroshard | sed -n 's/^  //p')
echo "$files" | grep -qx "zeroshard/libzeroshard.so" || fail "zeroshard/libzeroshard.so not installed: $files"
[ -x "$venv/bin/zeroshard-run" ] || fail "no zeroshard-run in $venv/bin"
other=$(echo "$files" | grep -v -e '^zeroshard/.*\.py$' -e '^zeroshard/libzeroshard\.so$' -e '^zeroshard-[^/]*\.dist-info/' \
        -e '/__pycache__/' -e '^\.\./\.\./\.\./bin/zeroshard-run$')
[ -z "$other" ] || fail "the wheel holds more than the package and its library: $other"

# the example and its task, copied into a scratch directory; a wrapper reports what each rank loaded
run=$tmp/run
mkdir "$run"
cp "$src/examples/pytorch/fortunes.py" "$src/examples/pytorch/fortunes_fabric.py" "$run/" ||
  fail "examples/pytorch/fortunes_fabric.py missing"
cat > "$run/loaded.py" <<'PY'
import atexit, os, runpy, sys


def report():
    import zeroshard
    paths = {f[5].strip() for f in (l.split(None, 5) for l in open("/proc/self/maps")) if len(f) == 6}
    libs = {p for p in paths if os.path.basename(p).startswith("libzeroshard.so")}
    with open("loaded." + os.environ["OMPI_COMM_WORLD_RANK"], "w") as f:
        f.write(" ".join([zeroshard.__file__, *sorted(libs)]) + "\n")


atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
start=$SECONDS
out=$(cd "$run" && env -u ZEROSHARD_LIB -u ZEROSHARD_PREFIX -u PYTHONPATH \
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1 \
  mpirun --oversubscribe -np 2 "$venv/bin/python" loaded.py fortunes_fabric.py --strategy zeroshard_stage_2 \
    --steps 3 --dim 32 --layers 1 --seq 32 --no-eval --result "$tmp/result.json" 2>&1) ||
  { echo "$out"; fail "fortunes_fabric.py under mpirun"; }
echo "$out" | grep '^RESULT'
echo "pkg_install: the example under mpirun: $((SECONDS - start)) s"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
want="$site/zeroshard/__init__.py $site/zeroshard/libzeroshard.so"
for r in 0 1; do
  got=$(cat "$run/loaded.$r" 2> /dev/null)
  echo "pkg_install: rank $r loaded $got"
  [ "$got" = "$want" ] || fail "rank $r must load the venv's package and library: $want"
done
"$venv/bin/python" - "$tmp/result.json" <<'PY' || fail "the example's result"
import json, math, sys
row = json.load(open(sys.argv[1]))
losses = row["losses"]
assert row["world"] == 2 and len(losses) == 3 and all(math.isfinite(x) for x in losses), row
print(f"pkg_install: passed (2 ranks, losses {', '.join(f'{x:.4f}' for x in losses)})")
PY
# the launcher the wheel installs: a deepspeed.initialize script, `import deepspeed` resolved to the venv's package
cp "$here/ds_scripts/ds_loop.py" "$here/ds_scripts/ds_loop.json" "$run/"
out=$(cd "$run" && env -u ZEROSHARD_LIB -u ZEROSHARD_PREFIX -u PYTHONPATH PATH="$venv/bin:$PATH" \
  zeroshard-run -np 2 ds_loop.py --deepspeed_config ds_loop.json --out "$tmp/loop" --steps 2 2>&1) ||
  { echo "$out"; fail "zeroshard-run -np 2 ds_loop.py"; }
echo "$out" | grep -q "params-sha256" || { echo "$out"; fail "zeroshard-run: no params hash"; }
printf 'import deepspeed, importlib.metadata as m\nprint("deepspeed", m.version("deepspeed"), "from", deepspeed.__file__)\n' > "$run/which.py"
out=$(cd "$run" && env -u ZEROSHARD_LIB -u ZEROSHARD_PREFIX -u PYTHONPATH "$venv/bin/zeroshard-run" -np 1 which.py 2>&1)
echo "pkg_install: under zeroshard-run: $out"
grep -q "^deepspeed 0.19.8+zeroshard from $site/zeroshard/compat/deepspeed/__init__.py$" <<< "$out" ||
  fail "under zeroshard-run, deepspeed and its metadata must be the venv's compatibility package"
