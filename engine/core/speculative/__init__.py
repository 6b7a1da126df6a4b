"""Speculative decoding: proposals for each decoding sequence's next tokens, verified in one
forward pass (the proposer here, the verification in verify.py)."""
