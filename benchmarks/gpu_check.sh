#!/usr/bin/env bash
# The GPU measurements the decoding-speed work asks for, as one short run (about 8-10 minutes on one H100 or
# H200, most of it compiling: about 40 s per graph at LLaVA-1.5-7B's shapes):
#
#   - every method eager and compiled (static cache + CUDA graphs) on a random-weight model with
#     LLaVA-1.5-7B's shapes, bfloat16, batch 4, 601-token prompts, 32 new tokens;
#   - per method: ms per step, tokens/s, the multiple of the weight-read floor (`x wfloor`: plain greedy and
#     the one-pass methods should be <= 2) and of the 2B-row floor (`x floor`: the two-stream methods should
#     be <= 1.10), and `eager-share`, the share of generated tokens the compiled run shares with the eager one;
#   - the host part of a compiled step on this machine's CPU (benchmarks/bench_host_step.py, about a minute):
#     what each step's graph replay has to hide, next to the weight-read floor above.
#
# Usage, from the repository root on the GPU machine:
#
#   OUT=results bash benchmarks/gpu_check.sh            # writes $OUT/bench_7b.{json,txt}, $OUT/host_step.{json,txt}
#   METHODS="opera dola" BUDGET_S=300 bash benchmarks/gpu_check.sh
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
#   WHEELS=.whl bash benchmarks/gpu_check.sh            # first installs the wheels in .whl (e.g. the
#                                                       # transformers the tests ran on) into /tmp/site
#
# It needs torch with CUDA and transformers; datasets and evaluate are not imported. The model is built with
# random weights in the process (no download). --budget-s stops starting methods when the budget is spent
# (the ones left are listed as skipped), so the run ends in time on a lent machine.
set -euo pipefail

out="${OUT:-gpu-results}"
methods="${METHODS:-vcd m3id pai avisc damro dola opera}"
budget="${BUDGET_S:-420}"
python="${PYTHON:-python3}"
mkdir -p "$out"

if [[ -n "${WHEELS:-}" ]]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1

"$python" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true

# shellcheck disable=SC2086  # the methods are words
"$python" benchmarks/bench_mitigations.py --models llava-1.5-7b --device cuda --both --repeats 3 \
    --methods $methods --budget-s "$budget" --json "$out/bench_7b.json" | tee "$out/bench_7b.txt"

# the loop's host work per step on this CPU (tiny LLaVA on the static path, forward replayed)
"$python" benchmarks/bench_host_step.py --families llava --repeats 7 --json "$out/host_step.json" | tee "$out/host_step.txt"
