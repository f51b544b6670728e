"""The TruthLens detection API (proto/truthlens/v1): a gRPC service any app can call without Envoy.

`extproc.api.v1` holds the code generated from proto/ (committed; proto/generate.py rebuilds it),
`extproc.api.convert` maps it to and from the inference layer's types, `extproc.api.server`
serves a local engine over it (`truthlens serve --detector-api`). The client side, the
sidecar's remote detector pool, is `extproc.api.client.RemoteEngine`.
"""
