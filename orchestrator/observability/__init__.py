"""Metrics, traces and logs of the orchestrator."""
