{{/*
Names, labels and shared pieces. Per-service objects are in _service.tpl.
*/}}

{{/* The chart name, possibly overridden. */}}
{{- define "brainstorm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: <release>-<chart>, or the release name when it already holds
the chart name. Kept to 39 characters so that "<fullname>-<longest service name>" (24 more)
stays within the 63 characters of a DNS label.
*/}}
{{- define "brainstorm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 39 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 39 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 39 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "brainstorm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the release's pods (add app.kubernetes.io/component per service). */}}
{{- define "brainstorm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "brainstorm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "brainstorm.labels" -}}
helm.sh/chart: {{ include "brainstorm.chart" . }}
{{ include "brainstorm.selectorLabels" . }}
app.kubernetes.io/version: {{ include "brainstorm.imageTag" . | trunc 63 | quote }}
app.kubernetes.io/part-of: brainstorm
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "brainstorm.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "brainstorm.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "brainstorm.imageTag" .) }}
{{- end }}
{{- end }}

{{- define "brainstorm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "brainstorm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the services read: the existing one, or the one the chart creates. */}}
{{- define "brainstorm.secretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else }}
{{- printf "%s-secrets" (include "brainstorm.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The Secret the migrate hook reads. A pre-install hook runs before the release's ordinary
objects exist, so when the chart makes the Secret the hook gets its own copy of the database
URL (a hook object, removed once the migrations succeed).
*/}}
{{- define "brainstorm.migrateSecretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else }}
{{- printf "%s-migrate" (include "brainstorm.fullname" .) }}
{{- end }}
{{- end }}

{{/* Environment variable names of the secret settings, by their key in secrets.keys. */}}
{{- define "brainstorm.secretEnvNames" -}}
databaseUrl: BR_DATABASE_URL
redisUrl: BR_REDIS_URL
platformAdminKey: BR_PLATFORM_ADMIN_KEY
masterKey: BR_MASTER_KEY
{{- end }}

{{/* Settings shared by every process (services and the migrate Job). */}}
{{- define "brainstorm.commonEnv" -}}
- name: BR_LOG_FORMAT
  value: {{ .Values.config.logFormat | quote }}
{{- if hasKey .Values.config "writeLingerMs" }}
- name: BR_WRITE_LINGER_MS
  value: {{ .Values.config.writeLingerMs | quote }}
{{- end }}
{{- with .Values.config.otelExporterOtlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The database URL, read from the given Secret. Argument: (list $root $secretName). */}}
{{- define "brainstorm.databaseUrlEnv" -}}
{{- $root := index . 0 -}}
- name: BR_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ index . 1 }}
      key: {{ $root.Values.secrets.keys.databaseUrl }}
{{- end }}

{{/* The security context of every container. */}}
{{- define "brainstorm.containerSecurityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}
