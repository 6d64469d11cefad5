#!/usr/bin/env bash
# Issue 57's GPU check in one call of a lent H200 (the workplace's device tool: docs/benchmarks.md), e.g.
#
#   run(command="bash bench/gpu_session.sh", timeout_s=600)            # part 1
#   run(command="PART=2 bash bench/gpu_session.sh", timeout_s=600)     # part 2, in a later session
#
# The machine's own python3 runs it (jax 0.11 with CUDA 13, flax, optax, torch, transformers are in its image;
# nothing to carry: bench/run.py needs no `datasets` on its default path). Steps run in order while time is left
# (BUDGET_S, default 560 s from the start; each step is cut at what is left, and bench/run.py writes its JSON
# after every row, so a cut step keeps the rows it finished). Back in $OUT: bench.json (every step's bench/run.py
# JSON under its name, and "session": the machine, the versions, each step's command, exit code and seconds, the
# steps skipped) and session.log (everything printed: the tables, the profiles).
#
# Part 1: the profile of GPT-2 at dropout 0 first (where a step's time goes), then the causal LM at dropout 0 and
# 0.1 beside nanoGPT and transformers (both under torch.compile; the references at dropout 0), the Llama 3.2 1B
# shape (seq 4096, batch 16 halved while it runs out of memory), masked LM and T5 at both dropouts (ours alone).
# Part 2: masked LM and T5 at both dropouts beside transformers (at dropout 0), then Llama beside transformers.
# A guess at the times, from 2026-11-28's compile times (35-70 s a row; torch.compile unmeasured here): part 1
# reaches the profile, GPT-2's two rows and their references and the Llama row (~450 s), masked LM if the budget
# lasts; what a part cannot reach is listed as skipped.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session_out}
PART=${PART:-1}
BUDGET_S=${BUDGET_S:-560}
START=$(date +%s)
WORK=$(mktemp -d)
LOG=$OUT/session.log
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}  # JAX's pool: most of the card
export JAX_COMPILATION_CACHE_DIR=$WORK/jax_cache  # a step that compiles what an earlier one did loads it
PY=${PY:-python3}
BENCH="$PY bench/run.py --suite ${SUITE:-gpu}"  # SUITE=tiny: the same steps on a CPU's tiny shapes (a dry run)
PROFILE_OK=1

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

merge() {  # every step's JSON and the session's record into $OUT/bench.json
    "$PY" - "$WORK" "$OUT/bench.json" <<'EOF'
import glob, json, os, sys
work, out = sys.argv[1:]
session = json.load(open(os.path.join(work, "session.json")))
runs = {}
for path in sorted(glob.glob(os.path.join(work, "step-*.json"))):
    try:
        runs[os.path.basename(path)[5:-5]] = json.load(open(path))
    except (OSError, ValueError) as e:  # a step cut while writing: the next write replaces it
        runs[os.path.basename(path)[5:-5]] = {"error": str(e)}
json.dump({"session": session, "runs": runs}, open(out, "w"), indent=1)
EOF
}

record() {  # record NAME RC SECONDS NOTE: append to the session's step list
    "$PY" - "$WORK/session.json" "$@" <<'EOF'
import json, sys
path, name, rc, seconds, note = sys.argv[1:]
s = json.load(open(path))
s["steps"].append({"name": name, "rc": int(rc), "seconds": int(seconds), "note": note})
json.dump(s, open(path, "w"), indent=1)
EOF
    merge
}

step() {  # step NAME MIN_S COMMAND...: run COMMAND (its JSON: $WORK/step-NAME.json) if MIN_S seconds are left
    local name=$1 need=$2
    shift 2
    local t=$(left)
    if [ "$t" -lt "$need" ]; then
        echo "== skipped $name: ${t} s left, it needs ${need} s or more" | tee -a "$LOG"
        record "$name" -1 0 "skipped: ${t} s left of ${BUDGET_S}"
        return 1
    fi
    echo "== $name ($(date -u +%H:%M:%S), ${t} s left): $*" | tee -a "$LOG"
    local t0=$(date +%s)
    timeout --kill-after=5 "$t" "$@" --json "$WORK/step-$name.json" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    record "$name" "$rc" $(($(date +%s) - t0)) "$([ "$rc" = 124 ] && echo "cut at the budget")"
    return "$rc"
}

{
    echo "== gpu_session.sh part $PART, $(date -u +%FT%TZ), budget ${BUDGET_S} s"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
    git log -1 --format="commit %h %s" 2>/dev/null; git status --short 2>/dev/null | head -20
} | tee -a "$LOG"
"$PY" - "$WORK/session.json" "$PART" "$BUDGET_S" <<'EOF' 2>&1 | tee -a "$LOG"
import json, platform, subprocess, sys
from importlib import metadata
path, part, budget = sys.argv[1:]
versions = {}
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "torch", "transformers", "numpy"):
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except OSError as e:  # no NVIDIA driver here (a dry run on a CPU)
    gpu = f"none: {e}"
print("versions:", versions)
json.dump({"part": int(part), "budget_s": int(budget), "gpu": gpu, "python": platform.python_version(),
           "versions": versions, "steps": []}, open(path, "w"), indent=1)
EOF
merge

if [ "$PART" = 1 ]; then
    # Where GPT-2's step goes at dropout 0, first: it also checks that the profiler works here.
    step profile-clm-dropout0 90 $BENCH --tasks clm --dropout 0 --steps 5 --reference none --profile "$WORK/profile" \
        || PROFILE_OK=0
    PROFILE=$([ $PROFILE_OK = 1 ] && echo "--profile $WORK/profile")
    step clm 150 $BENCH --tasks clm --dropout both --reference_dropout 0 $PROFILE
    step llama 100 $BENCH --tasks llama --reference none --steps 10 $PROFILE
    step mlm 80 $BENCH --tasks mlm --dropout both --reference none $PROFILE
    step t5 80 $BENCH --tasks t5 --dropout both --reference none $PROFILE
else
    step mlm 120 $BENCH --tasks mlm --dropout both --reference_dropout 0 --compare transformers
    step t5 150 $BENCH --tasks t5 --dropout both --reference_dropout 0 --compare transformers
    step llama 150 $BENCH --tasks llama --steps 10 --compare transformers
fi
echo "== done part $PART in $(($(date +%s) - START)) s; $OUT/bench.json" | tee -a "$LOG"
