{{/*
The chart renders; it does not decide. What a template cannot know or should not choose
(object names, the image, config.json, the backup and restore volumes, the claim template
an existing StatefulSet keeps) is .Values.plan, made by the operator in Go before each
render (internal/operator/plan, through helm-operator-plugins' value translator).

postgrescluster.name is the cluster's name: the PostgresCluster's, which is the release's.
The CRD limits it to 50 characters, so every name derived from it fits. Every template
includes it, so a render without a plan fails here, saying why.
*/}}
{{- define "postgrescluster.name" -}}
{{- (required "values.plan is missing: the pgpilot operator makes it (internal/operator/plan); render the chart through the operator or internal/tools/chart, not with helm alone" .Values.plan).names.cluster -}}
{{- end -}}

{{/*
postgrescluster.selectorLabels select the cluster's instance pods. They are the
StatefulSet's selector, which is immutable: never add a label here.
*/}}
{{- define "postgrescluster.selectorLabels" -}}
db.example.com/cluster: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/name: postgresql
{{- end -}}

{{/*
postgrescluster.labels go on the pods and volumes.
*/}}
{{- define "postgrescluster.labels" -}}
{{ include "postgrescluster.selectorLabels" . }}
app.kubernetes.io/instance: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/component: database
app.kubernetes.io/managed-by: pgpilot
app.kubernetes.io/part-of: pgpilot
{{- end -}}

{{/*
postgrescluster.objectLabels go on every rendered object: the pods' labels, but
managed-by is what Helm itself sets on every object it installs or upgrades
(app.kubernetes.io/managed-by: Helm, whatever the manifest says). With "pgpilot" here
the live objects and the release disagreed after each install and upgrade, and the
operator's read-back patched every object of the release back, each patch an event
that queued the cluster again.
*/}}
{{- define "postgrescluster.objectLabels" -}}
{{ include "postgrescluster.selectorLabels" . }}
app.kubernetes.io/instance: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/component: database
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pgpilot
{{- end -}}

{{/*
postgrescluster.poolerSelectorLabels select one pool's PgBouncer pods (spec.pooler); the
argument is (list $ "rw") or (list $ "ro"). They carry no db.example.com/cluster label:
that label makes a pod one of the cluster's instances to the operator.
*/}}
{{- define "postgrescluster.poolerSelectorLabels" -}}
{{- $root := index . 0 -}}
db.example.com/pooler: {{ include "postgrescluster.name" $root | quote }}
db.example.com/pool: {{ index . 1 | quote }}
app.kubernetes.io/name: pgbouncer
{{- end -}}

{{/*
postgrescluster.poolerLabels go on the pooler pods.
*/}}
{{- define "postgrescluster.poolerLabels" -}}
{{ include "postgrescluster.poolerSelectorLabels" . }}
app.kubernetes.io/instance: {{ include "postgrescluster.name" (index . 0) | quote }}
app.kubernetes.io/component: pooler
app.kubernetes.io/managed-by: pgpilot
app.kubernetes.io/part-of: pgpilot
{{- end -}}

{{/*
postgrescluster.poolerObjectLabels go on the pooler's objects: the cluster's label, by
which the operator watches what it renders, with the pooler's component.
*/}}
{{- define "postgrescluster.poolerObjectLabels" -}}
db.example.com/cluster: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/name: pgbouncer
app.kubernetes.io/instance: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/component: pooler
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pgpilot
{{- end -}}
