"""Benchmarks for pairmq, run as scripts from the repository root (see `make bench`)."""
