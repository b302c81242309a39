#!/usr/bin/env bash
# make demo: a real single-node Kubernetes cluster on this machine, pgpilot deployed in
# it, and the README's example cluster running, left up until `make demo-down`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build_images
cluster_up
push_images
deploy_operator

step "Applying the example PostgresCluster (3 instances; version $E2E_PG_MAJOR, the local image's)"
bash "$LC/exec.sh" kubectl apply -f - >&2 <<YAML
apiVersion: db.example.com/v1
kind: PostgresCluster
metadata:
  name: my-db
  namespace: default
spec:
  replicas: 3
  version: "$E2E_PG_MAJOR"
YAML
step "Waiting until my-db is Ready (about a minute)"
bash "$LC/exec.sh" kubectl wait pgc/my-db --for=condition=Ready --timeout=10m >&2
bash "$LC/exec.sh" kubectl get pgc,pods,svc -o wide

cat <<TXT

pgpilot runs in a local cluster inside the network namespace pgpilot-lc.

  kubectl:   hack/localcluster/exec.sh kubectl get pgc,pods,svc
  psql:      hack/localcluster/exec.sh kubectl run psql --rm -it --restart=Never \\
               --image=$POSTGRES_IMAGE --image-pull-policy=IfNotPresent \\
               --env=PGPASSWORD=\$(hack/localcluster/exec.sh kubectl get secret my-db-app -o jsonpath='{.data.password}' | base64 -d) \\
               -- psql -h my-db-rw -U app app
  failover:  hack/localcluster/exec.sh kubectl delete pod \$(hack/localcluster/exec.sh kubectl get pgc my-db -o jsonpath='{.status.currentPrimary}')
             then watch: hack/localcluster/exec.sh kubectl get pgc my-db -w
  switchover: hack/localcluster/exec.sh kubectl annotate pgc my-db db.example.com/switchover-to=my-db-2

  make demo-down   stops and removes the cluster, leaving the machine as it was
TXT
