"""Structured outputs: constrain a request's tokens to a JSON schema, JSON object, regex, choice
or grammar. The engine compiles a constraint once (backend.StructuredOutputs, xgrammar, loaded
on first use), gives each sequence its own matcher, and the sampler masks the constrained rows
of a batch (bitmask.py) while free rows share the same step untouched.

The public piece is StructuredOutputsParams, set on SamplingParams.structured_outputs; it
imports neither torch nor the grammar library.
"""

from tokenmill.engine.core.structured.params import StructuredOutputsError, StructuredOutputsParams

__all__ = ["StructuredOutputsError", "StructuredOutputsParams"]
