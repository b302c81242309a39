#!/usr/bin/env bash
# recycle-pvs.sh: makes the local cluster's Released PersistentVolumes Available again,
# their directories emptied. Local volumes have no provisioner to do that, so without it
# every deleted claim uses up one of the up.sh's volumes for the cluster's lifetime.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_root
netns_exists || die "the local cluster is not up: run hack/localcluster/up.sh"
n=0
while read -r pv phase path; do
  [[ $phase == Released && $path == "$LC_RUN/pv/"* ]] || continue
  find "$path" -mindepth 1 -delete
  kubectl_lc patch pv "$pv" --type json -p '[{"op": "remove", "path": "/spec/claimRef"}]' >/dev/null
  n=$((n + 1))
done < <(kubectl_lc get pv -l localcluster.pgpilot.local/volume=true \
  -o 'jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.local.path}{"\n"}{end}')
log "recycled $n released volumes"
