{{/* Chart name (app.kubernetes.io/name). */}}
{{- define "skill-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Name prefix of every object. It always contains the release name (unless
fullnameOverride), so two releases never collide on cluster-scoped objects.
Truncated to 45 so that "-controller-metrics" (19) still fits 63.
*/}}
{{- define "skill-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "skill-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "skill-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: skill-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Selector labels of one component: call with (dict "ctx" $ "component" "controller").
The artifacts selector is also what the controller puts in every run's
NetworkPolicy (--operator-pod-label), so it must stay exactly these labels.
*/}}
{{- define "skill-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skill-operator.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects. */}}
{{- define "skill-operator.componentLabels" -}}
{{ include "skill-operator.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image reference: repository@digest when a digest is set, else repository:tag. */}}
{{- define "skill-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The token-key Secret's name and key. */}}
{{- define "skill-operator.tokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "skill-operator.fullname" .)) .Values.tokenKey.existingSecret -}}
{{- end -}}
{{- define "skill-operator.tokenKeyKey" -}}
{{- if .Values.tokenKey.existingSecret -}}{{ .Values.tokenKey.existingSecretKey }}{{- else -}}token-key{{- end -}}
{{- end -}}

{{/* The artifacts Service name. */}}
{{- define "skill-operator.artifactsService" -}}
{{- printf "%s-artifacts" (include "skill-operator.fullname" .) -}}
{{- end -}}

{{/* The artifact endpoint URL handed to run pods. */}}
{{- define "skill-operator.artifactEndpoint" -}}
{{- if .Values.controller.artifactEndpoint -}}
{{- .Values.controller.artifactEndpoint -}}
{{- else if .Values.artifacts.service.clusterIP -}}
{{- printf "http://%s:8443" .Values.artifacts.service.clusterIP -}}
{{- else -}}
{{- printf "http://%s.%s.svc:8443" (include "skill-operator.artifactsService" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
Pod and container security context: Pod Security "restricted" plus a
read-only root filesystem, on every container.
*/}}
{{- define "skill-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "skill-operator.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* requests == limits from {cpu, memory, ephemeralStorage}. */}}
{{- define "skill-operator.resources" -}}
{{- $r := dict "cpu" .cpu "memory" .memory "ephemeral-storage" .ephemeralStorage -}}
requests:
{{ toYaml $r | indent 2 }}
limits:
{{ toYaml $r | indent 2 }}
{{- end -}}

{{/* Scheduling fields of one component's values. */}}
{{- define "skill-operator.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{/* The registry is required: fail closed with an actionable message. */}}
{{- define "skill-operator.registry" -}}
{{- required "artifacts.registry is required: the OCI repository (host/repo) where job inputs and outputs are stored, e.g. --set artifacts.registry=registry.example.com/skill-operator/artifacts" .Values.artifacts.registry -}}
{{- end -}}

{{/* The egress proxy Service name, and the address run pods get (HOST:PORT). */}}
{{- define "skill-operator.egressProxyService" -}}
{{- printf "%s-egress-proxy" (include "skill-operator.fullname" .) -}}
{{- end -}}
{{- define "skill-operator.egressProxyAddress" -}}
{{- if .Values.egressProxy.service.clusterIP -}}
{{- printf "%s:3128" .Values.egressProxy.service.clusterIP -}}
{{- else -}}
{{- printf "%s.%s.svc:3128" (include "skill-operator.egressProxyService" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}
