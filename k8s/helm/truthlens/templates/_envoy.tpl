{{/*
The Envoy config: the shape of envoy/production.yaml, parameterized. Comments there explain
each trade-off; docs/failure-modes.md the fail-open / fail-closed choice.
*/}}
{{- define "truthlens.envoy.extprocDisabled" -}}
typed_per_filter_config:
  envoy.filters.http.ext_proc:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
    disabled: true
{{- end -}}

{{/*
Every other spelling of a judged path (case, %-escapes, ;params; dot segments and // are resolved by
normalize_path / merge_slashes) holds "completions" or a "%": such paths reach the sidecar, which
judges every spelling of .../chat/completions and lets the rest pass (#19).
*/}}
{{- define "truthlens.envoy.spellings" -}}
"(?i).*(completions|%).*"
{{- end -}}

{{- define "truthlens.envoy.route" -}}
{cluster: upstream_llm, timeout: {{ .Values.envoy.routeTimeout }}, auto_host_rewrite: true}
{{- end -}}

{{- define "truthlens.envoy.hcm" -}}
name: envoy.filters.network.http_connection_manager
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
  stat_prefix: llm_ingress
  codec_type: AUTO
  use_remote_address: true
  # Replies Envoy makes itself (a fail-closed route whose sidecar failed or stalled past message_timeout,
  # no healthy upstream, an upstream timeout) carry an OpenAI-style error body and retry-after: 1, which
  # OpenAI SDKs honour with backoff, instead of an empty 5xx (#19). Answers from the upstream are never
  # touched: local replies only.
  local_reply_config:
    mappers:
    - filter:
        status_code_filter:
          comparison: {op: GE, value: {default_value: 500, runtime_key: truthlens.local_reply_error_status}}
      headers_to_add:
      - header: {key: retry-after, value: "1"}
        append_action: OVERWRITE_IF_EXISTS_OR_ADD
      body_format_override:
        json_format:
          error:
            message: "The gateway could not complete this request (%RESPONSE_CODE_DETAILS%); retry shortly."
            type: truthlens_unavailable
            code: "%RESPONSE_CODE%"
            param: null
  stream_idle_timeout: 300s
  request_timeout: 0s
  common_http_protocol_options:
    idle_timeout: 3600s
    headers_with_underscores_action: REJECT_REQUEST
  normalize_path: true
  merge_slashes: true
  route_config:
    name: llm_routes
    virtual_hosts:
    {{- with .Values.envoy.failClosedDomains }}
    - name: fail_closed
      domains:
      {{- range . }}
      - {{ . | quote }}
      - {{ printf "%s:*" . | quote }}
      {{- end }}
      routes:
      {{- range $i, $path := $.Values.envoy.judgedPaths }}
      - name: {{ printf "fail_closed_judged_%d" $i }}
        match: {path: {{ $path | quote }}}
        route: {{ include "truthlens.envoy.route" $ }}
        request_body_buffer_limit: {{ int64 $.Values.envoy.maxRequestBytes }}
        typed_per_filter_config:
          envoy.filters.http.ext_proc:
            "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
            overrides:
              failure_mode_allow: false
      {{- end }}
      - name: fail_closed_chat_spellings
        match:
          safe_regex: {regex: {{ include "truthlens.envoy.spellings" $ }}}
        route: {{ include "truthlens.envoy.route" $ }}
        request_body_buffer_limit: {{ int64 $.Values.envoy.maxRequestBytes }}
        typed_per_filter_config:
          envoy.filters.http.ext_proc:
            "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
            overrides:
              failure_mode_allow: false
      - name: fail_closed_not_judged
        match: {prefix: /}
        route: {{ include "truthlens.envoy.route" $ }}
        {{- include "truthlens.envoy.extprocDisabled" $ | nindent 8 }}
    {{- end }}
    - name: llm
      domains: ["*"]
      routes:
      {{- range $i, $path := .Values.envoy.judgedPaths }}
      {{- if $.Values.envoy.sseStreamedRoute }}
      - name: {{ printf "judged_sse_%d" $i }}
        match:
          path: {{ $path | quote }}
          headers:
          - name: accept
            string_match: {contains: text/event-stream}
        route: {{ include "truthlens.envoy.route" $ }}
        request_body_buffer_limit: {{ int64 $.Values.envoy.maxRequestBytes }}
        typed_per_filter_config:
          envoy.filters.http.ext_proc:
            "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
            overrides:
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: BUFFERED
                response_body_mode: STREAMED
                request_trailer_mode: SKIP
                response_trailer_mode: SKIP
      {{- end }}
      - name: {{ printf "judged_%d" $i }}
        match: {path: {{ $path | quote }}}
        route: {{ include "truthlens.envoy.route" $ }}
        request_body_buffer_limit: {{ int64 $.Values.envoy.maxRequestBytes }}
      {{- end }}
      - name: chat_spellings
        match:
          safe_regex: {regex: {{ include "truthlens.envoy.spellings" . }}}
        route: {{ include "truthlens.envoy.route" . }}
        request_body_buffer_limit: {{ int64 .Values.envoy.maxRequestBytes }}
      - name: not_judged
        match: {prefix: /}
        route: {{ include "truthlens.envoy.route" . }}
        {{- include "truthlens.envoy.extprocDisabled" . | nindent 8 }}
  http_filters:
  - name: envoy.filters.http.ext_proc
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
      grpc_service:
        envoy_grpc: {cluster_name: truthlens_extproc}
        timeout: {{ .Values.envoy.grpcTimeout }}
      failure_mode_allow: {{ .Values.envoy.failureModeAllow }}
      status_on_error: {code: {{ .Values.envoy.statusOnError }}}
      message_timeout: {{ .Values.envoy.messageTimeout }}
      max_message_timeout: {{ .Values.envoy.maxMessageTimeout }}
      allow_mode_override: true
      request_attributes: {{ toJson .Values.envoy.requestAttributes }}
      processing_mode:
        request_header_mode: SEND
        response_header_mode: SEND
        request_body_mode: BUFFERED
        response_body_mode: BUFFERED
        request_trailer_mode: SKIP
        response_trailer_mode: SKIP
      mutation_rules:
        disallow_system: true
  - name: envoy.filters.http.header_mutation
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
      mutations:
        response_mutations:
        - remove_on_match: {key_matcher: {prefix: x-truthlens-}}
  - name: envoy.filters.http.router
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{{- end -}}

