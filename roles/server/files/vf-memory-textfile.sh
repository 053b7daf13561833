#!/bin/bash
# Each llama-server instance's memory as the kernel counts it, beside its plan, for node_exporter's
# textfile collector:
#   vf-memory-textfile PLAN_FILE TEXTFILE_DIR
# writes TEXTFILE_DIR/voltafleet-memory.prom (through vf-atomic: never half a file, mode 0644) with,
# per instance of PLAN_FILE (roles/server writes it: "host NAME", then "instance N TOTAL HELD" or "instance N - -"):
#   voltafleet_instance_memory_rss_bytes          VmRSS of the unit's main process (/proc/PID/status)
#   voltafleet_instance_memory_plan_bytes         the host-memory plan's bytes (voltafleet.planning.hostmem: its
#                                                 total, the file pages it reads included; MemoryMax is 1.10 x it)
#   voltafleet_instance_memory_plan_held_bytes    of that, what the plan says the kernel cannot reclaim (its
#                                                 `held`: anonymous memory, page tables, kernel memory), the
#                                                 quantity to hold the cgroup's charge less its page cache to
#   voltafleet_instance_memory_cgroup_bytes       what the kernel charges the unit's cgroup, the quantity its
#                                                 MemoryMax limits: memory.current (v1: memory.usage_in_bytes),
#                                                 page cache and kernel memory included
#   voltafleet_instance_memory_cgroup_file_bytes  of that, the page cache the kernel reclaims before it
#                                                 kills: memory.stat active_file + inactive_file (v1: total_*)
#   voltafleet_instance_memory_cgroup_limit_bytes the kernel's ceiling: memory.max (v1: memory.limit_in_bytes);
#                                                 none when unlimited
#   voltafleet_instance_memory_events_total{event} memory.events high, max, oom, oom_kill (v1: max is
#                                                 memory.failcnt, oom_kill memory.oom_control's; v1 has no
#                                                 high and no oom count), summed over the unit's runs
# A stopped instance has no rss and no cgroup lines, an unreadable cgroup no cgroup lines, an instance
# without a plan no plan line (never a made-up 0). voltafleet-memory.timer runs it every 30 s.
#
# The kernel's counters start at 0 in each new cgroup, and systemd makes one at each start: an OOM
# kill and the restart 5 s later would leave nothing for a reader every 30 s. So the unit's
# ExecStopPost (as root, in the ending run's cgroup) runs
#   vf-memory-textfile --fold INSTANCE
# which adds that run's counters to EVENTS_DIR/INSTANCE ("invocation ID", then "EVENT COUNT" lines),
# and the textfile reports that tally plus the running invocation's own counters (not once more
# when the tally already holds them: the same invocation).
# VF_PROC, VF_CGROUP, VF_ATOMIC, VF_EVENTS: /proc, /sys/fs/cgroup, vf-atomic and
# /run/voltafleet/memory-events elsewhere (the tests' fake tree).
set -euo pipefail
usage() {
  echo "usage: vf-memory-textfile PLAN_FILE TEXTFILE_DIR | vf-memory-textfile --fold INSTANCE" >&2
  exit 2
}
[ $# -eq 2 ] || usage
proc=${VF_PROC:-/proc} cgroup=${VF_CGROUP:-/sys/fs/cgroup}
atomic=${VF_ATOMIC:-$(dirname "$0")/vf-atomic}
events_dir=${VF_EVENTS:-/run/voltafleet/memory-events}
EVENTS=(high max oom oom_kill)
UNLIMITED=4611686018427387904  # 2^62: v1 writes "no limit" as 9223372036854771712
umask 022

memory_dir() {  # CGROUP_PATH: the unit's memory cgroup directory (v2, else v1's memory controller); nothing
  if [ -r "$cgroup$1/memory.current" ]; then echo "$cgroup$1"
  elif [ -r "$cgroup/memory$1/memory.usage_in_bytes" ]; then echo "$cgroup/memory$1"; fi
}

declare -A got=()
read_events() {  # DIR: got[EVENT]=count for each event the kernel counts there (v2 memory.events, v1 files)
  local key value _
  got=()
  if [ -r "$1/memory.events" ]; then
    while read -r key value _; do
      case "$key" in high|max|oom|oom_kill) got[$key]=$value ;; esac
    done < "$1/memory.events"
  elif [ -r "$1/memory.failcnt" ]; then
    got[max]=$(cat "$1/memory.failcnt")
    while read -r key value _; do
      if [ "$key" = oom_kill ]; then got[oom_kill]=$value; fi
    done < "$1/memory.oom_control" 2>/dev/null || true
  fi
}

