#!/bin/bash
# A scripted Slurm for tests of how the daemon takes scheduler failures: installed as
# sinfo, squeue, scontrol, sbatch and scancel (links to this file) first on PATH.
# State in $FAKE_SLURM: nodes (one "NAME|STATE" line each), jobs/<id> ("STATE NODE
# [EXIT REASON]"), next_id, calls (every call, one line: command, epoch s, arguments),
# job_fails ("EXIT REASON stderr line": every holder submitted fails so, its stderr
# written to sbatch's --error file, as slurmd fails a job script it cannot run). mode/<command> makes that
# command fail: error (exit 1), empty (exit 0, no output), garbage (exit 0, nonsense)
# or hang (longer than any test's --timeout). The one place a fake Slurm is right: a
# real one cannot fail on demand.
set -u
cmd=$(basename "$0")
dir=${FAKE_SLURM:?FAKE_SLURM is not set}
echo "$cmd $(date +%s.%N) $*" >> "$dir/calls"
mode=$(cat "$dir/mode/$cmd" 2>/dev/null || true)
case "$mode" in
  error) echo "$cmd: error: Socket timed out on send/recv operation" >&2; exit 1 ;;
  empty) exit 0 ;;
  garbage) printf 'garbage \001\002 <html>502 Bad Gateway</html> |||\n'; exit 0 ;;
  hang) exec sleep 3600 ;;
esac
args=" $* "
job_line() {  # id -> "STATE NODE [EXIT REASON]"
  cat "$dir/jobs/$1" 2>/dev/null
}
case "$cmd" in
  sinfo)
    cat "$dir/nodes" ;;
  squeue)
    if [[ $args == *" --start "* ]]; then exit 0; fi
    for f in "$dir"/jobs/*; do
      [ -e "$f" ] || continue
      id=$(basename "$f"); read -r state node _ < "$f"
      if [[ $args == *" -t R "* ]]; then
        [ "$state" = RUNNING ] && echo "bf|$node"
      elif [ "$state" = RUNNING ]; then
        echo "$id|$state|$node|$node|N/A|None|"
      else
        echo "$id|$state|$node||N/A|None|"
      fi
    done ;;
  scontrol)
    if [[ $args == *" show res "* ]]; then echo "No reservations in the system"
    elif [[ $args == *" show partition "* ]]; then
      echo "PartitionName=bf AllowGroups=ALL Default=NO MaxTime=UNLIMITED State=UP"
    elif [[ $args == *" show job "* ]]; then
      id=$(echo "$args" | sed -E 's/.* job ([0-9]+).*/\1/')
      read -r state node code reason < "$dir/jobs/$id" 2>/dev/null \
        || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
      echo "JobId=$id JobName=bftrainer-hold JobState=$state Reason=${reason:-None} ExitCode=${code:-0}:0 NodeList=$node"
    fi ;;
  sbatch)
    node=$(echo "$args" | sed -E 's/.*--nodelist=([^ ]+).*/\1/')
    # One id each: the daemon submits holders in parallel, and two that read next_id
    # together got the same id (Slurm never gives one twice).
    exec 9>>"$dir/next_id.lock"
    flock 9
    id=$(cat "$dir/next_id" 2>/dev/null || echo 100)
    echo $((id + 1)) > "$dir/next_id"
    flock -u 9
    mkdir -p "$dir/jobs"
    if [ -s "$dir/job_fails" ]; then
      # Every new holder fails as slurmd would fail it: "EXIT REASON stderr line".
      read -r code reason message < "$dir/job_fails"
      echo "FAILED $node $code $reason" > "$dir/jobs/.$id" && mv "$dir/jobs/.$id" "$dir/jobs/$id"
      err=$(echo "$args" | sed -nE 's/.*--error=([^ ]+).*/\1/p')
      [ -n "$err" ] && echo "$message" > "${err//%j/$id}"
    else
      echo "PENDING $node" > "$dir/jobs/.$id" && mv "$dir/jobs/.$id" "$dir/jobs/$id"
    fi
    echo "$id" ;;
  scancel)
    for id in "$@"; do rm -f "$dir/jobs/$id"; done ;;
esac
