"""TritonPythonModel classes. Each generated model.py in the repository re-exports one of them."""
