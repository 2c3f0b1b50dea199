"""The knowledge graph: entities and relations extracted from the evidence, the graph's tables and their
merge per commit, and PageRank (scipy, compiled, or on a GPU)."""
