"""Wiring: build the components of an experiment for a named backend."""