{{- define "truthlens.envoyConfig" -}}
{{- if .Values.envoy.configOverride -}}
{{ .Values.envoy.configOverride }}
{{- else -}}
{{- $up := .Values.envoy.upstream -}}
# Generated by the truthlens Helm chart (templates/_envoy.tpl); shape of envoy/production.yaml.
admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: {{ .Values.envoy.adminPort }}}
static_resources:
  listeners:
  {{- if .Values.tls.enabled }}
  - name: ingress_https
    address:
      socket_address: {address: 0.0.0.0, port_value: {{ .Values.envoy.ports.https }}}
    per_connection_buffer_limit_bytes: {{ int64 .Values.envoy.maxRequestBytes }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            alpn_protocols: [h2, http/1.1]
            tls_params:
              tls_minimum_protocol_version: TLSv1_2
            tls_certificates:
            - certificate_chain: {filename: /etc/envoy/tls/tls.crt}
              private_key: {filename: /etc/envoy/tls/tls.key}
      filters:
      - {{ include "truthlens.envoy.hcm" . | indent 8 | trim }}
  {{- end }}
  - name: ingress_http
    address:
      socket_address: {address: 0.0.0.0, port_value: {{ .Values.envoy.ports.http }}}
    per_connection_buffer_limit_bytes: {{ int64 .Values.envoy.maxRequestBytes }}
    filter_chains:
    - filters:
      - {{ include "truthlens.envoy.hcm" . | indent 8 | trim }}
  - name: ops
    address:
      socket_address: {address: 0.0.0.0, port_value: {{ .Values.envoy.ports.ops }}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ops
          route_config:
            name: ops
            virtual_hosts:
            - name: ops
              domains: ["*"]
              routes:
              - match: {path: /ready}
                route: {cluster: envoy_admin}
              - match: {path: /stats/prometheus}
                route: {cluster: envoy_admin}
              {{- if include "truthlens.loopback" . }}
              - match: {path: /metrics}             # the sidecar's, which listens on loopback only
                route: {cluster: truthlens_metrics}
              {{- end }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  {{- if include "truthlens.loopback" . }}
  - name: truthlens_metrics
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: truthlens_metrics
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{ .Values.sidecar.metricsPort }}}
  {{- end }}
  - name: truthlens_extproc
    type: STATIC
    connect_timeout: 1s
    per_connection_buffer_limit_bytes: {{ int64 .Values.envoy.maxRequestBytes }}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            max_concurrent_streams: 1024
            connection_keepalive: {interval: 30s, timeout: 5s}
    {{- if .Values.sidecarTLS.enabled }}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {{ .Values.sidecarTLS.serverName | quote }}
        common_tls_context:
          alpn_protocols: [h2]
          {{- if .Values.sidecarTLS.mutual }}
          tls_certificates:
          - certificate_chain: {filename: /etc/truthlens-tls/tls.crt}
            private_key: {filename: /etc/truthlens-tls/tls.key}
          {{- end }}
          validation_context:
            trusted_ca: {filename: /etc/truthlens-tls/ca.crt}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: {{ .Values.sidecarTLS.serverName | quote }}}
    {{- end }}
    circuit_breakers:
      thresholds:
      - max_requests: 4096
        max_pending_requests: 1024
    load_assignment:
      cluster_name: truthlens_extproc
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              {{- if eq .Values.sidecar.transport "uds" }}
              pipe: {path: {{ .Values.sidecar.socketPath | quote }}}
              {{- else }}
              socket_address: {address: 127.0.0.1, port_value: {{ .Values.sidecar.grpcPort }}}
              {{- end }}
  - name: upstream_llm
    type: {{ regexMatch "^[0-9.]+$" $up.host | ternary "STATIC" "STRICT_DNS" }}
    dns_lookup_family: V4_PREFERRED
    connect_timeout: 5s
    per_connection_buffer_limit_bytes: {{ int64 .Values.envoy.maxRequestBytes }}
    load_assignment:
      cluster_name: upstream_llm
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: {{ $up.host | quote }}, port_value: {{ $up.port }}}
    {{- if $up.tls }}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {{ default $up.host $up.sni | quote }}
        common_tls_context:
          validation_context:
            trusted_ca: {filename: {{ $up.caFile | quote }}}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: {{ default $up.host $up.sni | quote }}}
    {{- end }}
  - name: envoy_admin
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: envoy_admin
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{ .Values.envoy.adminPort }}}
{{- end -}}
{{- end -}}
