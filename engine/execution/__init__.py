"""Execution: run the steps the core schedules on a device. It owns the model runner, the KV
pool tensors (their layout and sizing), decode CUDA graphs, the step's device buffers and the
tensor-parallel worker processes. It consumes plain step data (step_inputs.StepInputs) and
never imports the core: requests, sequences and sampling are the core's."""
