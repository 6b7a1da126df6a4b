"""The scheduler's step as plain data for the execution layer: each scheduled sequence's new
tokens, positions, KV slots and block table, the rows that score prompt tokens, and the rows
embeddings pool (an embedding's rows sample nothing: no logits), and the image encoder's rows
that replace a prompt's image placeholders."""

from __future__ import annotations

from tokenmill.engine.core.images import rope_positions, rope_shift, rows_in_step, visible_until
from tokenmill.engine.core.pooling import pooled_rows
from tokenmill.engine.core.prompt_logprobs import rows_to_score
from tokenmill.engine.core.request import Sequence
from tokenmill.engine.execution.step_inputs import StepInputs


def build_step_inputs(scheduled: list[tuple[Sequence, int]], block_size: int,
                      all_logits: bool = False,
                      block_copies: list[tuple[int, int]] | None = None,
                      transfers: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], []),
                      lora_loads: list[tuple[int, str]] | None = None,
                      state_copies: list[tuple[int, int]] | None = None) -> StepInputs:
    """Sequences with their number of new tokens, in the order the runner lays out rows.
    all_logits asks for every new token's logits (scoring a text), not only the last's;
    transfers are the host tier's (to host, to device) copies (KVCacheManager.take_transfers);
    lora_loads the adapters to put in device slots first (LoRASlotTable.take_loads);
    state_copies the recurrent states to copy to forks first (KVCacheManager.take_state_copies)."""
    inputs = StepInputs(block_copies=list(block_copies or []), all_logits=all_logits,
                        kv_to_host=list(transfers[0]), kv_to_device=list(transfers[1]),
                        lora_loads=list(lora_loads or []),
                        state_copies=list(state_copies or []))
    rare = False  # a sequence with images, pooling or prompt logprobs: the rows below
    for seq, num_new in scheduled:
        start = seq.num_computed_tokens
        rare = rare or bool(seq.images) or seq.pooling is not None or \
            seq.prompt_logprobs is not None
        shift = rope_shift(seq.images, start) if seq.images else 0
        if seq.spec_tokens:  # its last token, then its proposals: a logit row for each
            inputs.add_sequence(seq.token_slice(start, start + 1) + seq.spec_tokens, start,
                                seq.block_table, block_size, num_logits=num_new,
                                lora_slot=seq.lora_slot, position_shift=shift,
                                state_slot=seq.state_slot)
            continue
        first_row = len(inputs.input_ids)
        inputs.sampled_ids |= seq.awaits_token
        # A logit row where the step completes the prompt (the next token is sampled from it);
        # none for an embedding's rows, or a chunk with more of the prompt to come.
        samples = seq.pooling is None and start + num_new == seq.num_tokens
        inputs.add_sequence(seq.token_slice(start, start + num_new), start, seq.block_table,
                            block_size, num_logits=int(samples),
                            lora_slot=seq.lora_slot, position_shift=shift,
                            state_slot=seq.state_slot)
        if seq.images:
            inputs.image_rows += rows_in_step(seq.images, start, start + num_new, first_row)
        if seq.prompt_embeds is not None:
            inputs.embed_rows += seq.prompt_embeds.rows_in_step(start, start + num_new,
                                                                first_row)
        rows = pooled_rows(seq, num_new)
        if rows is not None:
            inputs.pool_spans.append((first_row + rows[0], first_row + rows[1]))
    if rare:
        inputs.prompt_rows = rows_to_score(scheduled)
        inputs.token_types = _token_types(scheduled)
        inputs.visible_until = _visible_until(scheduled)
        inputs.grid_positions = _grid_positions(scheduled, inputs.positions)
    return inputs


def _visible_until(scheduled: list[tuple[Sequence, int]]) -> list[int]:
    """Each new token's last visible position where an image's rows see it whole (both
    ways); [] where every row is causal."""
    seen = [None if not seq.images else
            visible_until(seq.images, seq.num_computed_tokens, seq.num_computed_tokens + n)
            for seq, n in scheduled]
    if not any(seen):
        return []
    rows: list[int] = []
    for (seq, num_new), last in zip(scheduled, seen, strict=True):
        start = seq.num_computed_tokens
        rows += last or range(start, start + num_new)
    return rows


def _grid_positions(scheduled: list[tuple[Sequence, int]], positions: list[int]) -> list[list[int]]:
    """Each new token's (frame, row, column) rotary positions, as three lists, where some
    of them are rows of an image with 3-D positions; [] where none is."""
    grids = [None if not seq.images or seq.spec_tokens else
             rope_positions(seq.images, seq.num_computed_tokens, seq.num_computed_tokens + n)
             for seq, n in scheduled]
    if not any(grids):
        return []
    rows: list[tuple[int, int, int]] = []
    for (_, num_new), grid in zip(scheduled, grids, strict=True):
        rows += grid or [(p, p, p) for p in positions[len(rows):len(rows) + num_new]]
    return [list(axis) for axis in zip(*rows, strict=True)]


def _token_types(scheduled: list[tuple[Sequence, int]]) -> list[int]:
    """Each new token's type (a cross-encoder's pair), [] where no sequence has types."""
    typed = [None if seq.pooling is None else seq.pooling.params.token_type_ids
             for seq, _ in scheduled]
    if not any(typed):
        return []
    rows = []
    for (seq, num_new), types in zip(scheduled, typed, strict=True):
        start = seq.num_computed_tokens
        rows += types[start:start + num_new] if types else [0] * num_new
    return rows
