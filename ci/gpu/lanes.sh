#!/usr/bin/env bash
# Two sessions side by side on one 4-GPU machine, so one device call does twice the
# 2-GPU work: lane A on GPUs 0,1 and lane B on GPUs 2,3, each running its phases in order
# (ci/gpu/sessions.sh) inside SECONDS. Lanes share nothing but the host (ports and socket
# names are per process), so correctness phases can run side by side; keep timing phases
# (perf, collperf, latency) out of lanes: the other lane's traffic would be in them.
#
#     ci/gpu/lanes.sh 560 "hal collectives faults group" "allreduce python multinode"
#
# Writes $OUT/lane-a.log, $OUT/lane-b.log and each lane's results tarball under
# $OUT/lane-a/ and $OUT/lane-b/ (ci/gpu/sessions.sh). NVLS stays off (session.sh).
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
total="${1:?usage: ci/gpu/lanes.sh SECONDS \"PHASES A\" \"PHASES B\"}"
phases_a="${2:?lane A phases}"
phases_b="${3:?lane B phases}"
out="${OUT:-${repo_root}/.gpu/results}"
mkdir -p "${out}"
ngpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
if ((ngpus < 4)); then
    echo "lanes.sh: needs 4 GPUs, found ${ngpus}" >&2
    exit 2
fi
lane() { # lane NAME DEVICES PHASES
    # shellcheck disable=SC2086 # the phases are words
    OUT="${out}/lane-$1" OXCCL_SESSION_DEVICES="$2" OXCCL_SESSION_GPUS=2 \
        bash "${repo_root}/ci/gpu/sessions.sh" "${total}" $3 >"${out}/lane-$1.log" 2>&1
}
lane a 0,1 "${phases_a}" &
pid_a=$!
lane b 2,3 "${phases_b}" &
pid_b=$!
wait "${pid_a}"
rc_a=$?
wait "${pid_b}"
rc_b=$?
for l in a b; do
    echo "== lane ${l}"
    grep -E '^(==|ok|FAIL|SKIP)' "${out}/lane-${l}.log" || tail -n 20 "${out}/lane-${l}.log"
done
((rc_a == 0 && rc_b == 0))
