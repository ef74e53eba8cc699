#!/usr/bin/env bash
# The GPU checks of issue 30, as one script (a lent GPU machine has minutes, not hours).
#
#   bash tools/gpu_check.sh OUTDIR [STAGES]      STAGES: comma list of
#     devices  fedjax-dp devices --json (the Triton workaround in effect?)
#     selftest fedjax-dp selftest (every family on the GPU vs the CPU)
#     fnas     the DP-FNAS config that crashed XLA's GPU compiler, shortened
#     rounds   tools/bench_cli_rounds.py: the CLI's round vs the peers' reference, q = 0.01, 0.1, 1
#     bench    fedjax-dp bench --suite full
#     scale    AE-DPFL with 1e7 synthetic agents through the CLI (SCALE_AGENTS to change)
#     mechanisms  tools/bench_mechanisms.py: DP-FedAvg's per-round cost with each privacy
#              mechanism (adaptive clip, banded MF, BLT, secagg, ...) against fixed clip +
#              Gaussian noise, through the CLI (not in the default list; MECH_ROUNDS, MECH_COHORT,
#              MECH_VARIANTS, MECH_LIMIT; writes mechanisms.json / mechanisms.txt)
#
# Needs the peers' folder copied to .peers/ (stage rounds only) and, where the image lacks them,
# the wheels of dp-accounting, dm-tree, mlxtend and jax-privacy (+ pydantic, pydantic-core,
# annotated-types, typing-inspection, its declared needs) in .whl/ (docs/devices.md says how).
# Runs from the source folder (python -m fedjax_dp.experiments.cli), each stage under its own
# timeout, and writes OUTDIR/<stage>.log and the stages' JSON.
set -u
out=${1:?OUTDIR}
stages=${2:-devices,selftest,fnas,rounds,bench,scale}
mkdir -p "$out"
if [ -z "${SKIP_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD     # SKIP_WHEELS: keep a /tmp/site set before
fi
export PYTHONUNBUFFERED=1 FEDJAX_DP_CACHE_DIR=/tmp/fedjax_cache
cli="python3 -m fedjax_dp.experiments.cli"
has() { case ",$stages," in *",$1,"*) return 0;; esac; return 1; }
stage() {   # name timeout command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$out/stages.txt"
  tail -n 4 "$out/$name.log"
}
nvidia-smi -L 2>/dev/null | tee "$out/machine.txt"
has devices && stage devices 120 $cli devices --json
has selftest && stage selftest "${SELFTEST_LIMIT:-240}" $cli selftest
has fnas && stage fnas 180 $cli run configs/fnas/digits_dp.toml --set algorithm.search_epochs=2 \
  --set algorithm.retrain_epochs=2 --out "$out/fnas_run" --quiet
has rounds && stage rounds "${ROUNDS_LIMIT:-300}" python3 tools/bench_cli_rounds.py --peers .peers \
  --rates "${ROUNDS_RATES:-0.01,0.1,1.0}" --out "$out/cli_rounds.json"
has bench && stage bench "${BENCH_LIMIT:-300}" $cli bench --suite full --out "$out/bench_full.json"
if has scale; then
  n=${SCALE_AGENTS:-10000000}
  stage scale "${SCALE_LIMIT:-400}" python3 tools/bench_scale_oneshot.py --agents "$n" \
    --algorithms ae_dpfl --paths cli --generator jax --agents-on "${SCALE_ON:-device}" \
    --out "$out/scale_cli.json"
fi
if has mechanisms; then
  lim=${MECH_LIMIT:-480}
  # --deadline: runs that would end past the stage's limit are skipped, so the JSON and the
  # table are written before timeout kills the stage
  stage mechanisms "$lim" python3 tools/bench_mechanisms.py --rounds "${MECH_ROUNDS:-5000}" \
    --cohort "${MECH_COHORT:-20}" ${MECH_VARIANTS:+--variants "$MECH_VARIANTS"} \
    --deadline $((lim - 60)) --run-timeout 300 --out "$out/mechanisms.json"
  cat "$out/mechanisms.txt" 2>/dev/null
fi
exit 0
