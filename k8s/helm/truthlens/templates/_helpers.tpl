{{/* Names and labels. */}}
{{- define "truthlens.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "truthlens.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "truthlens.selectorLabels" -}}
app.kubernetes.io/name: {{ include "truthlens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "truthlens.labels" -}}
{{ include "truthlens.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: truthlens
{{- if not .Values.plainManifests }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- end -}}

{{- define "truthlens.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "truthlens.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "truthlens.image" -}}
{{- $variant := ternary "cuda" "cpu" .Values.gpu.enabled -}}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion $variant) .Values.image.truthlens.tag -}}
{{- printf "%s:%s" .Values.image.truthlens.repository $tag -}}
{{- end -}}

{{- define "truthlens.socketDir" -}}
{{- dir .Values.sidecar.socketPath -}}
{{- end -}}

{{/*
The TruthLens config as the sidecar reads it: .Values.config with the listener addresses
the pod needs (kubelet probes and Prometheus reach the pod IP, Envoy reaches localhost/UDS).
*/}}
{{/*
Config keys that may be null but default to something else. Helm deletes a key whose value is
set to null, which would silently bring the default back (e.g. `models.sentinel: null`, "check
every prompt", would load the sentinel); a listed key missing after the merge was nulled by
the user, so it is rendered as null. tests/deploy keeps this list equal to the config schema's.
*/}}
{{- define "truthlens.nullableConfigKeys" -}}
truthlens.rag_context_field truthlens.models.sentinel truthlens.models.detector truthlens.models.explainer truthlens.models.surrogate
{{- end -}}

{{- define "truthlens.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- range $path := splitList " " (include "truthlens.nullableConfigKeys" $) -}}
{{- $parts := splitList "." $path -}}
{{- $node := $cfg -}}
{{- range $p := initial $parts -}}
{{- $next := get $node $p -}}
{{- $node = ternary $next dict (kindIs "map" $next) -}}
{{- end -}}
{{- if not (hasKey $node (last $parts)) -}}
{{- $_ := set $node (last $parts) nil -}}
{{- end -}}
{{- end -}}
{{- /* Envoy in the pod: nothing outside the pod needs the sidecar (probes exec the health check, metrics are
scraped through Envoy's ops listener), so it listens on loopback. Gateway mode: Envoy Gateway's proxies call it. */ -}}
{{- $host := ternary "127.0.0.1" "0.0.0.0" (and .Values.envoy.enabled (not .Values.sidecar.listenOnPodIP)) -}}
{{- $grpc := printf "%s:%d" $host (int .Values.sidecar.grpcPort) -}}
{{- if and (eq .Values.sidecar.transport "uds") (not .Values.envoy.enabled) -}}
{{- fail "sidecar.transport: uds needs envoy.enabled (without Envoy in the pod the sidecar must listen on TCP)" -}}
{{- else if eq .Values.sidecar.transport "uds" -}}
{{- $grpc = printf "unix:%s" .Values.sidecar.socketPath -}}
{{- else if ne .Values.sidecar.transport "tcp" -}}
{{- fail (printf "sidecar.transport: expected tcp or uds, got %q" .Values.sidecar.transport) -}}
{{- end -}}
{{- $server := mergeOverwrite (deepCopy (default dict $cfg.server)) (dict "grpc_address" $grpc "metrics_address" (printf "%s:%d" $host (int .Values.sidecar.metricsPort))) -}}
{{- if .Values.envoy.enabled -}}
{{- /* the sidecar asks Envoy for at most what Envoy allows */ -}}
{{- $_ := set $server "envoy_max_message_timeout_s" (include "truthlens.seconds" .Values.envoy.maxMessageTimeout | float64) -}}
{{- end -}}
{{- if .Values.sidecarTLS.enabled -}}
{{- $_ := required "sidecarTLS.secretName is required when sidecarTLS.enabled" .Values.sidecarTLS.secretName -}}
{{- $tls := dict "enabled" true "cert_file" "/etc/truthlens-tls/tls.crt" "key_file" "/etc/truthlens-tls/tls.key" "client_ca_file" (ternary "/etc/truthlens-tls/ca.crt" nil .Values.sidecarTLS.mutual) -}}
{{- $_ := set $server "tls" $tls -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- if .Values.detectorPool.enabled -}}
{{- if .Values.sidecarTLS.enabled -}}
{{- fail "detectorPool.enabled: not with sidecarTLS.enabled (the pool shares the config, and the sidecars call it over plaintext gRPC)" -}}
{{- end -}}
{{- $tl := default dict $cfg.truthlens -}}
{{- $inference := default dict (get $tl "inference") -}}
{{- if not (get $inference "remote") -}}
{{- $_ := set $inference "remote" (list (include "truthlens.detectorPool.target" .)) -}}
{{- end -}}
{{- $_ := set $tl "inference" $inference -}}
{{- $_ := set $cfg "truthlens" $tl -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Pod spec fragments for the sidecar's health probes. */}}
{{/* kubelet's grpc probe dials the pod IP in plaintext: only for a TCP, non-TLS sidecar on the pod IP. */}}
{{- define "truthlens.loopback" -}}
{{- if and .Values.envoy.enabled (not .Values.sidecar.listenOnPodIP) }}true{{ end -}}
{{- end -}}

{{- define "truthlens.probeAction" -}}
{{- if or (eq .Values.sidecar.transport "uds") .Values.sidecarTLS.enabled (include "truthlens.loopback" .) }}
exec:
  command: [python, /usr/local/bin/truthlens-healthcheck]   # address and TLS from TRUTHLENS_HEALTH_* env
{{- else }}
grpc:
  port: {{ .Values.sidecar.grpcPort }}
{{- end }}
{{- end -}}

{{/* A duration as Envoy writes it (500ms, 60s, 2m, 1h; values.schema.json's pattern) in seconds. */}}
{{- define "truthlens.seconds" -}}
{{- $v := toString . -}}
{{- if hasSuffix "ms" $v -}}{{ divf (trimSuffix "ms" $v | float64) 1000 }}
{{- else if hasSuffix "s" $v -}}{{ trimSuffix "s" $v | float64 }}
{{- else if hasSuffix "m" $v -}}{{ mulf (trimSuffix "m" $v | float64) 60 }}
{{- else if hasSuffix "h" $v -}}{{ mulf (trimSuffix "h" $v | float64) 3600 }}
{{- else -}}{{ fail (printf "expected a duration like 60s, got %q" $v) }}
{{- end -}}
{{- end -}}

{{/* The remote detector pool: its own selector (the sidecar Service, PDB and policy must not pick its pods). */}}
{{- define "truthlens.detectorPool.fullname" -}}
{{- printf "%s-detector" (include "truthlens.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "truthlens.detectorPool.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-detector" (include "truthlens.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: detector-pool
{{- end -}}

{{- define "truthlens.detectorPool.labels" -}}
{{ include "truthlens.detectorPool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: truthlens
{{- if not .Values.plainManifests }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- end -}}

{{/* What the sidecars dial: every pod behind the headless Service (gRPC round robin over the DNS answers). */}}
{{- define "truthlens.detectorPool.target" -}}
{{- printf "dns:///%s.%s.svc.cluster.local:%d" (include "truthlens.detectorPool.fullname" .) .Release.Namespace (int .Values.detectorPool.grpcPort) -}}
{{- end -}}
