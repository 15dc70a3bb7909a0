#!/bin/bash
# Scores INPUT on N GPUs of a Slurm cluster: a job array of N tasks (one shard and one GPU each,
# scripts/slurm/score_array.sbatch), then a merge job that starts when every task succeeded
# (--dependency=afterok, scripts/slurm/merge.sbatch). Prints the two job ids; the result is
# OUTDIR/results.jsonl (and OUTDIR/hidden/ with --capture-layers), identical to an unsharded run.
#
#   scripts/slurm/submit.sh --model DIR --input tokens.jsonl --outdir DIR --shards N \
#       [--bin PATH] [--sbatch "OPTIONS"] [-- score flags...]
#
#   --bin       the ds4replay binary (default: build/ds4replay of this checkout, made absolute)
#   --sbatch    extra options for both sbatch calls, e.g. "--partition=gpu --time=12:00:00 --account=X"
#   score flags after "--", e.g. -- --top-k 20 --capture-layers 20,40
#
# Paths are made absolute: the tasks run on other nodes, in other directories. INPUT, OUTDIR (and the
# model, unless every node has its own copy) must be on a file system every node sees.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../../build/ds4replay" model="" input="" outdir="" shards="" sbatch_opts=""
usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --input) input=$2; shift 2 ;;
        --outdir) outdir=$2; shift 2 ;;
        --shards) shards=$2; shift 2 ;;
        --sbatch) sbatch_opts=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "submit.sh: unknown option $1" >&2; usage ;;
    esac
done
[ -n "$model" ] && [ -n "$input" ] && [ -n "$outdir" ] && [ -n "$shards" ] || usage
case "$shards" in ''|*[!0-9]*|0) echo "submit.sh: --shards must be a positive integer" >&2; exit 2 ;; esac
[ -f "$input" ] || { echo "submit.sh: $input: not a regular file (sharding reads the input twice)" >&2; exit 2; }
[ -x "$bin" ] || { echo "submit.sh: $bin: no ds4replay binary there (build it, or give --bin)" >&2; exit 2; }
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin=$(abs "$bin") model=$(abs "$model") input=$(abs "$input") outdir=$(abs "$outdir")
mkdir -p "$outdir"
# shellcheck disable=SC2086  # $sbatch_opts holds several options on purpose
array_job=$(sbatch --parsable $sbatch_opts --chdir="$outdir" --array="0-$((shards - 1))" \
    "$here/score_array.sbatch" "$bin" "$model" "$input" "$outdir" "$@")
array_job=${array_job%%;*}
# shellcheck disable=SC2086
merge_job=$(sbatch --parsable $sbatch_opts --chdir="$outdir" --dependency="afterok:$array_job" \
    --kill-on-invalid-dep=yes "$here/merge.sbatch" "$bin" "$outdir")
merge_job=${merge_job%%;*}
echo "array job $array_job ($shards tasks), merge job $merge_job -> $outdir/results.jsonl"
echo "$array_job $merge_job"
