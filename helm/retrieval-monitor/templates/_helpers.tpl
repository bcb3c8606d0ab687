{{/* Names, labels and the pieces every pod of the release shares. */}}

{{- define "rm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name; every object name starts with it (63 characters at most). */}}
{{- define "rm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's object name, e.g. rm.componentName (dict "root" . "component" "api"). */}}
{{- define "rm.componentName" -}}
{{- $base := include "rm.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-" }}
{{- printf "%s-%s" $base .component }}
{{- end }}

{{- define "rm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rm.labels" -}}
helm.sh/chart: {{ include "rm.chart" . }}
{{ include "rm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: retrieval-monitor
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component: (dict "root" . "component" "worker"). */}}
{{- define "rm.componentLabels" -}}
{{ include "rm.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "rm.componentSelectorLabels" -}}
{{ include "rm.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "rm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rm.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The Secret holding the connection URLs and the judge's key: the chart's own or an existing one. */}}
{{- define "rm.secretName" -}}
{{- default (include "rm.fullname" .) .Values.existingSecret.name }}
{{- end }}

{{- define "rm.secretKeys" -}}
{{- if .Values.existingSecret.name -}}
{{- toYaml .Values.existingSecret.keys }}
{{- else -}}
databaseUrl: RM_DATABASE_URL
redisUrl: RM_REDIS_URL
judgeApiKey: RM_JUDGE_API_KEY
brokerUrl: {{ if .Values.externalBroker.url }}RM_BROKER_URL{{ else }}""{{ end }}
{{- end }}
{{- end }}

{{/* Fail early, at render time, when the release could not reach its database or Redis. */}}
{{- define "rm.validate" -}}
{{- if not (or .Values.existingSecret.name .Values.postgresql.enabled .Values.externalDatabase.url) }}
{{- fail "retrieval-monitor needs a database: set externalDatabase.url, existingSecret.name or postgresql.enabled" }}
{{- end }}
{{- if not (or .Values.existingSecret.name .Values.redis.enabled .Values.externalRedis.url) }}
{{- fail "retrieval-monitor needs Redis: set externalRedis.url, existingSecret.name or redis.enabled" }}
{{- end }}
{{- if and .Values.worker.autoscaling.enabled .Values.worker.keda.enabled }}
{{- fail "worker.autoscaling and worker.keda both scale the workers: enable one of them" }}
{{- end }}
{{- end }}

{{/*
Environment variables of the connection settings.
With the companion releases the URLs are assembled in the pod from the passwords they generate
(Kubernetes expands $(VAR) from variables defined before it).
Call with (dict "root" . "database" true "redis" true "judgeKey" false).
*/}}
{{- define "rm.connectionEnv" -}}
{{- $root := .root }}
{{- $keys := include "rm.secretKeys" $root | fromYaml }}
{{- $secret := include "rm.secretName" $root }}
{{- if .database }}
{{- if and $root.Values.postgresql.enabled (not $root.Values.existingSecret.name) }}
{{- $pg := $root.Values.postgresql }}
- name: RM_POSTGRES_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $pg.auth.existingSecret | default (printf "%s-postgresql" $root.Release.Name) }}
      key: password
- name: RM_DATABASE_URL
  value: {{ printf "postgresql+psycopg://%s:$(RM_POSTGRES_PASSWORD)@%s-postgresql:5432/%s" $pg.auth.username $root.Release.Name $pg.auth.database | quote }}
{{- else }}
- name: RM_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.databaseUrl }}
{{- end }}
{{- end }}
{{- if .redis }}
{{- if and $root.Values.redis.enabled (not $root.Values.existingSecret.name) }}
{{- if $root.Values.redis.auth.enabled }}
- name: RM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.redis.auth.existingSecret | default (printf "%s-redis" $root.Release.Name) }}
      key: redis-password
- name: RM_REDIS_URL
  value: {{ printf "redis://:$(RM_REDIS_PASSWORD)@%s-redis-master:6379/0" $root.Release.Name | quote }}
{{- else }}
- name: RM_REDIS_URL
  value: {{ printf "redis://%s-redis-master:6379/0" $root.Release.Name | quote }}
{{- end }}
{{- else }}
- name: RM_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.redisUrl }}
{{- end }}
{{- if $keys.brokerUrl }}
- name: RM_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.brokerUrl }}
{{- end }}
{{- end }}
{{- if .judgeKey }}
- name: RM_JUDGE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.judgeApiKey }}
      # The local judge needs no key, so the Secret may lack it.
      optional: true
{{- end }}
{{- end }}

{{/* Annotations that roll the pods when their settings change. */}}
{{- define "rm.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/* The writable folders of a read-only container: the data folder and /tmp. */}}
{{- define "rm.volumes" -}}
- name: data
  emptyDir:
    sizeLimit: {{ .Values.dataVolume.sizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpVolume.sizeLimit }}
{{- end }}

{{- define "rm.volumeMounts" -}}
- name: data
  mountPath: /var/lib/retrieval-monitor
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* Pod-level fields every workload shares: (dict "root" . "values" .Values.worker). */}}
{{- define "rm.podCommon" -}}
{{- $root := .root }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
