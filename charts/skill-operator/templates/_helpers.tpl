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

{{/*
Where the artifact endpoint keeps packages and job files: "registry" (an
external one, artifacts.registry) or "store" (the built-in store on the
endpoint's own volume).
*/}}
{{- define "skill-operator.storage" -}}
{{- if .Values.artifacts.registry -}}registry{{- else -}}store{{- end -}}
{{- end -}}

{{/* The built-in store's claim name. */}}
{{- define "skill-operator.storeClaim" -}}
{{- printf "%s-artifacts-store" (include "skill-operator.fullname" .) -}}
{{- end -}}

{{/*
The built-in store's volume: "pvc" or "emptyDir" (artifacts.persistence.enabled).
auto: the claim when it exists already (an upgrade keeps its data), when a
StorageClass is named, when the cluster has a default StorageClass, or when
no cluster can be asked (`helm template`, --dry-run=client: GitOps renders get
the claim, which stays Pending visibly rather than losing data silently);
an emptyDir only on a cluster that was asked and has no default StorageClass.
*/}}
{{- define "skill-operator.storeVolume" -}}
{{- $p := .Values.artifacts.persistence -}}
{{- $mode := toString $p.enabled -}}
{{- if eq $mode "true" -}}pvc
{{- else if eq $mode "false" -}}emptyDir
{{- else if lookup "v1" "PersistentVolumeClaim" .Release.Namespace (include "skill-operator.storeClaim" .) -}}pvc
{{- else if $p.storageClassName -}}pvc
{{- else if not (lookup "v1" "Namespace" "" "kube-system") -}}pvc
{{- else -}}
{{- $default := false -}}
{{- range (lookup "storage.k8s.io/v1" "StorageClass" "" "").items -}}
{{- $a := .metadata.annotations | default dict -}}
{{- if or (eq (index $a "storageclass.kubernetes.io/is-default-class" | default "") "true") (eq (index $a "storageclass.beta.kubernetes.io/is-default-class" | default "") "true") -}}
{{- $default = true -}}
{{- end -}}
{{- end -}}
{{- if $default -}}pvc{{- else -}}emptyDir{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The registry host run pods never see but the controller and gateway pull
sample packages from: the built-in store, named exactly as the artifact
endpoint URL names its host and port (so the operator maps it to its
credential, and no DNS is needed when the ClusterIP is pinned).
*/}}
{{- define "skill-operator.storeRegistry" -}}
{{- $url := include "skill-operator.artifactEndpoint" . | trimSuffix "/" -}}
{{- $rest := regexReplaceAll "^[a-z]+://" $url "" -}}
{{- $hostport := regexReplaceAll "/.*$" $rest "" -}}
{{- if contains ":" $hostport -}}{{ $hostport }}{{- else if hasPrefix "https://" $url -}}{{ $hostport }}:443{{- else -}}{{ $hostport }}:80{{- end -}}
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

{{/* Whether the sample SkillPackages are made: samples.enabled with the built-in store. */}}
{{- define "skill-operator.samplesOn" -}}
{{- and .Values.samples.enabled (eq (include "skill-operator.storage" .) "store") -}}
{{- end -}}

{{/* The sample SkillPackages as a JSON list (see templates/samples.yaml). */}}
{{- define "skill-operator.samplePackages" -}}
{{- $registry := include "skill-operator.storeRegistry" . -}}
{{- $insecure := hasPrefix "http://" (include "skill-operator.artifactEndpoint" .) -}}
{{- $s := .Values.samples -}}
{{- $defs := list
  (dict "name" "csv-stats" "interpreter" "python" "scripts" (list "scripts/stats.py"))
  (dict "name" "json-pretty" "interpreter" "node" "scripts" (list "scripts/pretty.js"))
  (dict "name" "word-count" "interpreter" "bash" "scripts" (list "scripts/wc.sh"))
  (dict "name" "weather-brief" "interpreter" "node" "scripts" (list "scripts/forecast.js"))
  (dict "name" "release-notes") -}}
{{- $out := list -}}
{{- range $defs -}}
{{- $oci := dict "reference" (printf "%s/samples/%s:latest" $registry .name) -}}
{{- if $insecure -}}{{- $_ := set $oci "insecure" true -}}{{- end -}}
{{- $spec := dict "source" (dict "oci" $oci) -}}
{{- if .interpreter -}}
{{- $runtime := dict "interpreter" .interpreter "image" (index $s.images .interpreter) "allowedScripts" .scripts "timeoutSeconds" 60 -}}
{{- with index ($s.interpreterPaths | default dict) .interpreter -}}{{- $_ := set $runtime "interpreterPath" . -}}{{- end -}}
{{- with $s.resources -}}{{- $_ := set $runtime "resources" . -}}{{- end -}}
{{- $_ := set $spec "runtime" $runtime -}}
{{- end -}}
{{- $labels := dict "app.kubernetes.io/name" (include "skill-operator.name" $) "app.kubernetes.io/instance" $.Release.Name "app.kubernetes.io/part-of" "skill-operator" "skill-operator.dev/sample" .name -}}
{{- $meta := dict "name" (printf "%s-%s" $.Release.Name .name | trunc 63 | trimSuffix "-") "labels" $labels -}}
{{- $out = append $out (dict "apiVersion" "skill-operator.dev/v1alpha1" "kind" "SkillPackage" "metadata" $meta "spec" $spec) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The sample SkillPackages' names, for the artifacts RBAC. */}}
{{- define "skill-operator.samplePackageNames" -}}
{{- $names := list -}}
{{- range (include "skill-operator.samplePackages" . | fromJsonArray) -}}
{{- $names = append $names .metadata.name -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* OpenTelemetry's environment for a component that exports traces (empty without tracing.otlpEndpoint). */}}
{{- define "skill-operator.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
{{- if .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
RBAC rules a component's /metrics guard needs (--metrics-auth kubernetes):
who a scraper's token is, and whether it may get /metrics.
*/}}
{{- define "skill-operator.metricsReviewRules" -}}
{{- if eq .Values.metrics.auth "kubernetes" }}
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}
{{- end }}
