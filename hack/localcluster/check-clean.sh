#!/usr/bin/env bash
# check-clean.sh: exits 0 when nothing of the local cluster is left on the machine, else
# lists what is (on stdout) and exits 1. Checked: processes, mounts, network namespaces,
# links, iptables chains, cgroups, and the sysctls recorded before up.sh ran.
# down.sh ends with it; tests call it after down.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LEFT=()
left() { LEFT+=("$*"); }

check_processes() {
  local pid
  for pid in $(lc_pids); do
    left "process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
  done
  local d
  for d in "${LC_DAEMONS[@]}"; do
    if pid=$(daemon_pid "$d"); then left "process $pid: $d (recorded by up.sh)"; fi
  done
}

check_mounts() {
  local mp
  while read -r mp; do
    [[ -n $mp ]] && left "mount $mp"
  done < <(lc_mounts)
  # `ip netns add` turns /run/netns into a mount point; left empty and mounted, it is ours.
  if [[ -s $LC_STATE/existed.before && ! -s $LC_STATE/run-netns-mounted.before ]] &&
    awk '$5 == "/run/netns" { f = 1 } END { exit !f }' /proc/self/mountinfo &&
    [[ -z $(ls -A /run/netns 2>/dev/null) ]]; then
    left "mount /run/netns (made by ip netns add, now empty)"
  fi
}

check_netns() {
  if [[ -e $LC_NETNS_PATH ]] || ip netns list 2>/dev/null | grep -qw "^$LC_NETNS"; then
    left "network namespace $LC_NETNS"
    local l
    while read -r l; do
      left "link $l (in $LC_NETNS)"
    done < <(ip -n "$LC_NETNS" -o link show 2>/dev/null | awk -F': ' '$2 != "lo" { print $2 }')
    if in_netns iptables-save 2>/dev/null | grep -q '^:\(KUBE\|CNI\)-'; then
      left "iptables chains in $LC_NETNS: $(in_netns iptables-save | grep -o '^:\(KUBE\|CNI\)-[^ ]*' | tr -d : | tr '\n' ' ')"
    fi
  fi
  local ns
  if [[ -s $LC_STATE/pod-netns ]]; then
    while read -r ns; do
      [[ -n $ns && -e $ns ]] && left "pod network namespace $ns"
    done <"$LC_STATE/pod-netns"
  fi
  [[ -e /etc/netns/$LC_NETNS ]] && left "file /etc/netns/$LC_NETNS"
  return 0
}

check_links() {
  local l
  while read -r l; do
    [[ -n $l ]] && left "link $l"
  done < <(ip -o link show 2>/dev/null | awk -F': ' -v b="$LC_BRIDGE" '{ sub(/@.*/, "", $2) } $2 == b || $2 ~ /^pgpilot/ { print $2 }')
}

# The cluster's chains only ever exist inside its namespace; finding KUBE-* chains in the
# host's tables (either iptables backend) means something ran outside it.
check_host_iptables() {
  local save chains
  for save in iptables-nft-save iptables-legacy-save; do
    command -v "$save" >/dev/null || continue
    chains=$("$save" 2>/dev/null | grep -o '^:KUBE-[^ ]*' | tr -d : | tr '\n' ' ' || true)
    [[ -n $chains ]] && left "iptables chains in the host namespace ($save): $chains"
  done
  return 0
}

check_cgroups() {
  local r d
  for r in $(cgroup_roots); do
    [[ -d $r ]] || continue
    while read -r d; do left "cgroup $d"; done < <(find "$r" -type d)
  done
}

check_sysctls() {
  [[ -s $LC_STATE/sysctl.before ]] || return 0
  local name value now
  while read -r name value; do
    now=$(sysctl -n "$name" 2>/dev/null | tr -s '\t ' ' ') || continue
    [[ $now == "$value" ]] || left "sysctl $name = $now (was $value before up.sh)"
  done <"$LC_STATE/sysctl.before"
}

main() {
  require_root
  check_processes
  check_mounts
  check_netns
  check_links
  check_host_iptables
  check_cgroups
  check_sysctls
  if ((${#LEFT[@]})); then
    printf '%s\n' "${LEFT[@]}"
    log "${#LEFT[@]} things of the local cluster are left (see above)"
    exit 1
  fi
  log "clean: no process, mount, namespace, link, iptables chain, cgroup or changed sysctl left"
}

main "$@"
