"""Helpers shared by tests and benchmarks (real processes, real sockets)."""
