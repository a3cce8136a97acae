#!/usr/bin/env bash
# A real multi-node Slurm on one machine, for bftrainer's integration tests.
#
#   scripts/slurm/local-cluster.sh start    # install (root), start, print SLURM_CONF=...
#   scripts/slurm/local-cluster.sh status   # exit 0 when running and answering
#   scripts/slurm/local-cluster.sh stop     # cancel jobs, stop daemons by PID
#   scripts/slurm/local-cluster.sh gpus node3 1   # GRES_GPUS clusters: node3 now has 1 GPU
#
#   eval "export $(scripts/slurm/local-cluster.sh start)"   # then sinfo, squeue, sbatch
#
# Settings (environment): NNODES (8), SLURM_LOCAL_DIR (/var/tmp/bftrainer-slurm),
# SLURM_LOCAL_CTLD_PORT (16817), SLURM_LOCAL_SLURMD_PORT (16818),
# SLURM_LOCAL_NODE_PORT (17000: node i listens on NODE_PORT+i), SLURM_LOCAL_INSTALL (1:
# apt-get install missing packages when root), GRES_GPUS (unset: no GRES; N: every node
# declares Gres=gpu:N, without devices), SLURM_LOCAL_BF_INTERVAL (5: seconds between
# backfill passes), SLURM_LOCAL_KILL_WAIT (10: seconds from SIGTERM to SIGKILL when a job
# ends; the test suite's clusters use shorter ones).
# Only the SLURM_CONF line goes to stdout; progress and errors go to stderr.
# Exit codes: 0 ok, 1 failure, 3 Slurm absent and cannot be installed (not root).
#
# For tests on a single-user machine only: AuthType=auth/none lets any local user claim
# any uid while the cluster runs. The state folder (config the root daemons load, pid
# files this script kills by) must be the caller's own: it is created 0700, and refused
# if it is a symlink, not a folder, or owned by someone else. A pid is signalled only if
# it is a slurmctld/slurmd of the caller started with this folder's slurm.conf.
set -euo pipefail

NNODES=${NNODES:-8}
GRES_GPUS=${GRES_GPUS:-}
if [[ -n "$GRES_GPUS" && ! "$GRES_GPUS" =~ ^[1-9][0-9]{0,2}$ ]]; then
  echo "local-cluster: GRES_GPUS=$GRES_GPUS: expected a GPU count per node, 1 to 999" >&2
  exit 1
fi
STATE_DIR=${SLURM_LOCAL_DIR:-/var/tmp/bftrainer-slurm}
CTLD_PORT=${SLURM_LOCAL_CTLD_PORT:-16817}
SLURMD_PORT=${SLURM_LOCAL_SLURMD_PORT:-16818}
NODE_PORT=${SLURM_LOCAL_NODE_PORT:-17000}
INSTALL=${SLURM_LOCAL_INSTALL:-1}
BF_INTERVAL=${SLURM_LOCAL_BF_INTERVAL:-5}
KILL_WAIT=${SLURM_LOCAL_KILL_WAIT:-10}
for setting in "SLURM_LOCAL_BF_INTERVAL=$BF_INTERVAL" "SLURM_LOCAL_KILL_WAIT=$KILL_WAIT"; do
  if [[ ! "${setting#*=}" =~ ^[1-9][0-9]{0,3}$ ]]; then
    echo "local-cluster: $setting: expected whole seconds, 1 to 9999" >&2
    exit 1
  fi
done
HERE=$(cd "$(dirname "$0")" && pwd)
CONF="$STATE_DIR/slurm.conf"
PACKAGES=(slurmctld slurmd slurm-client)

log() { echo "local-cluster: $*" >&2; }

secure_state_dir() {
  # Create the state folder 0700 or accept it only if it is already the caller's own
  # folder; a folder in world-writable /var/tmp may have been made by anyone.
  # $1 = create: make it if absent (start); otherwise an absent folder is fine.
  local uid owner
  uid=$(id -u)
  if [ "${1:-}" = create ]; then
    mkdir -p -- "$(dirname -- "$STATE_DIR")"
    mkdir -m 0700 -- "$STATE_DIR" 2>/dev/null || true
  elif [ ! -e "$STATE_DIR" ] && [ ! -L "$STATE_DIR" ]; then
    return 0
  fi
  if [ -L "$STATE_DIR" ] || [ ! -d "$STATE_DIR" ]; then
    log "refusing $STATE_DIR: it is a symlink or not a folder"
    exit 1
  fi
  owner=$(stat -c %u -- "$STATE_DIR")
  if [ "$owner" != "$uid" ]; then
    log "refusing $STATE_DIR: owned by uid $owner, not by you (uid $uid); remove it or set SLURM_LOCAL_DIR"
    exit 1
  fi
  chmod 0700 -- "$STATE_DIR"
}

