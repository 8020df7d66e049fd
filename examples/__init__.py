"""Example workloads: the demo, the tests and the benchmarks all profile these."""
