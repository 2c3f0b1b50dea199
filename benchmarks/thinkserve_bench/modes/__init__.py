"""The benchmark modes: each takes a BenchSession (or a target) and returns a JSON-able result with raw records."""
