#!/usr/bin/env bash
# Tears the local cluster down and leaves nothing of it on the machine: no process, mount,
# network namespace, link, iptables chain or cgroup, and the sysctls kubelet changed
# restored. Safe to run at any time, any number of times. Ends with check-clean.sh and
# fails when that finds something left. Logs stay in $LC_RUN/logs.
#
# The order matters (found the hard way): pods first, while kubelet can still unmount
# their volumes and containerd can still tear their networks down; then the node
# daemons; then whatever containers are left, through containerd; then containerd and
# its shims; then the control plane; then mounts, the namespace and cgroups.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# delete_pods deletes every pod through the API and waits for kubelet to finish them.
# The controller manager and scheduler stop first so nothing gets recreated.
delete_pods() {
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  daemon_pid kube-apiserver >/dev/null && daemon_pid kubelet >/dev/null || return 0
  kubectl_lc get --raw /readyz >/dev/null 2>&1 || return 0
  [[ -n $(kubectl_lc get pods -A -o name 2>/dev/null) ]] || return 0
  log "deleting pods"
  kubectl_lc delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
  wait_for "pods to terminate" 60 no_pods || log "some pods did not terminate; their containers are killed below"
}

no_pods() { [[ -z $(kubectl_lc get pods -A -o name 2>/dev/null) ]]; }

stop_node_daemons() {
  if daemon_pid kube-proxy >/dev/null; then
    stop_daemon kube-proxy
    # Removes kube-proxy's rules; the namespace's removal would too, this keeps the order
    # honest if the namespace is ever kept.
    if netns_exists; then
      in_netns "$LC_K8S_BIN/kube-proxy" --cleanup >>"$LC_LOGS/kube-proxy.log" 2>&1 || true
    fi
  fi
  stop_daemon kube-proxy
  stop_daemon coredns
  stop_daemon kubelet 20
}

# remove_containers kills and removes every container left in containerd. Before that it
# records the pod network namespaces containerd pinned under /run/netns (their
# mounts go below) and the shims' sockets.
remove_containers() {
  daemon_pid containerd >/dev/null || return 0
  local ids id
  ids=$(ctr_lc containers ls -q 2>/dev/null || true)
  [[ -n $ids ]] || return 0
  log "removing $(wc -w <<<"$ids") containers left in containerd"
  for id in $ids; do
    ctr_lc containers info "$id" 2>/dev/null | grep -o '"/var/run/netns/cni-[^"]*"' | tr -d '"' |
      sed 's|^/var/run/|/run/|' >>"$LC_STATE/pod-netns" || true
    # containerd names a shim's socket after sha256(<socket>/<namespace>/<id>); a killed
    # shim leaves it behind.
    echo "/run/containerd/s/$(printf '%s' "$LC_CONTAINERD_SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)" \
      >>"$LC_STATE/shim-sockets"
  done
  for id in $ids; do ctr_lc tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true; done
  for id in $ids; do
    ctr_lc tasks delete --force "$id" >/dev/null 2>&1 || true
    ctr_lc containers delete "$id" >/dev/null 2>&1 || true
  done
}

kill_leftovers() {
  local pids pid
  pids=$(lc_pids | sort -un)
  [[ -n $pids ]] || return 0
  log "killing leftover processes: ${pids//$'\n'/ }"
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
  sleep 0.5
}

stop_containerd() {
  stop_daemon containerd 15
  kill_leftovers
  # The registry served containerd's pulls; its storage stays (a cache, lib.sh).
  stop_daemon registry
}

stop_control_plane() {
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  stop_daemon kube-apiserver 15
  stop_daemon etcd 15
  # Anything else still in the namespace (a test started through exec.sh, say).
  kill_leftovers
}

unmount_all() {
  local mp round
  for round in 1 2 3 4 5; do
    local mounts
    mounts=$(lc_mounts)
    [[ -n $mounts ]] || break
    ((round == 1)) && log "unmounting $(wc -l <<<"$mounts") mounts"
    while read -r mp; do
      umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
    done <<<"$mounts"
  done
  # The pinned pod namespaces are files once unmounted.
  if [[ -s $LC_STATE/pod-netns ]]; then
    while read -r mp; do
      if [[ -n $mp ]] && ! awk -v m="$mp" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; then
        rm -f "$mp"
      fi
    done <"$LC_STATE/pod-netns"
  fi
}

remove_netns() {
  if netns_exists || [[ -e $LC_NETNS_PATH ]]; then
    log "removing network namespace $LC_NETNS (its bridge, veths and iptables chains go with it)"
    ip -n "$LC_NETNS" link del "$LC_BRIDGE" 2>/dev/null || true
    ip netns del "$LC_NETNS" 2>/dev/null || { umount "$LC_NETNS_PATH" 2>/dev/null; rm -f "$LC_NETNS_PATH"; }
  fi
  rm -rf "/etc/netns/$LC_NETNS"
  if created /etc/netns; then rmdir /etc/netns 2>/dev/null || true; fi
  # `ip netns add` made /run/netns a mount point of its own when it was none; undo that
  # once no namespace is left in it.
  if [[ ! -s $LC_STATE/run-netns-mounted.before && -d /run/netns && -z $(ls -A /run/netns) ]]; then
    while awk '$5 == "/run/netns" { f = 1 } END { exit !f }' /proc/self/mountinfo; do
      umount /run/netns 2>/dev/null || break
    done
    if created /run/netns; then rmdir /run/netns 2>/dev/null || true; fi
  fi
}

# created PATH: true if PATH did not exist before up.sh.
created() { [[ -s $LC_STATE/existed.before ]] && ! grep -qx "$1" "$LC_STATE/existed.before"; }

remove_cgroups() {
  local r
  for r in $(cgroup_roots); do
    [[ -d $r ]] || continue
    # Deepest first: a cgroup directory can only go once its children are gone.
    find "$r" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

restore_sysctls() {
  [[ -s $LC_STATE/sysctl.before ]] || return 0
  local name value now
  while read -r name value; do
    now=$(sysctl -n "$name" 2>/dev/null | tr -s '\t ' ' ') || continue
    if [[ $now != "$value" ]]; then
      log "restoring $name = $value (was $now)"
      sysctl -q -w "$name=$value" >/dev/null
    fi
  done <"$LC_STATE/sysctl.before"
}

# remove_files removes what the node left in shared directories: kubelet's log
# symlinks, the CNI plugins' result cache, killed shims' sockets.
remove_files() {
  local f
  if [[ -d /var/log/containers ]]; then
    for f in /var/log/containers/*; do
      [[ -L $f && $(readlink "$f") == "$LC_RUN/"* ]] && rm -f "$f"
    done
    if created /var/log/containers; then rmdir /var/log/containers 2>/dev/null || true; fi
  fi
  rm -f /var/lib/cni/results/"$LC_NAME"-* 2>/dev/null || true
  if created /var/lib/cni; then
    rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  fi
  if [[ -s $LC_STATE/shim-sockets ]]; then
    xargs -r rm -f <"$LC_STATE/shim-sockets"
    rm -f "$LC_STATE/shim-sockets"
  fi
  if created /run/containerd; then
    rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  fi
  rm -rf "$LC_RUN/pids"
}

main() {
  require_root
  mkdir -p "$LC_STATE" "$LC_LOGS"
  delete_pods
  stop_node_daemons
  remove_containers
  stop_containerd
  stop_control_plane
  unmount_all
  remove_netns
  remove_cgroups
  restore_sysctls
  remove_files
  bash "$LC_DIR/check-clean.sh"
}

main "$@"
