#!/usr/bin/env bash
# The CUDA check and Fig. 9.3 at the paper's scale, in one command on a bare GPU machine with no network.
#
# Usage: scripts/gpu_check.sh [OUT]     (default OUT: results/gpu-check; --help prints this)
#
# Paper: Shi et al. 2024, Fig. 9.3 (Llama 3.1 8B, one H100, bf16, 4K..120K tokens, k=1024, 50 new tokens)
# and Fig. 9.6 (Mistral Nemo 12B, Phi 3.5 Mini). Steps, each bounded by the time left:
#   1. versions: python, torch (with its CUDA), transformers, the GPU; OUT/versions.txt
#   2. what the machine lacks: wheels in .whl/ (if any) go to a private folder on PYTHONPATH; then a check that
#      torch >= 2.11, transformers >= 5.17 and accelerate, safetensors, tqdm, matplotlib import. This script uses
#      random-weight models only; the embedded model's first load needs transformers >= 5.23 (docs/setup.md), so
#      on a machine with an older one bring a newer transformers wheel in .whl/ before running anything on it
#   3. the device-aware tests on CUDA (`pytest -m cuda`: the CUDA half of each test that takes a device);
#      OUT/cuda-tests.log
#   4. gemfilter bench --preset paper on random-weight models (config:<arch>), each cell in a fresh worker:
#      Llama 3.1 8B with full, snapkv, gemfilter and fastkv (its official TSP layer), then snapkv-per-head,
#      then Mistral Nemo 12B and Phi 3.5 Mini as time allows. Rows go to OUT/<arch>.jsonl as they finish;
#      `gemfilter bench` with the same options on those rows writes the tables and plots (no GPU needed).
#
# GPU_CHECK_BUDGET: seconds after which no step or cell starts (default 540); a cell past it is stopped and
# left for a rerun, which measures only the missing cells (WORK keeps them). WORK: bench's folders
# (default /tmp/gpu-check). PYTHON: the interpreter (default python3).
# GPU_CHECK_SMOKE=1: a CPU dry run of this script (shrunk 2-layer models, short prompts): it checks the
# script, and its timings describe nothing.
set -u
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,/^$/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0; fi
cd "$(dirname "$0")/.."
out=${1:-results/gpu-check}
work=${WORK:-/tmp/gpu-check}
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-540}
start=$(date +%s)
mkdir -p "$out" "$work"
left() { echo $((budget - ($(date +%s) - start))); }
log() { echo "[gpu_check $(( $(date +%s) - start ))s] $*" | tee -a "$out/bench.log"; }

# 2. wheels brought along (none needed with torch 2.11 and transformers 5.17 present)
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl \
    || { echo "installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# 1. versions, and the floor this project needs
"$py" - <<'EOF' | tee "$out/versions.txt" || exit 1
import platform, sys
import torch, transformers, accelerate, safetensors, tqdm, matplotlib
from packaging.version import Version
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("transformers", transformers.__version__, "accelerate", accelerate.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", torch.cuda.get_device_name(0), f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
if Version(torch.__version__.split("+")[0]) < Version("2.11") or Version(transformers.__version__) < Version("5.17"):
    sys.exit("this project needs torch >= 2.11 and transformers >= 5.17: bring wheels in .whl/ (the header of this script)")
EOF

if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
  shape=(--layers 2 --test-shrink --device cpu --dtype fp32 --layer 1 --lengths 1100,1400 --gen-tokens 3 --topk 64)
  archs=("llama-3.1-8b 1" "phi-3.5-mini 1")
else
  shape=()
  archs=("llama-3.1-8b 15" "mistral-nemo-12b 19" "phi-3.5-mini 15")  # FastKV's official TSP layers
fi

# 3. the device-aware tests, on CUDA
log "device-aware tests (pytest -m cuda)"
timeout $(( $(left) > 30 ? $(left) / 3 : 10 )) "$py" -m pytest -q -m cuda -p no:cacheprovider -o addopts="" \
  tests/test_core.py tests/test_banded.py tests/test_methods.py tests/test_fastkv.py tests/test_archs.py \
  tests/test_variants.py tests/test_asl.py \
  2>&1 | tail -n 60 > "$out/cuda-tests.log"
log "tests: $(tail -n 1 "$out/cuda-tests.log")"

# 4. Fig. 9.3 / 9.6
bench() {  # ARCH METHODS: one gemfilter bench run, stopped when the budget is spent
  local arch=$1 methods=$2 t
  t=$(left)
  if [ "$t" -lt 20 ]; then log "skipped $arch $methods: the budget is spent"; return; fi
  log "bench $arch $methods (${t}s left)"
  timeout "$t" "$py" -m gemfilter.lab.cli bench --model "config:$arch" --preset paper "${shape[@]}" \
    --methods "$methods" --keep-going --out "$work/$arch" >>"$out/bench.log" 2>&1
  log "bench $arch $methods: exit $?"
  [ -f "$work/$arch/bench.jsonl" ] && cp "$work/$arch/bench.jsonl" "$out/$arch.jsonl"
}
for entry in "${archs[@]}"; do
  set -- $entry
  bench "$1" "full,snapkv,gemfilter,fastkv:layer=$2"
  if [ "$1" = llama-3.1-8b ]; then bench "$1" snapkv-per-head; fi
done
log "done"
