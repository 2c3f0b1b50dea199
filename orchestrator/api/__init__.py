"""The public gRPC API (proto/thinkserve/v1): generated stubs, conversions, the servicer and the server."""
