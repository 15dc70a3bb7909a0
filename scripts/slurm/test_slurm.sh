#!/bin/bash
# Proves scripts/slurm/ on a real Slurm, not a mock: starts a one-node cluster on this machine (munged,
# slurmctld and slurmd on localhost only, configuration and state in a temporary directory), submits
# the job array + dependent merge through scripts/slurm/submit.sh on the tiny checkpoint with the CPU
# backend, waits for them, and checks that the merged output (results and hidden-state .npy files) is
# byte for byte the output of an unsharded run. Everything it started is stopped and its directory
# removed at the end, whatever happens; every wait is bounded.
#
#   scripts/slurm/test_slurm.sh [--bin build/ds4replay] [--model tests/data/tiny-a/model] [--shards 3]
#
# Needs root (the daemons, and apt-get when Debian's slurm-wlm / munge are missing: they are installed
# then). Exit 0 when the bytes match, 1 otherwise, 77 when it cannot run here (not root, no apt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="$root/build/ds4replay" model="$root/tests/data/tiny-a/model" shards=3
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --shards) shards=$2; shift 2 ;;
        *) echo "usage: $0 [--bin BIN] [--model DIR] [--shards N]" >&2; exit 2 ;;
    esac
done
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin=$(abs "$bin") model=$(abs "$model")
log() { echo "test_slurm: $*" >&2; }
[ -x "$bin" ] || { log "$bin: no ds4replay binary (build it first)"; exit 2; }
if [ "$(id -u)" != 0 ]; then log "needs root (slurmd, munged, apt-get): skipped"; exit 77; fi

# --- Debian's packages, when missing ------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
    ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || { log "slurm / munge missing and no apt-get: skipped"; exit 77; }
    log "installing slurmctld slurmd slurm-client munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null ||
        { timeout 300 apt-get update >/dev/null &&
            timeout 600 apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; }
fi

# --- A private cluster in a temporary directory ----------------------------------------------------
tmp=$(mktemp -d /tmp/ds4r-slurm.XXXXXX)
chmod 700 "$tmp"
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    if [ $rc -ne 0 ] && [ -d "$tmp" ]; then
        for f in "$tmp"/log/*.log "$tmp"/out/*.log; do
            [ -f "$f" ] && { echo "--- $f (last lines)" >&2; tail -n 15 "$f" >&2; }
        done
    fi
    rm -rf "$tmp"
    exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM
mkdir -p "$tmp"/{log,state,spool,munge,out}

# A port that nothing listens on (slurmctld, slurmd).
free_port() {
    local p
    for p in $(shuf -i 20000-60000 -n 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
    done
    return 1
}
ctld_port=$(free_port) slurmd_port=$(free_port)

dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munged --force --foreground --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.socket" \
    --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/seed" --log-file="$tmp/log/munged.log" &
pids+=($!)

node=ds4rnode
cpus=$(nproc)
cat >"$tmp/slurm.conf" <<CONF
ClusterName=ds4rtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
# Stand-in "GPUs" (gres.conf below): the array script asks for --gres=gpu:1 per task, as on a real GPU cluster.
GresTypes=gpu
NodeName=$node NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:$shards State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# Slurm drops GPUs without device files: empty files stand in for them (no cgroup device limits here).
mkdir -p "$tmp/dev"
for i in $(seq 0 $((shards - 1))); do : >"$tmp/dev/gpu$i"; done
echo "Name=gpu File=$tmp/dev/gpu[0-$((shards - 1))]" >"$tmp/gres.conf"
export SLURM_CONF="$tmp/slurm.conf"

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    while [ $SECONDS -lt $deadline ]; do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.25
    done
    log "timed out after ${limit}s waiting for $what"
    return 1
}
wait_for 15 "munged" test -S "$tmp/munge/munge.socket"
slurmctld -D -i -f "$tmp/slurm.conf" >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$node" -f "$tmp/slurm.conf" >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
node_idle() { sinfo -h -n "$node" -o %T | grep -qx idle; }
wait_for 60 "the node to come up idle (sinfo)" node_idle
log "cluster up: slurmctld :$ctld_port, slurmd :$slurmd_port, node $node ($cpus CPUs, $shards gpu)"

# --- The job array and the merge, through the documented script ----------------------------------
# Sequences of different lengths (the split balances tokens), hidden states of two layers.
python3 - "$root/tests/data/tiny-a/tokens.jsonl" "$tmp/tokens.jsonl" <<'PY'
import json, sys
src = [json.loads(l) for l in open(sys.argv[1])]
long = next(r["tokens"] for r in src if r["id"] == "seq11")
with open(sys.argv[2], "w") as f:
    for i in range(24):
        n = 3 + (i * 11) % 29
        f.write(json.dumps({"id": f"s{i:02d}", "tokens": long[i * 5 : i * 5 + n], "i": i}) + "\n")
PY
flags=(--backend cpu --top-k 4 --capture-layers 2,6 --pass-tokens 64)
ids=$("$here/submit.sh" --bin "$bin" --model "$model" --input "$tmp/tokens.jsonl" --outdir "$tmp/out" \
    --shards "$shards" --sbatch "--partition=test --time=10 --cpus-per-task=1" -- "${flags[@]}" | tail -n 1)
read -r array_job merge_job <<<"$ids"
log "submitted array job $array_job ($shards tasks) and merge job $merge_job"
job_done() { [ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]; }
if ! wait_for 240 "job $merge_job to finish" job_done "$merge_job"; then
    squeue -o "%.12i %.10T %.30r %j" >&2 || true
    exit 1
fi
state=$(scontrol -o show job "$merge_job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[ "$state" = COMPLETED ] || { log "merge job $merge_job ended $state"; exit 1; }
for t in $(seq 0 $((shards - 1))); do
    s=$(scontrol -o show job "${array_job}_$t" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [ "$s" = COMPLETED ] || { log "array task ${array_job}_$t ended $s"; exit 1; }
done

# --- The same input unsharded, here: identical bytes ------------------------------------------------
"$bin" score --model "$model" --input "$tmp/tokens.jsonl" --output "$tmp/unsharded.jsonl" \
    --hidden-dir "$tmp/unsharded-hidden" --progress none "${flags[@]}" 2>"$tmp/log/unsharded.log"
ok=1
cmp "$tmp/unsharded.jsonl" "$tmp/out/results.jsonl" || ok=0
for L in 2 6; do cmp "$tmp/unsharded-hidden/hidden_L$L.npy" "$tmp/out/hidden/hidden_L$L.npy" || ok=0; done
records=$(wc -l <"$tmp/out/results.jsonl")
shard_lines=$(cat "$tmp"/out/task-*/results.jsonl | wc -l)
if [ $ok = 1 ] && [ "$records" = 24 ] && [ "$shard_lines" = 24 ]; then
    log "OK: $shards shards on Slurm, merged = unsharded ($records records, hidden_L2/L6.npy identical)"
    exit 0
fi
log "FAILED: merged output differs from the unsharded run"
exit 1
