#!/usr/bin/env bash
# Starts a real single-node Kubernetes v1.32 cluster inside the network namespace
# pgpilot-lc, offline, and prints the path of its kubeconfig on stdout.
#
# The namespace has only a loopback device (carrying the node address 10.77.0.1/32)
# and the pod bridge: there is no route off the machine. kubectl and tests reach the
# cluster through hack/localcluster/exec.sh. Every process logs to $LC_RUN/logs/.
#
# When the cluster is already up this returns at once; when a previous one is half up
# or was not torn down, it is torn down first (down.sh) and a fresh cluster starts.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CFG=$LC_RUN/config

# --- state ----------------------------------------------------------------------------

cluster_is_up() {
  local d
  netns_exists || return 1
  for d in "${LC_DAEMONS[@]}"; do daemon_pid "$d" >/dev/null || return 1; done
  kubectl_lc get --raw /readyz >/dev/null 2>&1 || return 1
  [[ $(kubectl_lc get node "$LC_NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

anything_left() {
  local d
  netns_exists && return 0
  for d in "${LC_DAEMONS[@]}"; do daemon_pid "$d" >/dev/null && return 0; done
  [[ -n $(lc_mounts) ]] && return 0
  local r
  for r in $(cgroup_roots); do [[ -d $r ]] && return 0; done
  return 1
}

# record_host_state keeps what teardown must restore or must not remove: the sysctls
# kubelet rewrites, and which shared directories and mounts existed before.
record_host_state() {
  rm -rf "$LC_STATE"
  mkdir -p "$LC_STATE"
  sysctl_values >"$LC_STATE/sysctl.before"
  local p
  for p in /run/netns /etc/netns /var/log/containers /var/lib/cni /run/containerd; do
    [[ -e $p ]] && echo "$p" >>"$LC_STATE/existed.before"
  done
  touch "$LC_STATE/existed.before"
  if awk '$5 == "/run/netns" { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    echo yes >"$LC_STATE/run-netns-mounted.before"
  fi
}

fresh_run_dir() {
  # No mount may remain below it (anything_left/down.sh made sure), so removing stays on
  # this filesystem and inside the run directory.
  [[ -z $(lc_mounts) ]] || die "mounts remain under $LC_RUN: run down.sh"
  rm -rf --one-file-system "$LC_RUN"
  mkdir -p "$LC_RUN" "$LC_LOGS" "$CFG" "$LC_RUN/pids"
}

# --- network namespace ----------------------------------------------------------------

make_netns() {
  log "creating network namespace $LC_NETNS (node address $LC_NODE_IP/32 on lo)"
  ip netns add "$LC_NETNS"
  stat -L -c %i "$LC_NETNS_PATH" >"$LC_STATE/netns.inode"
  ip -n "$LC_NETNS" link set lo up
  # The API server cannot advertise a loopback address and pods cannot reach the host's
  # 127.0.0.1, so the node gets an address of its own; a /32 on lo needs no other device.
  ip -n "$LC_NETNS" addr add "$LC_NODE_IP/32" dev lo
  # The namespace has no default route, and a connection is routed before kube-proxy's
  # OUTPUT rules rewrite a Service IP to a pod's: without a route for the Service range,
  # Service IPs would be unreachable from the node (the tests, kubectl port-forward-free
  # psql) while pods, whose default route is the bridge, reach them.
  ip -n "$LC_NETNS" route add "$LC_SVC_CIDR" dev lo src "$LC_NODE_IP"
  # Per-namespace sysctls: forwarding between pods and the node, bridged traffic through
  # iptables for Services. Neither touches the host's network.
  in_netns sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  # `ip netns exec` (exec.sh) bind-mounts this over /etc/resolv.conf, so tests and kubectl
  # in the namespace resolve Service names through CoreDNS.
  mkdir -p "/etc/netns/$LC_NETNS"
  cat >"/etc/netns/$LC_NETNS/resolv.conf" <<EOF
nameserver $LC_NODE_IP
search default.svc.cluster.local svc.cluster.local cluster.local
options ndots:5
EOF
}

# --- certificates and kubeconfigs -----------------------------------------------------

# issue NAME SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]: a key and a certificate
# signed by the cluster CA (or by pki/$LC_ISSUER.{crt,key} when LC_ISSUER is set).
issue() {
  local name=$1 subject=$2 eku=$3 sans=${4:-}
  openssl genrsa -out "$LC_PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$LC_PKI/$name.key" -subj "$subject" -out "$LC_PKI/$name.csr"
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = $eku"
    [[ -n $sans ]] && echo "subjectAltName = $sans"
  } >"$LC_PKI/$name.ext"
  local ca=${LC_ISSUER:-ca}
  openssl x509 -req -in "$LC_PKI/$name.csr" -CA "$LC_PKI/$ca.crt" -CAkey "$LC_PKI/$ca.key" \
    -set_serial "0x$(openssl rand -hex 12)" -days 365 -extfile "$LC_PKI/$name.ext" \
    -out "$LC_PKI/$name.crt" 2>/dev/null
  rm -f "$LC_PKI/$name.csr" "$LC_PKI/$name.ext"
}

make_pki() {
  log "writing certificates"
  mkdir -p "$LC_PKI"
  openssl genrsa -out "$LC_PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$LC_PKI/ca.key" -subj "/CN=$LC_NAME-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$LC_PKI/ca.crt"
  issue apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$LC_APISERVER_SVC_IP,IP:$LC_NODE_IP,IP:127.0.0.1"
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  issue admin "/O=system:masters/CN=$LC_NAME-admin" clientAuth
  issue controller-manager "/CN=system:kube-controller-manager" clientAuth
  issue scheduler "/CN=system:kube-scheduler" clientAuth
  issue kubelet "/O=system:nodes/CN=system:node:$LC_NODE" clientAuth
  issue kubelet-serving "/CN=$LC_NODE" serverAuth "DNS:$LC_NODE,IP:$LC_NODE_IP"
  issue kube-proxy "/CN=system:kube-proxy" clientAuth
  issue coredns "/CN=$LC_NAME:coredns" clientAuth
  issue registry "/CN=$LC_NAME-registry" serverAuth "IP:$LC_NODE_IP"
  # What clients of the registry trust (SSL_CERT_DIR, exec.sh and push-image.sh): the CA.
  mkdir -p "$LC_TRUST"
  cp "$LC_PKI/ca.crt" "$LC_TRUST/$LC_NAME-ca.crt"
  # The aggregation layer (OLM's packageserver is an aggregated API server): the API
  # server proxies to it with this client certificate, of a CA of its own, and the
  # aggregated server trusts the user headers of requests that present it.
  openssl genrsa -out "$LC_PKI/front-proxy-ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$LC_PKI/front-proxy-ca.key" -subj "/CN=$LC_NAME-front-proxy-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$LC_PKI/front-proxy-ca.crt"
  LC_ISSUER=front-proxy-ca issue front-proxy-client "/CN=front-proxy-client" clientAuth
  # Service-account tokens are signed with this pair.
  openssl genrsa -out "$LC_PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$LC_PKI/sa.key" -pubout -out "$LC_PKI/sa.pub" 2>/dev/null
  chmod 600 "$LC_PKI"/*.key
}

# kubeconfig FILE CERT: a kubeconfig that authenticates with pki/CERT.{crt,key}.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $LC_NAME
  cluster:
    server: https://$LC_NODE_IP:6443
    certificate-authority-data: $(base64 -w0 "$LC_PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$LC_PKI/$2.crt")
    client-key-data: $(base64 -w0 "$LC_PKI/$2.key")
contexts:
- name: $LC_NAME
  context:
    cluster: $LC_NAME
    user: $2
current-context: $LC_NAME
EOF
  chmod 600 "$1"
}

make_kubeconfigs() {
  kubeconfig "$LC_KUBECONFIG" admin
  local c
  for c in controller-manager scheduler kubelet kube-proxy coredns; do kubeconfig "$CFG/$c.kubeconfig" "$c"; done
}

# --- control plane --------------------------------------------------------------------

start_etcd() {
  log "starting etcd"
  # Plain HTTP on the namespace's loopback: nothing outside the namespace can reach it.
  # No fsync: a throwaway test cluster, and it keeps a busy disk from stalling etcd.
  start_daemon etcd "$LC_ETCD_BIN/etcd" --name "$LC_NAME" --data-dir "$LC_RUN/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "$LC_NAME=http://127.0.0.1:2380" --listen-metrics-urls "" \
    --unsafe-no-fsync --log-level warn
  wait_for etcd 30 in_netns curl --noproxy "*" -fsS http://127.0.0.1:2379/health || fail etcd
}

start_apiserver() {
  log "starting kube-apiserver"
  start_daemon kube-apiserver "$LC_K8S_BIN/kube-apiserver" \
    --advertise-address "$LC_NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
    --etcd-servers http://127.0.0.1:2379 \
    --service-cluster-ip-range "$LC_SVC_CIDR" \
    --client-ca-file "$LC_PKI/ca.crt" \
    --tls-cert-file "$LC_PKI/apiserver.crt" --tls-private-key-file "$LC_PKI/apiserver.key" \
    --kubelet-client-certificate "$LC_PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$LC_PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$LC_PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$LC_PKI/sa.pub" --service-account-signing-key-file "$LC_PKI/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --requestheader-client-ca-file "$LC_PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$LC_PKI/front-proxy-client.crt" --proxy-client-key-file "$LC_PKI/front-proxy-client.key" \
    --enable-aggregator-routing \
    --allow-privileged --profiling=false --cert-dir "$LC_RUN/apiserver"
  wait_for "kube-apiserver /readyz" 90 kubectl_lc get --raw /readyz || fail kube-apiserver
}

# Started after /readyz: kube-controller-manager exits if the built-in RBAC roles it
# needs do not exist yet.
start_controllers() {
  log "starting kube-controller-manager and kube-scheduler"
  start_daemon kube-controller-manager "$LC_K8S_BIN/kube-controller-manager" \
    --kubeconfig "$CFG/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CFG/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CFG/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "$LC_RUN/controller-manager" \
    --service-account-private-key-file "$LC_PKI/sa.key" --root-ca-file "$LC_PKI/ca.crt" \
    --use-service-account-credentials \
    --cluster-signing-cert-file "$LC_PKI/ca.crt" --cluster-signing-key-file "$LC_PKI/ca.key" \
    --service-cluster-ip-range "$LC_SVC_CIDR" --cluster-name "$LC_NAME" --leader-elect=false
  start_daemon kube-scheduler "$LC_K8S_BIN/kube-scheduler" \
    --kubeconfig "$CFG/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CFG/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CFG/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
}

# --- node -----------------------------------------------------------------------------

# can_lower_oom_score: whether this process may lower an oom_score_adj (CAP_SYS_RESOURCE),
# tried in a child so nothing of ours changes.
can_lower_oom_score() {
  bash -c 'echo $(($(cat /proc/self/oom_score_adj) - 1)) >/proc/self/oom_score_adj' 2>/dev/null
}

# The kubelet's cgroups live under /pgpilot-lc in every hierarchy (cgroupRoot), so
# teardown removes exactly that subtree. kubelet wants the root to exist already.
make_cgroups() {
  local r h
  for r in $(cgroup_roots); do
    mkdir -p "$r"
    h=$(dirname "$r")
    # A new cpuset cgroup starts with no CPUs and no memory nodes; give it the parent's.
    if [[ -e $h/cpuset.cpus ]]; then
      cat "$h/cpuset.cpus" >"$r/cpuset.cpus"
      cat "$h/cpuset.mems" >"$r/cpuset.mems"
    fi
  done
}

start_containerd() {
  log "starting containerd (its own root, state and socket under $LC_RUN/containerd)"
  local RESTRICT_OOM=false
  can_lower_oom_score || RESTRICT_OOM=true
  mkdir -p "$LC_RUN/containerd" "$LC_RUN/cni/net.d" "$LC_RUN/cni/ipam"
  cat >"$CFG/containerd.toml" <<EOF
version = 2
root = "$LC_RUN/containerd/root"
state = "$LC_RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$LC_CONTAINERD_SOCK"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$LC_RUN/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  disable_apparmor = true
  # kubelet asks for oom_score_adj -998 (pause) and -997 (Guaranteed pods); lowering it
  # below the caller's needs CAP_SYS_RESOURCE, which some sandboxes (this workplace's
  # among them) do not grant even to root, and runc then fails every sandbox with "can't
  # get final child's PID from pipe". This clamps the values at containerd's own.
  restrict_oom_score_adj = $RESTRICT_OOM
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = "$LC_RUN/containerd/runc"

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "$CFG/certs.d"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$LC_RUN/cni/net.d"
  max_conf_num = 1
EOF
  # No masquerading (nothing may leave), hairpin so a pod reaches itself through its
  # Service, IPAM state under the run directory instead of /var/lib/cni.
  cat >"$LC_RUN/cni/net.d/10-$LC_NAME.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$LC_NAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$LC_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$LC_RUN/cni/ipam",
        "ranges": [[{"subnet": "$LC_POD_CIDR", "gateway": "$LC_POD_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  start_daemon containerd /usr/bin/containerd --config "$CFG/containerd.toml"
  wait_for containerd 30 ctr_lc version || fail containerd
}

# start_registry runs the registry server on the node address, over TLS with a
# certificate of the cluster CA: clients that ask for HTTPS (operator-sdk's and opm's
# image pulls do, for any host) work as they would with a real registry. containerd pulls
# every image from it, through its mirrors (containerd_registry_hosts), kubelet's pause
# image included; tests and tools push to it and read it at $LC_REGISTRY.
start_registry() {
  log "starting the registry on $LC_REGISTRY (storage $LC_REGISTRY_DATA)"
  mkdir -p "$LC_REGISTRY_DATA"
  cat >"$CFG/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $LC_REGISTRY_DATA
  delete:
    enabled: true
http:
  addr: $LC_REGISTRY
  tls:
    certificate: $LC_PKI/registry.crt
    key: $LC_PKI/registry.key
  # Signs upload state between requests; one registry, so any random value will do.
  secret: $(openssl rand -hex 16)
EOF
  chmod 600 "$CFG/registry.yml"
  # The registry reports its traces nowhere.
  OTEL_TRACES_EXPORTER=none start_daemon registry "$LC_REGISTRY_BIN/registry" serve "$CFG/registry.yml"
  wait_for registry 30 in_netns curl --noproxy "*" --cacert "$LC_PKI/ca.crt" -fsS "https://$LC_REGISTRY/v2/" || fail registry
}

# containerd_registry_hosts writes containerd's registry configuration (config_path): the
# local registry is a mirror of each of $LC_MIRRORED, and a registry of its own name.
containerd_registry_hosts() {
  local h
  for h in "${LC_MIRRORED[@]}" "$LC_REGISTRY"; do
    mkdir -p "$CFG/certs.d/$h"
    cat >"$CFG/certs.d/$h/hosts.toml" <<EOF
# The node has no route off the machine: $h's images come from the local registry.
server = "https://$LC_REGISTRY"

[host."https://$LC_REGISTRY"]
  capabilities = ["pull", "resolve"]
  ca = "$LC_PKI/ca.crt"
EOF
  done
}

# push_base_images pushes the pause and busybox images, which kubelet and the smoke test
# pull, the ordinary way.
push_base_images() {
  log "pushing the pause and busybox images to the registry"
  bash "$LC_DIR/push-image.sh" "$PAUSE_IMAGE_TAR" "$PAUSE_IMAGE" >/dev/null
  bash "$LC_DIR/push-image.sh" "$BUSYBOX_IMAGE_TAR" "$BUSYBOX_IMAGE" >/dev/null
}

start_kubelet() {
  log "starting kubelet"
  # kubelet builds pods' resolv.conf from this file plus clusterDNS; the host's own
  # resolv.conf names servers pods cannot reach.
  echo "nameserver $LC_NODE_IP" >"$CFG/resolv.conf"
  cat >"$CFG/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $LC_NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $LC_PKI/ca.crt
authorization:
  mode: Webhook
tlsCertFile: $LC_PKI/kubelet-serving.crt
tlsPrivateKeyFile: $LC_PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$LC_CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$LC_CGROUP
failSwapOn: false
clusterDomain: cluster.local
clusterDNS:
- $LC_NODE_IP
resolvConf: $CFG/resolv.conf
podLogsDir: $LC_RUN/pod-logs
# A busy shared disk must not evict test pods.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
# Local images cannot be pulled again once collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  start_daemon kubelet "$LC_K8S_BIN/kubelet" --config "$CFG/kubelet.yaml" \
    --kubeconfig "$CFG/kubelet.kubeconfig" --root-dir "$LC_RUN/kubelet" \
    --hostname-override "$LC_NODE" --node-ip "$LC_NODE_IP" \
    --pod-infra-container-image "$PAUSE_IMAGE"
}

start_kube_proxy() {
  log "starting kube-proxy (iptables)"
  # conntrack limits and timeouts at 0: leave the kernel's (partly global) values alone.
  cat >"$CFG/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $CFG/kube-proxy.kubeconfig
hostnameOverride: $LC_NODE
clusterCIDR: $LC_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses:
- $LC_NODE_IP/32
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
  start_daemon kube-proxy "$LC_K8S_BIN/kube-proxy" --config "$CFG/kube-proxy.yaml"
}

# CoreDNS runs as a process on the node address (kubelet's clusterDNS): no image, and it
# answers as soon as its kubernetes plugin has synced. Names outside the cluster get
# NXDOMAIN at once; there is nowhere to forward them.
start_coredns() {
  log "starting CoreDNS on $LC_NODE_IP:53"
  kubectl_lc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: $LC_NAME:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $LC_NAME:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: $LC_NAME:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: $LC_NAME:coredns
EOF
  cat >"$CFG/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $LC_NODE_IP
    errors
    ready 127.0.0.1:8181
    health 127.0.0.1:8080
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $CFG/coredns.kubeconfig $LC_NAME
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
.:53 {
    bind $LC_NODE_IP
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
  start_daemon coredns "$LC_COREDNS_BIN/coredns" -conf "$CFG/Corefile"
}

# A default StorageClass without a provisioner and local PersistentVolumes backed by
# directories: enough for two 3-instance clusters and a 5-instance scale test. Sizes are
# labels only; every volume shares the run directory's filesystem. Released volumes are
# made available again by recycle-pvs.sh.
make_storage() {
  log "creating the default StorageClass and $LC_PV_COUNT local PersistentVolumes of $LC_PV_SIZE"
  local i name manifest
  manifest=$(
    cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
    for ((i = 1; i <= LC_PV_COUNT; i++)); do
      name=$(printf 'pv-%02d' "$i")
      mkdir -p "$LC_RUN/pv/$name"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $LC_NAME-$name
  labels:
    localcluster.pgpilot.local/volume: "true"
spec:
  capacity:
    storage: $LC_PV_SIZE
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  volumeMode: Filesystem
  local:
    path: $LC_RUN/pv/$name
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values: [$LC_NODE]
EOF
    done
  )
  kubectl_lc apply -f - >/dev/null <<<"$manifest"
}

# --- readiness ------------------------------------------------------------------------

node_ready() {
  [[ $(kubectl_lc get node "$LC_NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

dns_answers() {
  in_netns curl --noproxy "*" -fsS http://127.0.0.1:8181/ready &&
    ip netns exec "$LC_NETNS" getent hosts kubernetes.default.svc.cluster.local | grep -q "^$LC_APISERVER_SVC_IP "
}

# fail NAME: show the end of a daemon's log and stop.
fail() {
  log "$1 did not come up; the end of $LC_LOGS/$1.log:"
  tail -n 25 "$LC_LOGS/$1.log" >&2 || true
  die "$1 failed; tear down with hack/localcluster/down.sh"
}

main() {
  require_root
  if cluster_is_up; then
    log "already up"
    echo "$LC_KUBECONFIG"
    return 0
  fi
  bash "$LC_DIR/build.sh"
  if anything_left; then
    log "a previous cluster was left behind: tearing it down first"
    bash "$LC_DIR/down.sh" >&2
  fi
  local start=$SECONDS
  record_host_state
  fresh_run_dir
  make_netns
  make_pki
  make_kubeconfigs
  start_etcd
  start_apiserver
  start_controllers
  make_cgroups
  start_registry
  push_base_images
  containerd_registry_hosts
  start_containerd
  start_kubelet
  start_kube_proxy
  start_coredns
  make_storage
  wait_for "node $LC_NODE Ready" 120 node_ready || fail kubelet
  wait_for "CoreDNS" 60 dns_answers || fail coredns
  wait_for "the default ServiceAccount" 60 kubectl_lc get serviceaccount default || fail kube-controller-manager
  log "up in $((SECONDS - start))s; kubectl: hack/localcluster/exec.sh kubectl get nodes"
  log "kubeconfig (use inside the namespace): $LC_KUBECONFIG"
  echo "$LC_KUBECONFIG"
}

main "$@"
