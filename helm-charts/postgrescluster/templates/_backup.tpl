{{/*
postgrescluster.backupPlan is, as JSON, what spec.backup and spec.bootstrap.fromBackup
add to the cluster:
  backup:  config.json's "backup" block (agent.BackupConfig), when spec.backup is set;
  restore: config.json's "restore" block (agent.RestoreConfig), when fromBackup is set;
  mounts:  what the postgres container mounts for them, each one volume: name, mountPath,
           readOnly, and either claimName (a PersistentVolumeClaim) or secretName and
           items (a Secret, its keys renamed to the files the agent reads).
configmap.yaml and statefulset.yaml both render from it, so config.json names exactly the
paths the pod mounts. Secrets are only ever named here, never read.

fromBackup only matters when the cluster is created, but the chart is rendered again on
every reconcile. A restore from fromBackup.backupName is resolved once: a cluster already
deployed with it keeps what it was deployed with (postgrescluster.deployedRestore), so the
PostgresBackup may be deleted or change afterwards. fromBackup.store needs no lookup and
cannot change, so it always renders from the values.
*/}}
{{- define "postgrescluster.backupPlan" -}}
{{- $name := include "postgrescluster.name" . -}}
{{- $plan := dict "mounts" (list) -}}
{{- $backupClaim := "" -}}
{{- with .Values.backup -}}
{{- $store := include "postgrescluster.storePlan" (dict "store" .store "field" "backup.store" "clusterName" $name "role" "backup") | fromJson -}}
{{- $_ := set $plan "backup" (dict "store" $store.config) -}}
{{- $_ = set $plan "mounts" (concat $plan.mounts $store.mounts) -}}
{{- $backupClaim = dig "volume" "claimName" "" (.store | default dict) -}}
{{- end -}}
{{- with (.Values.bootstrap | default dict).fromBackup -}}
{{- $deployed := dict -}}
{{- if .backupName -}}
{{- $deployed = include "postgrescluster.deployedRestore" (dict "name" $name "namespace" $.Release.Namespace) | fromJson -}}
{{- end -}}
{{- if $deployed.restore -}}
{{- $_ := set $plan "restore" $deployed.restore -}}
{{- $_ = set $plan "mounts" (concat $plan.mounts $deployed.mounts) -}}
{{- else -}}
{{- $source := include "postgrescluster.restoreSource" (dict "fromBackup" . "namespace" $.Release.Namespace) | fromJson -}}
{{- /* A restore from the claim the backups go to reads it where the backups mount it. */ -}}
{{- $shared := and $backupClaim (eq $backupClaim (dig "volume" "claimName" "" $source.store)) -}}
{{- $store := include "postgrescluster.storePlan" (dict "store" $source.store "field" $source.field "clusterName" $source.clusterName "role" "restore" "shared" $shared) | fromJson -}}
{{- $restore := dict "store" $store.config -}}
{{- with $source.backupID }}{{ $_ := set $restore "backupID" . }}{{ end -}}
{{- with .targetTime }}{{ $_ := set $restore "targetTime" (toString .) }}{{ end -}}
{{- with .targetLSN }}{{ $_ := set $restore "targetLSN" . }}{{ end -}}
{{- $_ := set $plan "restore" $restore -}}
{{- $_ = set $plan "mounts" (concat $plan.mounts $store.mounts) -}}
{{- end -}}
{{- end -}}
{{- toJson $plan -}}
{{- end -}}

