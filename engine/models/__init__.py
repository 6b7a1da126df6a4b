"""Model code: one decoder-only transformer covering the Llama and Qwen families."""
