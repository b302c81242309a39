{{/*
postgrescluster.name is the cluster's name: the release name, which is the PostgresCluster's
name. The CRD limits it to 50 characters, so every name derived from it fits.
*/}}
{{- define "postgrescluster.name" -}}
{{- .Release.Name -}}
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
postgrescluster.labels go on every rendered object (and on the pods and volumes).
*/}}
{{- define "postgrescluster.labels" -}}
{{ include "postgrescluster.selectorLabels" . }}
app.kubernetes.io/instance: {{ include "postgrescluster.name" . | quote }}
app.kubernetes.io/component: database
app.kubernetes.io/managed-by: pgpilot
app.kubernetes.io/part-of: pgpilot
{{- end -}}

{{/*
postgrescluster.serviceAccountName is the pods' ServiceAccount, Role and RoleBinding.
*/}}
{{- define "postgrescluster.serviceAccountName" -}}
{{- include "postgrescluster.name" . }}-instance
{{- end -}}

{{/*
postgrescluster.primaryLease is the Lease the sidecar moves to the primary pod.
*/}}
{{- define "postgrescluster.primaryLease" -}}
{{- include "postgrescluster.name" . }}-primary
{{- end -}}

{{/*
postgrescluster.version is the PostgreSQL major version as a string ("16").
*/}}
{{- define "postgrescluster.version" -}}
{{- required "version is required: the PostgreSQL major version, e.g. \"16\"" .Values.version | toString -}}
{{- end -}}

{{/*
postgrescluster.image is the PostgreSQL image: the first non-empty of .Values.image,
.Values.operator.postgresImages[version] and .Values.operator.defaultPostgresImages[version].
*/}}
{{- define "postgrescluster.image" -}}
{{- $version := include "postgrescluster.version" . -}}
{{- $operator := .Values.operator | default dict -}}
{{- $image := .Values.image | default "" -}}
{{- if not $image -}}
{{- $image = index ($operator.postgresImages | default dict) $version | default "" -}}
{{- end -}}
{{- if not $image -}}
{{- $image = index ($operator.defaultPostgresImages | default dict) $version | default "" -}}
{{- end -}}
{{- if not $image -}}
{{- fail (printf "no PostgreSQL image for version %q: set spec.image, or give the operator RELATED_IMAGE_POSTGRES_%s" $version $version) -}}
{{- end -}}
{{- $image -}}
{{- end -}}

{{/*
postgrescluster.agentImage is the operator's image, which holds the agent the init
container copies into the pod.
*/}}
{{- define "postgrescluster.agentImage" -}}
{{- $operator := .Values.operator | default dict -}}
{{- required "operator.agentImage is required: the operator sets it from RELATED_IMAGE_AGENT" $operator.agentImage -}}
{{- end -}}
