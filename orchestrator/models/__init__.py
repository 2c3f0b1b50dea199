"""The model seam: what the pipeline and the ingest ask of the models (protocol), the models' contracts (names,
tensors, parameters) and the chat templates their prompts are written in. Triton (orchestrator.triton) is one
implementation of it; the tests' in-process double is another."""