{{/*
postgrescluster.deployedRestore is, as JSON, the restore of a cluster already deployed from
fromBackup.backupName: restore, config.json's "restore" block of the existing ConfigMap
<name>-config, as it is, and mounts, the restore volumes (restore-*) the postgres container
of the existing StatefulSet mounts, in postgrescluster.backupPlan's form. It is empty when
that ConfigMap does not exist or has no restore block: the first render resolves the
PostgresBackup. Its argument is a dict: name (the cluster's) and namespace.

The pod keeps its restore mounts: until its recovery ends, a restarted first primary reads
the source's archive again. A StatefulSet deleted while its ConfigMap stays is rendered
again without them: the restore block still names them, but neither the PostgresBackup's
store nor the Secrets it names are known any more.
*/}}
{{- define "postgrescluster.deployedRestore" -}}
{{- $configMap := lookup "v1" "ConfigMap" .namespace (printf "%s-config" .name) -}}
{{- $config := dig "data" "config.json" "" $configMap -}}
{{- $restore := dict -}}
{{- if $config -}}
{{- $restore = dig "restore" (dict) (fromJson $config) -}}
{{- end -}}
{{- $mounts := list -}}
{{- if $restore -}}
{{- $statefulSet := lookup "apps/v1" "StatefulSet" .namespace .name -}}
{{- $pod := dig "spec" "template" "spec" (dict) $statefulSet -}}
{{- $volumeMounts := dict -}}
{{- range $pod.containers -}}
{{- if eq .name "postgres" -}}
{{- range .volumeMounts }}{{ $_ := set $volumeMounts .name . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range $pod.volumes -}}
{{- $volumeMount := get $volumeMounts .name -}}
{{- if and (hasPrefix "restore-" .name) $volumeMount -}}
{{- $mount := dict "name" .name "mountPath" $volumeMount.mountPath "readOnly" (dig "readOnly" false $volumeMount) -}}
{{- if .persistentVolumeClaim -}}
{{- $_ := set $mount "claimName" .persistentVolumeClaim.claimName -}}
{{- $mounts = append $mounts $mount -}}
{{- else if .secret -}}
{{- $items := list -}}
{{- range .secret.items }}{{ $items = append $items (dict "key" .key "path" .path) }}{{ end -}}
{{- $_ := set $mount "secretName" .secret.secretName -}}
{{- $_ = set $mount "items" $items -}}
{{- $mounts = append $mounts $mount -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "restore" $restore "mounts" $mounts) -}}
{{- end -}}

{{/*
postgrescluster.restoreSource is, as JSON, the store a new cluster restores from (store),
the name of the cluster whose backups it holds (clusterName), the base backup to start
from (backupID, may be empty) and the field that named the store, for error messages
(field). Its argument is a dict: fromBackup (spec.bootstrap.fromBackup) and namespace.

fromBackup.backupName names a PostgresBackup of the namespace, which must be Completed: its
status.store and spec.cluster.name locate the backup. lookup finds nothing under `helm
template` or a client-only dry run, which then fail as if the PostgresBackup did not exist.
*/}}
{{- define "postgrescluster.restoreSource" -}}
{{- $from := .fromBackup -}}
{{- if $from.backupName -}}
{{- $backup := lookup "db.example.com/v1" "PostgresBackup" .namespace $from.backupName -}}
{{- $field := printf "PostgresBackup %q status.store" $from.backupName -}}
{{- if not $backup -}}
{{- fail (printf "bootstrap.fromBackup.backupName: PostgresBackup %q does not exist in namespace %q: name a Completed PostgresBackup of this namespace, or restore with bootstrap.fromBackup.store and clusterName" $from.backupName .namespace) -}}
{{- end -}}
{{- $phase := dig "status" "phase" "" $backup | default "Pending" -}}
{{- if ne $phase "Completed" -}}
{{- fail (printf "bootstrap.fromBackup.backupName: PostgresBackup %q is %s, not Completed: wait for it to complete or name another backup" $from.backupName $phase) -}}
{{- end -}}
{{- $store := dig "status" "store" (dict) $backup -}}
{{- if not $store -}}
{{- fail (printf "bootstrap.fromBackup.backupName: PostgresBackup %q is Completed but has no status.store: name another backup" $from.backupName) -}}
{{- end -}}
{{- $clusterName := dig "spec" "cluster" "name" "" $backup -}}
{{- $backupID := dig "status" "backupID" "" $backup -}}
{{- if and $from.backupID (ne $from.backupID $backupID) -}}
{{- fail (printf "bootstrap.fromBackup.backupID %q is not the backupID %q of PostgresBackup %q: leave backupID out when naming a backup" $from.backupID $backupID $from.backupName) -}}
{{- end -}}
{{- toJson (dict "store" $store "clusterName" $clusterName "backupID" $backupID "field" $field) -}}
{{- else -}}
{{- $store := required "bootstrap.fromBackup needs backupName or store" $from.store -}}
{{- $clusterName := required "bootstrap.fromBackup.store needs clusterName: the name of the cluster whose backups are in the store" $from.clusterName -}}
{{- toJson (dict "store" $store "clusterName" $clusterName "backupID" ($from.backupID | default "") "field" "bootstrap.fromBackup.store") -}}
{{- end -}}
{{- end -}}