declare -A tally=()
tally_invocation=""
read_tally() {  # INSTANCE: tally[EVENT] and tally_invocation from EVENTS_DIR/INSTANCE (none: empty)
  local key value _
  tally=() tally_invocation=""
  [ -r "$events_dir/$1" ] || return 0
  while read -r key value _; do
    case "$key" in
      invocation) tally_invocation=$value ;;
      high|max|oom|oom_kill) tally[$key]=$value ;;
    esac
  done < "$events_dir/$1"
}

if [ "$1" = --fold ]; then
  # ExecStopPost: this process runs in the ending run's cgroup (v1: its memory controller's line of
  # /proc/self/cgroup, else v2's "0::" line); fold only a cgroup that is the unit's own.
  inst=$2 path="" dir=""
  case "$inst" in ''|*[!0-9]*) usage ;; esac
  while IFS=: read -r _ controllers p; do
    case ",$controllers," in *,memory,*) path=$cgroup/memory$p ;; esac
    if [ -z "$controllers" ] && [ -z "$path" ] && [ -r "$cgroup$p/memory.current" ]; then path=$cgroup$p; fi
  done < "$proc/self/cgroup"
  case "$path" in */"llama-server@$inst.service") dir=$path ;; esac
  [ -n "$dir" ] || exit 0
  read_events "$dir"
  read_tally "$inst"
  invocation=${INVOCATION_ID:-}
  if [ -n "$invocation" ] && [ "$invocation" = "$tally_invocation" ]; then exit 0; fi  # folded already
  mkdir -p -- "$events_dir"
  {
    echo "invocation ${invocation:--}"
    for e in "${EVENTS[@]}"; do
      if [ -n "${got[$e]:-}" ] || [ -n "${tally[$e]:-}" ]; then echo "$e $(( ${tally[$e]:-0} + ${got[$e]:-0} ))"; fi
    done
  } | "$atomic" file "$events_dir/$inst"
  exit 0
fi

plan_file=$1 dir=$2
host="" units=() instances=() plans=() helds=()
while read -r key a b c _; do
  case "$key" in
    host) host=$a ;;
    instance) instances+=("$a"); plans+=("$b"); helds+=("${c:--}"); units+=("llama-server@$a.service") ;;
  esac
