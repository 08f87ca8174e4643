#!/usr/bin/env bash
# Session 14, second device call (one H200): the `pytest -m gpu` tests that the first call's timeouts cut
# (left-after-call-1.txt: collected with `pytest -m gpu --collect-only -q` less those with a verdict in
# gpu-1.log / gpu-2.log), then the suite's chain_sum / transpose_sum rows, then the YAML-cost probe.
#   bash benchmarks/recorded/h200-2026-12-04-s14/run-2.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
here=$(dirname "$0")
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; git log -1 --format=%h 2>/dev/null; } > "$out/env-2.log" 2>&1
begun=$(date +%s)
mapfile -t ids < "$here/left-after-call-1.txt"  # test ids hold spaces
timeout ${T1:-250} python3 -m pytest -m gpu -n 15 -v -p no:cacheprovider -o console_output_style=classic \
  --durations=15 "${ids[@]}" > "$out/gpu-3.log" 2>&1; echo "EXIT $?" >> "$out/gpu-3.log"
left=$(( ${BUDGET:-500} - ($(date +%s) - begun) - 60 ))  # 60 s kept for the probe
timeout "$left" python3 -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5 > "$out/suite.log" 2>&1
echo "EXIT $?" >> "$out/suite.log"
timeout 60 python3 -m benchmarks.probes.yaml_cost --repeats 15 > "$out/yaml_cost.log" 2>&1; echo "EXIT $?" >> "$out/yaml_cost.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-3.log" | awk '{print $2}' | sort | uniq -c
grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR)" "$out/gpu-3.log" | head -20; tail -3 "$out/gpu-3.log"
tail -30 "$out/yaml_cost.log" | grep -E "YAML/Python|check"; tail -24 "$out/suite.log"
