"""Speed and memory measurements, run from the repository root as modules:
`python -m benchmarks.throughput --shape=a` (docs/development.md lists them)."""