done < "$plan_file"
host=${host//\\/\\\\}; host=${host//\"/\\\"}

# One systemctl call for every unit: blocks of Id=, MainPID=, ControlGroup=, InvocationID= (in any
# order), a blank line after each.
declare -A pid=() cg=() inv=()
if [ ${#units[@]} -gt 0 ]; then
  id="" m=0 c="" i=""
  while IFS= read -r line; do
    case "$line" in
      Id=*) id=${line#Id=} ;;
      MainPID=*) m=${line#MainPID=} ;;
      ControlGroup=*) c=${line#ControlGroup=} ;;
      InvocationID=*) i=${line#InvocationID=} ;;
      "") if [ -n "$id" ]; then pid[$id]=$m cg[$id]=$c inv[$id]=$i; fi; id="" m=0 c="" i="" ;;
    esac
  done < <(systemctl show -p Id -p MainPID -p ControlGroup -p InvocationID -- "${units[@]}"; echo)
fi

vmrss_bytes() {  # VmRSS of a process in bytes; nothing when it is gone
  local key value _
  while read -r key value _; do
    if [ "$key" = "VmRSS:" ]; then echo $((value * 1024)); return; fi
  done < "$proc/$1/status" 2>/dev/null || true
}

file_bytes() {  # DIR: the cgroup's page cache on the file LRU lists (v2's names, v1's hierarchical total_*)
  local key value _ want=total_ sum=""
  if [ -r "$1/memory.current" ]; then want=""; fi
  while read -r key value _; do
    if [ "$key" = "${want}active_file" ] || [ "$key" = "${want}inactive_file" ]; then sum=$((${sum:-0} + value)); fi
  done < "$1/memory.stat" 2>/dev/null || true
  echo "$sum"
}

charged_bytes() {  # DIR: what the kernel charges the cgroup
  if [ -r "$1/memory.current" ]; then cat "$1/memory.current"; else cat "$1/memory.usage_in_bytes"; fi 2>/dev/null || true
}

limit_bytes() {  # DIR: the hard limit in bytes; nothing when unlimited
  local v=""
  if [ -r "$1/memory.max" ]; then v=$(cat "$1/memory.max")
  elif [ -r "$1/memory.limit_in_bytes" ]; then v=$(cat "$1/memory.limit_in_bytes"); fi
  case "$v" in ''|max|*[!0-9]*) return 0 ;; esac
  if [ "$v" -lt "$UNLIMITED" ]; then echo "$v"; fi
}

rss=() planned=() held=() charged=() cache=() limits=() counted=()
for n in "${!instances[@]}"; do
  unit=${units[$n]} labels="host=\"$host\",instance=\"${instances[$n]}\",unit=\"${units[$n]}\""
  p=${pid[$unit]:-0} value=""
  if [ "$p" != 0 ]; then value=$(vmrss_bytes "$p"); fi
  if [ -n "$value" ]; then rss+=("voltafleet_instance_memory_rss_bytes{$labels} $value"); fi
  if [ "${plans[$n]}" != - ] && [ -n "${plans[$n]}" ]; then
    planned+=("voltafleet_instance_memory_plan_bytes{$labels} ${plans[$n]}")
  fi
  if [ "${helds[$n]}" != - ] && [ -n "${helds[$n]}" ]; then
    held+=("voltafleet_instance_memory_plan_held_bytes{$labels} ${helds[$n]}")
  fi
  mem=""
  if [ -n "${cg[$unit]:-}" ]; then mem=$(memory_dir "${cg[$unit]}"); fi
  got=()
  if [ -n "$mem" ]; then
    if [ "$p" != 0 ]; then
      value=$(charged_bytes "$mem")
      if [ -n "$value" ]; then charged+=("voltafleet_instance_memory_cgroup_bytes{$labels} $value"); fi
      value=$(file_bytes "$mem")
      if [ -n "$value" ]; then cache+=("voltafleet_instance_memory_cgroup_file_bytes{$labels} $value"); fi
      value=$(limit_bytes "$mem")
      if [ -n "$value" ]; then limits+=("voltafleet_instance_memory_cgroup_limit_bytes{$labels} $value"); fi
    fi
    read_events "$mem"
  fi
  read_tally "${instances[$n]}"
  # the running invocation's own counts, unless its stop has folded them already
  if [ -n "$tally_invocation" ] && [ "${inv[$unit]:-}" = "$tally_invocation" ]; then got=(); fi
  for e in "${EVENTS[@]}"; do
    if [ -n "${got[$e]:-}" ] || [ -n "${tally[$e]:-}" ]; then
      counted+=("voltafleet_instance_memory_events_total{$labels,event=\"$e\"} $(( ${tally[$e]:-0} + ${got[$e]:-0} ))")
    fi
  done
done

metric() {  # TYPE NAME HELP LINES...: one metric family with its HELP and TYPE, nothing without a line
  local type=$1 name=$2 help=$3
  shift 3
  [ $# -gt 0 ] || return 0
  printf '# HELP %s %s\n# TYPE %s %s\n' "$name" "$help" "$name" "$type"
  printf '%s\n' "$@"
}

mkdir -p -- "$dir"
{
  metric gauge voltafleet_instance_memory_rss_bytes "resident memory (VmRSS) of the instance's llama-server" "${rss[@]}"
  metric gauge voltafleet_instance_memory_plan_bytes "the instance's planned host memory (voltafleet.planning.hostmem)" \
    "${planned[@]}"
  metric gauge voltafleet_instance_memory_plan_held_bytes \
    "of the plan, what the kernel cannot reclaim: anonymous memory, page tables, kernel memory (hostmem held)" \
    "${held[@]}"
  metric gauge voltafleet_instance_memory_cgroup_bytes \
    "memory the kernel charges the instance's cgroup (memory.current; v1 memory.usage_in_bytes), page cache included" \
    "${charged[@]}"
  metric gauge voltafleet_instance_memory_cgroup_file_bytes \
    "page cache among the cgroup's charge, reclaimed before an OOM kill (memory.stat active_file + inactive_file)" \
    "${cache[@]}"
  metric gauge voltafleet_instance_memory_cgroup_limit_bytes \
    "the cgroup's hard limit (memory.max; v1 memory.limit_in_bytes): the unit's MemoryMax" "${limits[@]}"
  metric counter voltafleet_instance_memory_events_total \
    "the cgroup's memory.events (v1: max = failcnt, oom_kill), summed over the unit's runs since boot" "${counted[@]}"
} | "$atomic" file "$dir/voltafleet-memory.prom"
