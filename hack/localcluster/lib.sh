# shellcheck shell=bash
# shellcheck disable=SC2034 # the names are for the scripts that source this file
# Shared names, paths and helpers of the local cluster scripts (sourced, not run).
#
# Everything the cluster creates carries the name $LC_NAME, so teardown and the
# cleanliness check can find it: the network namespace, the node, the cgroup subtree,
# the CNI network and the bridge. Addresses only exist inside that namespace.

LC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LC_DIR/../.." && pwd)

K8S_VERSION=1.32.0
ETCD_VERSION=3.5.17
COREDNS_VERSION=1.11.4
# The registry server: distribution's, as CNCF Distribution publishes it.
REGISTRY_VERSION=3.0.0

PGPILOT_CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
LC_CACHE=$PGPILOT_CACHE/localcluster
LC_K8S_BIN=$LC_CACHE/k8s-v$K8S_VERSION
LC_ETCD_BIN=$LC_CACHE/etcd-v$ETCD_VERSION
LC_COREDNS_BIN=$LC_CACHE/coredns-v$COREDNS_VERSION
LC_REGISTRY_BIN=$LC_CACHE/registry-v$REGISTRY_VERSION
LC_IMAGES=$LC_CACHE/images
LC_TOOLS=$LC_CACHE/tools
# The running cluster's state: certificates, etcd, containerd, kubelet, volumes and logs.
# Wiped when a cluster comes up, kept after teardown so the logs can be read.
LC_RUN=${PGPILOT_LC_RUN:-$LC_CACHE/run}
LC_LOGS=$LC_RUN/logs
LC_PKI=$LC_RUN/pki
LC_KUBECONFIG=$LC_RUN/kubeconfig
# The cluster CA alone, for SSL_CERT_DIR: Go programs (crane, operator-sdk, opm, tests)
# then trust the registry's certificate.
LC_TRUST=$LC_RUN/trust
# Records that must outlive a teardown (the sysctls before up.sh, what existed before).
LC_STATE=$LC_CACHE/state

LC_NAME=pgpilot-lc
LC_NETNS=$LC_NAME
LC_NETNS_PATH=/run/netns/$LC_NETNS
LC_NODE=$LC_NAME
LC_NODE_IP=10.77.0.1
LC_POD_CIDR=10.88.0.0/16
LC_POD_GATEWAY=10.88.0.1
LC_SVC_CIDR=10.96.0.0/16
LC_APISERVER_SVC_IP=10.96.0.1
LC_BRIDGE=pgpilot-br0
LC_CGROUP=$LC_NAME
LC_CONTAINERD_SOCK=$LC_RUN/containerd/containerd.sock
# The node's image registry, a daemon on the node address (HTTPS, a certificate of the
# cluster CA; nothing outside the namespace reaches it). Its storage outlives a cluster, as the image tarballs do, so a
# push of an image it already holds only compares digests; build.sh empties it when it
# grows past PGPILOT_REGISTRY_MAX_MB.
LC_REGISTRY=$LC_NODE_IP:5000
LC_REGISTRY_DATA=$LC_CACHE/registry-data
# Registries whose images containerd pulls from the local registry instead (its mirrors,
# hosts.toml under config_path): images keep their real names, quay.io/..., example.com/...,
# and manifests need no rewriting. The local registry holds an image of any of them under
# the same path without the host (docker.io/library/x:1 as $LC_REGISTRY/library/x:1).
LC_MIRRORED=(docker.io quay.io example.com pgpilot.local)
LC_PV_COUNT=${PGPILOT_LC_PVS:-12}
LC_PV_SIZE=${PGPILOT_LC_PV_SIZE:-2Gi}

# Local images. Another script may provide the pause image: PAUSE_IMAGE_TAR is its tarball
# and PAUSE_IMAGE the name inside it. Without them build.sh builds one from ./pause.
PAUSE_IMAGE=${PAUSE_IMAGE:-pgpilot.local/pause:3.10}
PAUSE_IMAGE_TAR=${PAUSE_IMAGE_TAR:-$LC_IMAGES/pause-3.10.tar}
BUSYBOX_IMAGE=pgpilot.local/busybox:1.35
BUSYBOX_IMAGE_TAR=$LC_IMAGES/busybox-1.35.tar

