"""ThinkServe's python-backend models: the code Triton runs for every model of the CPU repository.

Installed into the model environment (numpy<2). Modules under `models/` import Triton's
`triton_python_backend_utils`, which exists only inside a stub; every other module is plain Python and
unit-tested outside Triton.
"""
