#!/usr/bin/env bash
# smoke.sh: proves the running local cluster works end to end: a busybox pod with a
# claim on a local volume runs, the claim binds, a Service name resolves through CoreDNS
# from a pod and from the namespace, and the Service answers through kube-proxy. Cleans
# up after itself (and recycles the volume it used).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NS=lc-smoke
require_root
netns_exists || die "the local cluster is not up: run hack/localcluster/up.sh"
k() { kubectl_lc "$@"; }

cleanup() {
  k delete namespace "$NS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  bash "$LC_DIR/recycle-pvs.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT

k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: $NS
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: $NS
  labels:
    app: web
spec:
  securityContext:
    fsGroup: 2000
  containers:
  - name: web
    image: $BUSYBOX_IMAGE
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'echo hello from \$(hostname) >/data/index.html && exec httpd -f -p 8080 -h /data']
    ports:
    - containerPort: 8080
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: $NS
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: pause
  namespace: $NS
spec:
  containers:
  - name: pause
    image: $PAUSE_IMAGE
    imagePullPolicy: IfNotPresent
YAML

k -n "$NS" wait --for=condition=Ready pod/web pod/pause --timeout=90s >/dev/null
log "pods web (busybox) and pause are Running"
[[ $(k -n "$NS" get pvc data -o 'jsonpath={.status.phase}') == Bound ]] || die "claim data is not Bound"
log "claim data is Bound to $(k -n "$NS" get pvc data -o 'jsonpath={.spec.volumeName}')"
k -n "$NS" exec web -- sh -c 'ls -ld /data | grep -q " 2000 "' || die "fsGroup 2000 was not applied to the volume"
log "the volume is group-owned by fsGroup 2000"

fqdn=web.$NS.svc.cluster.local
ip=$(k -n "$NS" get svc web -o 'jsonpath={.spec.clusterIP}')
k -n "$NS" exec web -- nslookup "$fqdn" | grep -q "$ip" || die "$fqdn did not resolve to $ip from a pod"
log "$fqdn resolves to $ip from a pod (CoreDNS)"
out=$(k -n "$NS" exec web -- wget -qO- "http://$fqdn/")
[[ $out == "hello from web" ]] || die "the Service answered '$out'"
log "the Service answers through kube-proxy from a pod: $out"
out=$(ip netns exec "$LC_NETNS" curl --noproxy "*" -fsS --max-time 5 "http://web.$NS/")
[[ $out == "hello from web" ]] || die "the Service answered '$out' in the namespace"
log "and from the cluster's network namespace by its short name: $out"
log "smoke test passed"