our_daemon() {
  # $1 pid, $2 program: true only for that program, run by the caller, started with
  # -f $CONF (so a pid file holding any other pid never gets it signalled).
  local pid=$1 prog=$2 args=() i
  [[ "$pid" =~ ^[1-9][0-9]{0,9}$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = "$(id -u)" ] || return 1
  mapfile -d '' args <"/proc/$pid/cmdline" 2>/dev/null || return 1
  [ "${#args[@]}" -ge 3 ] && [ "$(basename -- "${args[0]}")" = "$prog" ] || return 1
  for ((i = 1; i < ${#args[@]} - 1; i++)); do
    [ "${args[i]}" = -f ] && [ "${args[i + 1]}" = "$CONF" ] && return 0
  done
  return 1
}

pid_of() {
  # $1 pid file, $2 program: the pid in it if it is ours (see our_daemon), else nothing.
  local pid
  [ -f "$1" ] && [ ! -L "$1" ] || return 1
  pid=$(head -c 32 -- "$1" | tr -d '[:space:]')
  our_daemon "$pid" "$2" && echo "$pid"
}

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null; }

install_slurm() {
  have_slurm && return 0
  if [ "$(id -u)" != 0 ]; then
    log "Slurm is not installed and installing it needs root (apt-get install ${PACKAGES[*]})"
    exit 3
  fi
  if [ "$INSTALL" != 1 ]; then
    log "Slurm is not installed and SLURM_LOCAL_INSTALL=$INSTALL forbids installing it"
    exit 3
  fi
  log "installing ${PACKAGES[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; } >&2; then
    log "apt-get install ${PACKAGES[*]} failed"
    exit 3
  fi
}

node_names() { local i; for i in $(seq 1 "$NNODES"); do echo "node$i"; done; }

gres_line() {
  # $1 node, $2 GPUs: its gres.conf line, and as many empty files as "devices".
  local i
  mkdir -p "$STATE_DIR/dev"
  for i in $(seq 0 $(($2 - 1))); do : >"$STATE_DIR/dev/gpu$i"; done
  echo "NodeName=$1 Name=gpu File=$STATE_DIR/dev/gpu[0-$(($2 - 1))]" >>"$STATE_DIR/gres.conf"
}

write_conf() {
  local lines="" i gres="" gres_types=""
  if [ -n "$GRES_GPUS" ]; then
    # GPUs that do not exist: slurmd drops a GPU without a File, so each is an empty
    # regular file (slurmd logs that it is not a device, and counts it; Slurm then
    # shows Gres=gpu:N). docs/slurm-local.md, "GPU counts".
    gres=" Gres=gpu:$GRES_GPUS"
    gres_types="GresTypes=gpu"
    : >"$STATE_DIR/gres.conf"
    for i in $(seq 1 "$NNODES"); do gres_line "node$i" "$GRES_GPUS"; done
  else
    rm -f "$STATE_DIR/gres.conf"
  fi
  for i in $(seq 1 "$NNODES"); do
    lines+="NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT + i))$gres"$'\n'
  done
  mkdir -p "$STATE_DIR"/{ctld,run,log} "$STATE_DIR"/spool
  for i in $(seq 1 "$NNODES"); do mkdir -p "$STATE_DIR/spool/node$i"; done
  local tmp="$CONF.tmp"
  # Fill the placeholders; node lines go in through a file to keep their newlines.
  printf '%s' "$lines" >"$STATE_DIR/node-lines"
  sed -e "s|@CTLD_HOST@|$(hostname -s)|" -e "s|@CTLD_PORT@|$CTLD_PORT|" \
      -e "s|@SLURMD_PORT@|$SLURMD_PORT|" -e "s|@STATE_DIR@|$STATE_DIR|g" \
      -e "s|@NODE_LIST@|node[1-$NNODES]|g" -e "s|@GRES_TYPES@|$gres_types|" \
      -e "s|@BF_INTERVAL@|$BF_INTERVAL|" -e "s|@KILL_WAIT@|$KILL_WAIT|" \
      -e "/@NODE_LINES@/{r $STATE_DIR/node-lines" -e "d}" \
      "$HERE/slurm.conf.in" >"$tmp"
  mv "$tmp" "$CONF"
}

running() {
  [ -f "$CONF" ] && pid_of "$STATE_DIR/run/slurmctld.pid" slurmctld >/dev/null || return 1
  local n
  for n in $(node_names); do pid_of "$STATE_DIR/run/slurmd-$n.pid" slurmd >/dev/null || return 1; done
  SLURM_CONF=$CONF timeout 10 sinfo -h -o %D >/dev/null 2>&1
}

wait_idle() {
  # All nodes answering (idle, or busy from an earlier run's jobs) within 30 s, and
  # 1 s more per 8 nodes (256 nodes took 16 s on 2 loaded cores).
  local limit=$((30 + NNODES / 8)) deadline up
  deadline=$((SECONDS + limit))
  while [ $SECONDS -lt $deadline ]; do
    up=$(SLURM_CONF=$CONF sinfo -N -h -p main -o '%N %T' 2>/dev/null | grep -cvE ' (down|unknown|drain|not_responding|fail|inval)' || true)
    [ "$up" = "$NNODES" ] && return 0
    sleep 0.5
  done
  log "nodes not up after $limit s: $(SLURM_CONF=$CONF sinfo -N -h -o '%N %T' 2>&1 | tr '\n' ' ')"
  return 1
}

start() {
  install_slurm
  if running; then
    log "already running ($CONF)"
    echo "SLURM_CONF=$CONF"
    return 0
  fi
  stop_daemons
  write_conf
  log "starting slurmctld and $NNODES slurmd under $STATE_DIR"
  # -c: start clean, without jobs left by an earlier run.
  slurmctld -f "$CONF" -c
  local n
  for n in $(node_names); do slurmd -f "$CONF" -N "$n"; done
  if ! wait_idle; then
    log "start failed; logs in $STATE_DIR/log"
    exit 1
  fi
  log "running: $NNODES nodes"
  echo "SLURM_CONF=$CONF"
}

stop_daemons() {
  # TERM every daemon at once, wait up to 10 s for all, then KILL what is left.
  local f pid pids=() i prog
  for f in "$STATE_DIR"/run/slurmd-*.pid "$STATE_DIR/run/slurmctld.pid"; do
    [ -e "$f" ] || continue
    prog=slurmd
    [ "$(basename -- "$f")" = slurmctld.pid ] && prog=slurmctld
    if pid=$(pid_of "$f" "$prog"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    elif [ -s "$f" ]; then
      log "not signalling the pid in $f: not a $prog of yours started with $CONF"
    fi
    rm -f -- "$f"
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  for i in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    # Checked again: a pid that exited meanwhile may belong to someone else by now.
    if our_daemon "$pid" slurmd || our_daemon "$pid" slurmctld; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

stop() {
  if [ -f "$CONF" ] && pid_of "$STATE_DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    # Cancel jobs first: a job step's slurmstepd outlives a stopped slurmd.
    SLURM_CONF=$CONF scancel --full --user "$(id -un)" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while [ $SECONDS -lt $deadline ] && [ -n "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ]; do
      sleep 0.5
    done
  fi
  stop_daemons
  log "stopped"
}

stop_one() {
  # $1 pid file, $2 program: TERM it if it is ours and wait (up to 10 s) until it is gone.
  local pid i
  pid=$(pid_of "$1" "$2") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "$2 ($pid) did not stop"
  exit 1
}

set_gpus() {
  # $1 node, $2 GPUs: what an administrator does to a node whose GPUs change: its
  # Gres in slurm.conf and gres.conf, then slurmctld (jobs kept) and that slurmd
  # restarted. Slurm kills a job running there ("gres/gpu count mismatch").
  local node=${1:-} count=${2:-} deadline
  if ! [[ "$node" =~ ^node[0-9]+$ && "$count" =~ ^[1-9][0-9]{0,2}$ ]]; then
    log "usage: $0 gpus nodeN COUNT"
    exit 2
  fi
  running || { log "not running ($STATE_DIR)"; exit 1; }
  if [ ! -s "$STATE_DIR/gres.conf" ] || ! grep -q "^NodeName=$node .* Gres=gpu:" "$CONF"; then
    log "gpus: $node declares no GPU: start the cluster with GRES_GPUS=N"
    exit 1
  fi
  sed -i -E "s/^(NodeName=$node .*) Gres=gpu:[0-9]+$/\1 Gres=gpu:$count/" "$CONF"
  sed -i "/^NodeName=$node /d" "$STATE_DIR/gres.conf"
  gres_line "$node" "$count"
  stop_one "$STATE_DIR/run/slurmctld.pid" slurmctld
  stop_one "$STATE_DIR/run/slurmd-$node.pid" slurmd
  slurmctld -f "$CONF"
  slurmd -f "$CONF" -N "$node"
  deadline=$((SECONDS + 30))
  until [ "$(SLURM_CONF=$CONF sinfo -h -n "$node" -p main -o %G 2>/dev/null)" = "gpu:$count" ]; do
    if [ $SECONDS -ge $deadline ]; then
      log "$node not back with $count GPU(s): $(SLURM_CONF=$CONF sinfo -h -n "$node" -o '%T %G %E' 2>&1)"
      exit 1
    fi
    sleep 0.5
  done
  wait_idle || exit 1 # every node answering the restarted slurmctld again
  log "$node has $count GPU(s)"
}

status() {
  if running; then
    echo "SLURM_CONF=$CONF"
    SLURM_CONF=$CONF sinfo -N -o '%N %P %T' >&2
    return 0
  fi
  log "not running ($STATE_DIR)"
  return 1
}

case "${1:-}" in
  start) secure_state_dir create ;;
  stop | status | gpus) secure_state_dir ;;
esac
case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  gpus) set_gpus "${2:-}" "${3:-}" ;;
  *) echo "usage: $0 start|stop|status|gpus nodeN COUNT" >&2; exit 2 ;;
esac
