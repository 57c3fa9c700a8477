{{- define "inferasim-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "inferasim-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "inferasim-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inferasim-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "inferasim-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "inferasim-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* engineImages as VENDOR/ENGINE=IMAGE,... (INFERASIM_ENGINE_IMAGES); empty images are left out. */}}
{{- define "inferasim-operator.engineImages" -}}
{{- $out := list -}}
{{- range $vendor, $engines := .Values.engineImages -}}
{{- range $engine, $image := $engines -}}
{{- if $image -}}
{{- $out = append $out (printf "%s/%s=%s" $vendor $engine $image) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The namespaces watched (and given a Role): watchNamespaces, else the release's namespace. */}}
{{- define "inferasim-operator.watchNamespaces" -}}
{{- join "," (.Values.watchNamespaces | default (list .Release.Namespace) | uniq) -}}
{{- end -}}
