"""A collection on disk and in memory: per-document segments, the manifest that commits them, snapshots
that queries read, their vector and BM25 indexes (built incrementally), the writer lock and the reaper."""