{{/*
postgrescluster.storePlan is, as JSON, one backup store inside the pod: config (an
agent.StoreConfig) and mounts (see postgrescluster.backupPlan). Its argument is a dict:
  store:       a BackupStore (api/v1): exactly one of volume or s3, and an optional path;
  field:       where the store was given, for error messages;
  clusterName: the cluster whose directory in the store is used;
  role:        backup or restore, which names the mounts and their paths;
  shared:      the store's volume is already mounted as the backup store (restore only).
*/}}
{{- define "postgrescluster.storePlan" -}}
{{- $store := .store | default dict -}}
{{- $prefix := .clusterName -}}
{{- with $store.path }}{{ $prefix = printf "%s/%s" . $prefix }}{{ end -}}
{{- $config := dict "prefix" $prefix -}}
{{- $mounts := list -}}
{{- if and $store.s3 (not $store.volume) -}}
{{- $s3 := $store.s3 -}}
{{- $credentials := $s3.credentials | default dict -}}
{{- $credentialsDir := printf "/etc/pgpilot/%s-credentials" .role -}}
{{- $s3Config := dict
  "endpoint" (required (printf "%s.s3.endpoint is required" .field) $s3.endpoint)
  "bucket" (required (printf "%s.s3.bucket is required" .field) $s3.bucket)
  "credentialsDir" $credentialsDir
-}}
{{- with $s3.region }}{{ $_ := set $s3Config "region" . }}{{ end -}}
{{- $mounts = append $mounts (dict
  "name" (printf "%s-credentials" .role)
  "mountPath" $credentialsDir
  "secretName" (required (printf "%s.s3.credentials.secretName is required" .field) $credentials.secretName)
  "items" (list
    (dict "key" ($credentials.accessKeyIDKey | default "AWS_ACCESS_KEY_ID") "path" "ACCESS_KEY_ID")
    (dict "key" ($credentials.secretAccessKeyKey | default "AWS_SECRET_ACCESS_KEY") "path" "SECRET_ACCESS_KEY"))
  "readOnly" true) -}}
{{- $tls := $s3.tls | default dict -}}
{{- if $tls.insecureSkipVerify }}{{ $_ := set $s3Config "insecureSkipVerify" true }}{{ end -}}
{{- with $tls.caSecret -}}
{{- $caDir := printf "/etc/pgpilot/%s-ca" $.role -}}
{{- $_ := set $s3Config "caFile" (printf "%s/ca.crt" $caDir) -}}
{{- $mounts = append $mounts (dict
  "name" (printf "%s-ca" $.role)
  "mountPath" $caDir
  "secretName" (required (printf "%s.s3.tls.caSecret.name is required" $.field) .name)
  "items" (list (dict "key" (.key | default "ca.crt") "path" "ca.crt"))
  "readOnly" true) -}}
{{- end -}}
{{- $_ := set $config "s3" $s3Config -}}
{{- else if and $store.volume (not $store.s3) -}}
{{- $claimName := required (printf "%s.volume.claimName is required" .field) $store.volume.claimName -}}
{{- if .shared -}}
{{- $_ := set $config "directory" "/var/lib/pgpilot/backup" -}}
{{- else -}}
{{- $directory := printf "/var/lib/pgpilot/%s" .role -}}
{{- $_ := set $config "directory" $directory -}}
{{- /* Backups write to their store; a restore only reads the source's. */ -}}
{{- $mounts = append $mounts (dict "name" (printf "%s-store" .role) "mountPath" $directory "claimName" $claimName "readOnly" (eq .role "restore")) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "%s needs exactly one of volume or s3" .field) -}}
{{- end -}}
{{- toJson (dict "config" $config "mounts" $mounts) -}}
{{- end -}}
