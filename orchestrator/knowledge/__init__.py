"""Knowledge base: documents split into passages, their embeddings, one folder per collection (tenant)."""
