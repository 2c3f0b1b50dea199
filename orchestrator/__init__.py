"""ThinkServe orchestrator: gRPC service, query pipeline, knowledge base and the Triton client/launcher."""

__version__ = "0.1.0"
