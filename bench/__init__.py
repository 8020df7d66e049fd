"""Benchmarks. Each prints its figures and rewrites its own section of BENCHMARKS.md."""
