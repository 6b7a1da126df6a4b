"""The GPU acceptance suite (`tokenmill bench gpu STAGE`): every CUDA path and the H100 workloads,
one command per stage, each writing raw JSON; `--dry-run` runs the same code on a tiny model on
the CPU, so the suite is known to work before a GPU is at hand."""
