"""The gateway: one processor per ext_proc stream (one chat request), the stream loop that drives it,
and the runtime it is built from (config, policy, engine, mitigation)."""
