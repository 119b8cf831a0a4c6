"""Benchmarks run by `make bench`; each module's main() writes JSON under bench/results/."""
