{{- define "orchard.labels" -}}
app.kubernetes.io/name: orchard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: orchard
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "orchard.selector" -}}
app.kubernetes.io/name: orchard
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "orchard.serviceImage" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}

{{/* The token key shared by the scheduler (signs) and the sandbox pods (verify).
     Reused across upgrades when it exists; a fresh random key otherwise. */}}
{{- define "orchard.tokenKey" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace "orchard-executor-token" -}}
{{- if and $existing (index $existing "data") -}}
{{ index $existing.data "token.key" }}
{{- else -}}
{{ randAlphaNum 48 | b64enc }}
{{- end -}}
{{- end }}

{{- define "orchard.tokenSecretName" -}}
{{ .Values.tokenKey.existingSecret | default "orchard-executor-token" }}
{{- end }}

{{- define "orchard.tenantsSecretName" -}}
{{ .Values.tenantsExistingSecret | default "orchard-tenants" }}
{{- end }}
