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
{{- toJson $plan -}}
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
