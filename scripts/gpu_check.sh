#!/usr/bin/env bash
# Fig. 9.3 end to end on a GPU, in one command on a bare machine with no network, in order of value.
#
# Usage: scripts/gpu_check.sh [OUT]     (default OUT: results/gpu-check; --help prints this)
#
# Paper: Shi et al. 2024, Fig. 9.3 (Llama 3.1 8B, one H100, bf16, 4K..120K tokens, k=1024, 50 new tokens)
# and Fig. 9.6 (Mistral Nemo 12B, Phi 3.5 Mini). Random-weight models of the published architectures
# (config:<arch>): timing and memory only. Steps, each bounded by the time left:
#   1. versions: python, torch (with its CUDA), transformers, the GPU; OUT/versions.txt. Wheels in .whl/ (if
#      any) go to a private folder on PYTHONPATH first.
#   2. Llama 3.1 8B, compiled decoding (gemfilter bench --preset paper --compile --one-process): full, snapkv,
#      gemfilter, fastkv at its TSP layer 15, and gemfilter:chunk=8192 (the chunked filter pass) at 4K..120K;
#      OUT/llama-3.1-8b-compiled.jsonl. Each row holds the memory parts (weights, filter-pass peak, cache, peaks).
#   3. decoding against the weight-read bound: ms/token of plain generate, generate through apply(), a static
#      cache, the compiled step, and transformers' own static compiled generate, beside the bytes read per step
#      over the copy bandwidth measured there; OUT/decode.jsonl
#   4. conversations at 8B: 5 turns over a 32K context, full (prefix reuse), reselect and reuse with gemfilter,
#      reuse with snapkv, and the stable protocol with gemfilter; time to first token per turn; OUT/conversation.jsonl
#   5. the device-aware tests on CUDA (`pytest -m cuda`), the compiled and chunked ones first; OUT/cuda-tests.log
#   6. Llama 3.1 8B, eager (generate's own loop), the same four methods at 32K and 120K: the same run's
#      baseline for the compiled rows; OUT/llama-3.1-8b-eager.jsonl
#   7. Phi 3.5 Mini, then Mistral Nemo 12B, at 120K, compiled then eager; OUT/fig96.jsonl
# Everything the script prints goes to OUT/gpu_check.log too. `gemfilter bench` with the same options on the
# rows writes the tables and plots (no GPU needed); tests/test_gpu_measured.py turns committed rows into docs.
#
# GPU_CHECK_BUDGET: seconds after which no step starts (default 560); a step past it is stopped, and a rerun
# measures only the missing cells (WORK keeps them). WORK: bench's folders (default /tmp/gpu-check). PYTHON:
# the interpreter (default python3). GPU_CHECK_SMOKE=1: a CPU dry run (shrunk 2-layer models, short prompts):
# it checks the script, and its timings describe nothing.
set -u
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,/^$/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0; fi
cd "$(dirname "$0")/.."
out=${1:-results/gpu-check}
work=${WORK:-/tmp/gpu-check}
py=${PYTHON:-python3}
budget=${GPU_CHECK_BUDGET:-560}
start=$(date +%s)
mkdir -p "$out" "$work"
left() { echo $((budget - ($(date +%s) - start))); }
log() { echo "[gpu_check $(( $(date +%s) - start ))s] $*" | tee -a "$out/gpu_check.log"; }

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
  shape=(--layers 2 --test-shrink --device cpu --dtype fp32)
  bench_shape=("${shape[@]}" --layer 1 --gen-tokens 3 --topk 64)
  lengths=1100,1400; short=1100; long=1400; chunk=256; tsp=(1 1 1); ctx=(--context 1500 --turns 3 --topk 128 --layer 1)
  probe=(--k 128 --gen-tokens 6)
else
  shape=()
  bench_shape=(--preset paper)
  lengths=4096,8192,16384,32768,65536,122880; short=32768,122880; long=122880; chunk=8192
  tsp=(15 15 19)  # FastKV's official TSP layers: Llama 3.1 8B, Phi 3.5 Mini, Mistral Nemo 12B
  ctx=(--context 32768 --turns 5)
  probe=()
fi

run() {  # SECONDS_CAP NAME CMD...: one step, stopped when the budget (or its cap) is spent
  local cap=$1 name=$2 t; shift 2
  t=$(left)
  if [ "$t" -lt 20 ]; then log "skipped $name: the budget is spent"; return; fi
  [ "$cap" -gt 0 ] && [ "$cap" -lt "$t" ] && t=$cap
  log "$name (${t}s at most)"
  timeout "$t" "$@" >>"$out/gpu_check.log" 2>&1
  log "$name: exit $?"
}
bench() {  # ARCH FOLDER CAP OPTIONS...: gemfilter bench into WORK/FOLDER; rows copied to OUT as they are
  local arch=$1 folder=$2 cap=$3; shift 3
  run "$cap" "bench $folder" "$py" -m gemfilter.lab.cli bench --model "config:$arch" "${bench_shape[@]}" --keep-going \
    --one-process --out "$work/$folder" "$@"
  [ -f "$work/$folder/bench.jsonl" ] && cp "$work/$folder/bench.jsonl" "$out/$folder.jsonl"
}

# 2. Llama, compiled: the end-to-end goal, decoding against the bound, and the memory parts
bench llama-3.1-8b llama-3.1-8b-compiled 240 --compile --longest-first --lengths "$lengths" \
  --methods "full,snapkv,gemfilter,fastkv:layer=${tsp[0]},gemfilter:chunk=$chunk"
# 3. decode paths against the weight-read bound
run 70 "decode probe" "$py" -m gemfilter.lab.bench.decode --model config:llama-3.1-8b "${shape[@]}" "${probe[@]}" \
  --paths generate,apply-full,static-eager,compiled,hf-static --out "$out/decode.jsonl"
# 4. conversations at 8B
run 80 "conversations" "$py" -m gemfilter.lab.bench.conversation --model config:llama-3.1-8b "${shape[@]}" "${ctx[@]}" \
  --out "$out/conversation.jsonl"
# 5. the device-aware tests, on CUDA: the new ones first
run 100 "device-aware tests (pytest -m cuda)" bash -c "set -o pipefail; '$py' -m pytest -q -m cuda -p no:cacheprovider \
  -o addopts='' tests/test_compiled.py tests/test_chunked_filter.py tests/test_core.py tests/test_banded.py \
  tests/test_methods.py tests/test_fastkv.py tests/test_archs.py tests/test_variants.py tests/test_asl.py 2>&1 \
  | tail -n 80 > '$out/cuda-tests.log'"
log "tests: $(tail -n 1 "$out/cuda-tests.log" 2>/dev/null)"
# 6. Llama, eager (generate's own loop): this run's baseline for the compiled rows
bench llama-3.1-8b llama-3.1-8b-eager 90 --longest-first --lengths "$short" --methods "full,snapkv,gemfilter,fastkv:layer=${tsp[0]}"
# 7. Fig. 9.6's architectures at 120K
: >"$out/fig96.jsonl"
for entry in "phi-3.5-mini ${tsp[1]}" "mistral-nemo-12b ${tsp[2]}"; do
  set -- $entry
  for mode in compiled eager; do
    extra=(); [ "$mode" = compiled ] && extra=(--compile)
    bench "$1" "$1-$mode" 0 "${extra[@]}" --lengths "$long" --methods "full,snapkv,gemfilter,fastkv:layer=$2"
    [ -f "$out/$1-$mode.jsonl" ] && cat "$out/$1-$mode.jsonl" >>"$out/fig96.jsonl" && rm "$out/$1-$mode.jsonl"
  done
done
log "done"