# The global sysctls kubelet rewrites on start (kernel.panic=10, panic_on_oops=1, ...),
# plus host-namespace network and conntrack ones that must stay untouched because all
# of the cluster's networking lives in its own namespace.
LC_SYSCTLS=(
  kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max
)

# The daemons in start order; teardown walks them backwards.
LC_DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler registry containerd kubelet kube-proxy coredns)

log() { echo "localcluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

require_root() { [[ $(id -u) == 0 ]] || die "must run as root (network namespaces, mounts, cgroups)"; }

# in_netns runs a command in the cluster's network namespace but the host's mount
# namespace. `ip netns exec` would also give it a private mount namespace, and then
# kubelet's volume mounts would be invisible to containerd, and to teardown.
in_netns() { nsenter --net="$LC_NETNS_PATH" -- "$@"; }

netns_exists() { [[ -e $LC_NETNS_PATH ]] && ip netns list 2>/dev/null | grep -qw "^$LC_NETNS"; }

# registry_trust exports SSL_CERT_DIR so that Go programs trust the cluster CA besides
# the system's roots.
registry_trust() { export SSL_CERT_DIR=$LC_TRUST:${SSL_CERT_DIR:-/etc/ssl/certs}; }

kubectl_lc() { in_netns "$LC_K8S_BIN/kubectl" --kubeconfig "$LC_KUBECONFIG" "$@"; }

ctr_lc() { ctr --address "$LC_CONTAINERD_SOCK" --namespace k8s.io "$@"; }

pidfile() { echo "$LC_RUN/pids/$1.pid"; }

# registry_ref REF prints where the local registry holds the image REF: the same path
# under $LC_REGISTRY, as containerd's mirrors ask for it (docker.io/library/ for a name
# without a registry, as docker and containerd read it). REF's registry must be one of
# $LC_MIRRORED, or the local registry itself.
registry_ref() {
  local ref=$1 host m
  if [[ $ref != */* ]]; then
    ref=docker.io/library/$ref
  elif host=${ref%%/*} && [[ $host != *.* && $host != *:* && $host != localhost ]]; then
    ref=docker.io/$ref
  fi
  host=${ref%%/*}
  [[ $host == "$LC_REGISTRY" ]] && { echo "$ref"; return 0; }
  for m in "${LC_MIRRORED[@]}"; do
    [[ $host == "$m" ]] && { echo "$LC_REGISTRY/${ref#*/}"; return 0; }
  done
  die "$1: the node pulls images of ${LC_MIRRORED[*]} and $LC_REGISTRY only (LC_MIRRORED in hack/localcluster/lib.sh)"
}

# build_go_commands WORK OUT MODULE@VERSION LDFLAGS PACKAGE...: builds another project's
# commands at a pinned version from the Go module proxy, in a throwaway module in WORK,
# into OUT (static, -trimpath, -s -w plus LDFLAGS). GO_REPLACES, when set, holds the
# replace directives (old=new@version, space-separated) that the project's own go.mod
# carries and a module requiring it does not inherit.
build_go_commands() {
  local work=$1 out=$2 modver=$3 ldflags=$4 r
  shift 4
  mkdir -p "$work" "$out"
  (
    set -e
    cd "$work" || exit 1
    go mod init pgpilot.local/build >/dev/null 2>&1
    for r in ${GO_REPLACES:-}; do go mod edit -replace="$r"; done
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      printf '\t_ "%s"\n' "$@"
      printf ')\n'
    } >tools.go
    go get "$modver" >/dev/null 2>&1 || go get "$modver"
    go mod tidy >/dev/null 2>&1 || go mod tidy
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$out/" "$@"
  )
}

# The image tools build.sh builds (mkimage, crane, pause), in a directory named after
# their sources; build.sh records which.
lc_tools_dir() {
  local d
  d=$(cat "$LC_IMAGES/.tools" 2>/dev/null || true)
  [[ -n $d && -x $d/crane ]] || die "the image tools are not built: run hack/localcluster/build.sh"
  echo "$d"
}

# daemon_pid prints the recorded pid of a daemon if that process still runs the binary it
# was started from (a recycled pid never matches).
daemon_pid() {
  local f pid exe
  f=$(pidfile "$1")
  [[ -s $f ]] || return 1
  read -r pid exe <"$f"
  [[ -n $pid && -e /proc/$pid ]] || return 1
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] || return 1
  echo "$pid"
}

