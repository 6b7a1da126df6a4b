"""The torch-free contract every part may read, the operator included: the engine's options
(config.py: EngineConfig, its flags, the supported-values table, ConfigError) and the model
shape tensor parallelism splits (model_shape.py). Nothing here imports torch or another part
of the engine; tests/ import it with torch made unimportable."""
