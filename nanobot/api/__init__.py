"""The OpenAI-compatible API on the gateway (``gateway.api``): keys, the HTTP server, and the
channel that carries its turns through the dispatcher like any chat's."""
