#!/bin/bash
# Each llama-server instance's memory beside its plan, for node_exporter's textfile collector:
#   vf-memory-textfile PLAN_FILE TEXTFILE_DIR
# writes TEXTFILE_DIR/voltafleet-memory.prom (through vf-atomic: never half a file, mode 0644) with,
# per instance of PLAN_FILE (roles/server writes it: "host NAME", then "instance N BYTES|-"):
#   voltafleet_instance_memory_rss_bytes     VmRSS of the unit's main process (/proc/PID/status)
#   voltafleet_instance_memory_plan_bytes    the host-memory plan's bytes (voltafleet.planning.hostmem)
#   voltafleet_instance_memory_cgroup_bytes  the unit's cgroup memory.current (v1: memory.usage_in_bytes)
# A stopped instance has no rss, an unreadable cgroup no cgroup line, an instance without a plan
# no plan line (never a made-up 0). voltafleet-memory.timer runs it every 30 s.
# VF_PROC, VF_CGROUP, VF_ATOMIC: /proc, /sys/fs/cgroup and vf-atomic elsewhere (the tests' fake tree).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: vf-memory-textfile PLAN_FILE TEXTFILE_DIR" >&2; exit 2; }
plan_file=$1 dir=$2
proc=${VF_PROC:-/proc} cgroup=${VF_CGROUP:-/sys/fs/cgroup}
atomic=${VF_ATOMIC:-$(dirname "$0")/vf-atomic}
umask 022

host="" units=() instances=() plans=()
while read -r key a b _; do
  case "$key" in
    host) host=$a ;;
    instance) instances+=("$a"); plans+=("$b"); units+=("llama-server@$a.service") ;;
  esac
done < "$plan_file"
host=${host//\\/\\\\}; host=${host//\"/\\\"}

# One systemctl call for every unit: blocks of Id=, MainPID=, ControlGroup= (in any order), a blank line after each.
declare -A pid=() cg=()
if [ ${#units[@]} -gt 0 ]; then
  id="" m=0 c=""
  while IFS= read -r line; do
    case "$line" in
      Id=*) id=${line#Id=} ;;
      MainPID=*) m=${line#MainPID=} ;;
      ControlGroup=*) c=${line#ControlGroup=} ;;
      "") if [ -n "$id" ]; then pid[$id]=$m cg[$id]=$c; fi; id="" m=0 c="" ;;
    esac
  done < <(systemctl show -p Id -p MainPID -p ControlGroup -- "${units[@]}"; echo)
fi

vmrss_bytes() {  # VmRSS of a process in bytes; nothing when it is gone
  local key value _
  while read -r key value _; do
    if [ "$key" = "VmRSS:" ]; then echo $((value * 1024)); return; fi
  done < "$proc/$1/status" 2>/dev/null || true
}

cgroup_bytes() {  # the cgroup's charged memory: cgroup v2, else v1; nothing when neither is readable
  local f
  for f in "$cgroup$1/memory.current" "$cgroup/memory$1/memory.usage_in_bytes"; do
    if [ -r "$f" ]; then cat "$f"; return; fi
  done
}

rss=() planned=() charged=()
for n in "${!instances[@]}"; do
  unit=${units[$n]} labels="host=\"$host\",instance=\"${instances[$n]}\",unit=\"${units[$n]}\""
  p=${pid[$unit]:-0} value=""
  if [ "$p" != 0 ]; then value=$(vmrss_bytes "$p"); fi
  if [ -n "$value" ]; then rss+=("voltafleet_instance_memory_rss_bytes{$labels} $value"); fi
  if [ "${plans[$n]}" != - ] && [ -n "${plans[$n]}" ]; then
    planned+=("voltafleet_instance_memory_plan_bytes{$labels} ${plans[$n]}")
  fi
  value=""
  if [ -n "${cg[$unit]:-}" ] && [ "$p" != 0 ]; then value=$(cgroup_bytes "${cg[$unit]}"); fi
  if [ -n "$value" ]; then charged+=("voltafleet_instance_memory_cgroup_bytes{$labels} $value"); fi
done

gauge() {  # NAME HELP LINES...: one gauge with its HELP and TYPE, nothing without a line
  local name=$1 help=$2
  shift 2
  [ $# -gt 0 ] || return 0
  printf '# HELP %s %s\n# TYPE %s gauge\n' "$name" "$help" "$name"
  printf '%s\n' "$@"
}

mkdir -p -- "$dir"
{
  gauge voltafleet_instance_memory_rss_bytes "resident memory (VmRSS) of the instance's llama-server" "${rss[@]}"
  gauge voltafleet_instance_memory_plan_bytes "the instance's planned host memory (voltafleet.planning.hostmem)" \
    "${planned[@]}"
  gauge voltafleet_instance_memory_cgroup_bytes "memory charged to the instance's cgroup (page cache included)" \
    "${charged[@]}"
} | "$atomic" file "$dir/voltafleet-memory.prom"
