{{/* The gateway's Service name. */}}
{{- define "skill-operator.gatewayService" -}}
{{- printf "%s-gateway" (include "skill-operator.fullname" .) -}}
{{- end -}}

{{/* The in-cluster base URL of the gateway (the endpoints are <base>/mcp/<namespace>). */}}
{{- define "skill-operator.gatewayURL" -}}
{{- printf "http://%s.%s.svc:8090" (include "skill-operator.gatewayService" .) .Release.Namespace -}}
{{- end -}}

{{/*
Host headers the gateway accepts (--allowed-host): every in-cluster name of
its Service, then gateway.allowedHosts (an Ingress or LoadBalancer name).
*/}}
{{- define "skill-operator.gatewayHosts" -}}
{{- $svc := include "skill-operator.gatewayService" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- concat $hosts .Values.gateway.allowedHosts | uniq | toJson -}}
{{- end -}}

{{/*
--cache-max-bytes: gateway.cache.maxBytes, or three quarters of the cache
volume (a package being unpacked needs room next to the kept ones). It may not
exceed the volume: the kubelet evicts a pod whose emptyDir passes its sizeLimit.
*/}}
{{- define "skill-operator.gatewayCacheMaxBytes" -}}
{{- $c := .Values.gateway.cache -}}
{{- $volume := mul ($c.sizeMiB | int64) 1048576 -}}
{{- $max := mul ($c.sizeMiB | int64) 786432 -}}
{{- if not (kindIs "invalid" $c.maxBytes) -}}
{{- $max = $c.maxBytes | int64 -}}
{{- end -}}
{{- if gt $max $volume -}}
{{- fail (printf "gateway.cache.maxBytes (%d) exceeds the cache volume gateway.cache.sizeMiB (%d MiB = %d bytes): the kubelet would evict the pod; lower maxBytes or raise sizeMiB (and gateway.resources.ephemeralStorage)" $max ($c.sizeMiB | int64) $volume) -}}
{{- end -}}
{{- $max -}}
{{- end -}}

{{/*
The API server peer of the gateway's NetworkPolicy, as JSON {cidrs, port}:
gateway.networkPolicy.apiServer.cidrs when set, else the addresses and port
of the `kubernetes` Service's EndpointSlice, looked up at install/upgrade
(`helm template` cannot look it up: then cidrs is empty and NOTES.txt warns).
*/}}
{{- define "skill-operator.gatewayApiServer" -}}
{{- $api := .Values.gateway.networkPolicy.apiServer -}}
{{- $cidrs := $api.cidrs -}}
{{- $port := $api.port -}}
{{- if not $cidrs -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if $slice -}}
{{- range $slice.endpoints -}}
{{- range .addresses -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- end -}}
{{- range $slice.ports -}}
{{- if eq (default "" .name) "https" -}}{{- $port = .port -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "cidrs" $cidrs "port" ($port | int64) | toJson -}}
{{- end -}}
