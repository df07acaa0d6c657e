{{- define "seckill.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "seckill.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The pods of one role: call with (dict "root" $ "role" "api"). */}}
{{- define "seckill.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "seckill.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "seckill.secretName" -}}
{{ .Values.secrets.existingSecret | default (include "seckill.fullname" .) }}
{{- end -}}

{{/* One environment variable from the shared Secret. */}}
{{- define "seckill.secretEnv" -}}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "seckill.secretName" .root }}
      key: {{ .key }}
{{- end -}}

{{/* Kafka SASL is on (sasl_plaintext or sasl_ssl). */}}
{{- define "seckill.kafkaSasl" -}}
{{- if hasPrefix "sasl_" .Values.stores.kafka.securityProtocol }}true{{ end -}}
{{- end -}}

{{/* The stores' TLS Secret, mounted (a volumeMounts item and a volumes item). */}}
{{- define "seckill.tlsMount" -}}
- name: store-tls
  mountPath: /etc/seckill/tls
  readOnly: true
{{- end -}}
{{- define "seckill.tlsVolume" -}}
- name: store-tls
  secret:
    secretName: {{ .Values.tls.secret }}
{{- end -}}

{{- define "seckill.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "seckill.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{/* The pods' identity, with no API token mounted (seckill calls no Kubernetes API). */}}
{{- define "seckill.podIdentity" -}}
serviceAccountName: {{ include "seckill.serviceAccountName" . }}
automountServiceAccountToken: false
{{- end -}}
