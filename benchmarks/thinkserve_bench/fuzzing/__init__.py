"""Generated hostile input for a live deployment: gRPC messages from the .proto's descriptors, HTTP requests from
the service's OpenAPI description (Schemathesis), and hostile files. Used by the fuzz tests (a few examples, CI)
and by `thinkserve-bench fuzz` (thousands, a committed report)."""