# start_daemon NAME BINARY ARGS... starts BINARY in the namespace as its own session,
# logging to $LC_LOGS/NAME.log, and records its pid.
start_daemon() {
  local name=$1 bin=$2
  shift 2
  mkdir -p "$LC_LOGS" "$LC_RUN/pids"
  # Without job control a background child is no process-group leader, so setsid does
  # not fork and $! is the daemon itself.
  setsid nsenter --net="$LC_NETNS_PATH" -- "$bin" "$@" >>"$LC_LOGS/$name.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$bin")" >"$(pidfile "$name")"
}

# stop_pid PID [SECONDS]: SIGTERM, then SIGKILL after the grace period.
stop_pid() {
  local pid=$1 grace=${2:-10} i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < grace * 10; i++)); do
    [[ -e /proc/$pid ]] || return 0
    # A zombie whose parent is gone is reaped by init; treat it as stopped.
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

stop_daemon() {
  local pid
  if pid=$(daemon_pid "$1"); then
    stop_pid "$pid" "${2:-10}"
  fi
  rm -f "$(pidfile "$1")"
}

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 timeout=$2 deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

# cgroup_roots prints this cluster's cgroup directory in every mounted hierarchy.
cgroup_roots() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -e $h/cgroup.procs ]] && echo "${h%/}/$LC_CGROUP"
  done
}

# lc_mounts prints the mount points that belong to the cluster, deepest first: anything
# under the run directory (kubelet volumes, containerd rootfs and shm), the pod network
# namespaces containerd pinned under /run/netns, and the cluster's own namespace.
lc_mounts() {
  local pods=""
  [[ -s $LC_STATE/pod-netns ]] && pods=$(cat "$LC_STATE/pod-netns")
  awk -v run="$LC_RUN/" -v ns="$LC_NETNS_PATH" -v pods="$pods" '
    BEGIN { n = split(pods, p, "\n"); for (i = 1; i <= n; i++) if (p[i] != "") want[p[i]] = 1 }
    { mp = $5; gsub(/\\040/, " ", mp)
      if (index(mp "/", run) == 1 || mp == ns || (mp in want)) print length(mp) " " mp }' \
    /proc/self/mountinfo | sort -rn -k1,1 | cut -d' ' -f2- | uniq
}

# lc_pids prints the processes of the cluster that are still alive: anything in its
# network namespace, any containerd shim or runc serving its containerd, anything in its
# cgroups. Matched by identity, never by a process name alone.
lc_pids() {
  local inode="" strict=0 pid
  [[ -s $LC_STATE/netns.inode ]] && inode=$(cat "$LC_STATE/netns.inode")
  # Namespace inode numbers are reused once a namespace is gone: without the namespace's
  # file, a process in a namespace with that number must also be one of ours.
  [[ -e $LC_NETNS_PATH ]] || strict=1
  {
    if [[ -n $inode ]]; then
      find /proc/[0-9]*/ns/net -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
        awk -v ns="net:[$inode]" '$2 == ns { split($1, p, "/"); print p[3] }' |
        while read -r pid; do
          ((strict)) && ! lc_owned "$pid" && continue
          echo "$pid"
        done
    fi
    find /proc/[0-9]*/exe -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
      awk '$2 ~ /\/containerd-shim[^\/]*$|\/runc$/ { split($1, p, "/"); print p[3] }' |
      while read -r pid; do
        grep -aqF "$LC_RUN/" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
      done
    local r
    for r in $(cgroup_roots); do
      [[ -d $r ]] || continue
      find "$r" -name cgroup.procs -exec cat {} + 2>/dev/null
    done
    true
  } | awk -v self=$$ '$0 != self' | sort -un
}

# lc_owned PID: the process runs one of the cluster's binaries or works on its run directory.
lc_owned() {
  [[ $(readlink "/proc/$1/exe" 2>/dev/null) == "$LC_CACHE/"* ]] || grep -aqF "$LC_RUN/" "/proc/$1/cmdline" 2>/dev/null
}

# sysctl_values prints "name value" for each recorded sysctl (host namespaces).
sysctl_values() {
  local s v
  for s in "${LC_SYSCTLS[@]}"; do
    v=$(sysctl -n "$s" 2>/dev/null | tr -s '\t ' ' ') || continue
    echo "$s $v"
  done
}
