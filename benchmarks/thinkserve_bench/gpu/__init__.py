"""The device runner: pack the minimum runtime here, run the GPU measurements there (see README.md)."""
