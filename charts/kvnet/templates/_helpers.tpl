{{/* Chart name, overridable. */}}
{{- define "kvnet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-kvnet, or the release name when it already says kvnet. */}}
{{- define "kvnet.fullname" -}}
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

{{/* Labels every object carries. */}}
{{- define "kvnet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvnet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select kvnet's pods; never change them on upgrade. */}}
{{- define "kvnet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvnet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvnet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvnet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Secret with the serving certificate, in both cert modes. */}}
{{- define "kvnet.certSecret" -}}
{{- default (printf "%s-webhook-cert" (include "kvnet.fullname" .)) .Values.certs.secretName }}
{{- end }}

{{/* Namespaces the webhooks never select: the config's and the release's own. */}}
{{- define "kvnet.excludedNamespaces" -}}
{{- $ns := list }}
{{- range (default (list "kube-system") .Values.config.excludedNamespaces) }}
{{- $ns = append $ns . }}
{{- end }}
{{- $ns = append $ns .Release.Namespace }}
{{- toJson ($ns | uniq) }}
{{- end }}
