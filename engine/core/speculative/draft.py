"""Draft-model proposals: a smaller model sharing the target's tokenizer guesses each decoding
sequence's next tokens greedily, all sequences of a step in one batched forward pass per
proposal.

The draft keeps its own paged KV pool and, per sequence, how many of its tokens that pool
holds. A step first feeds each sequence's tokens the draft has not seen (the whole prompt the
first time, then the tokens the target emitted since) and takes the argmax of the last logits
as proposal 1; each later pass feeds the previous proposal to get the next. Greedy proposals
are fixed tokens, which verify.py's rule needs to keep sampling exact.

After verification the draft's KV is valid up to min(what it holds, the target's computed
tokens): accepted proposals are the target's tokens, the first rejected one is not. That rewind
happens lazily at the sequence's next proposal, so the engine's step needs no hook.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.engine.contract.speculative import SpeculativeConfig
from tokenmill.engine.core.kv_cache import KVCacheManager
from tokenmill.engine.core.request import Sequence
from tokenmill.engine.core.speculative.proposer import SpeculationStats, proposal_room
from tokenmill.engine.execution.runner import ModelRunner
from tokenmill.engine.execution.step_inputs import StepInputs


@dataclass
class DraftState:
    """One sequence in the draft's pool, in the fields KVCacheManager reads of a sequence;
    num_computed_tokens counts the tokens whose KV the draft holds."""

    seq_id: int
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_blocks: int = 0
    cached_prefix: tuple[int, int] | None = None


@dataclass
class _Pending:
    seq: Sequence
    state: DraftState
    room: int


class DraftProposer:
    """Proposals from a draft model's runner. Its pool needs no prefix cache: a draft prefill
    is cheap next to the target's."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int, runner: ModelRunner,
                 max_num_batched_tokens: int):
        self.config = config
        self.max_model_len = max_model_len
        self.runner = runner
        self.kv = KVCacheManager(runner.num_blocks, runner.block_size)
        # Catch-up tokens in one draft pass, like the target's step budget (the first sequence
        # always goes, so a long prompt is caught up whole).
        self.max_catch_up = max_num_batched_tokens
        self.states: dict[int, DraftState] = {}
        self.stats = SpeculationStats()

    def propose(self, seq: Sequence, num_running: int) -> list[int]:
        """seq's proposals for this step ([]: it decodes one token as usual)."""
        return self.propose_batch([seq], num_running).get(seq.seq_id, [])

    def propose_batch(self, seqs: list[Sequence], num_running: int) -> dict[int, list[int]]:
        """Proposals of every decoding sequence that may speculate and fits in the draft's
        pool and catch-up budget (the others get none this step)."""
        pending = self._admit(seqs, num_running)
        if not pending:
            return {}
        proposals: dict[int, list[int]] = {p.seq.seq_id: [] for p in pending}
        inputs = StepInputs()
        for p in pending:
            start = p.state.num_computed_tokens
            self._feed(inputs, p.state, p.seq.token_slice(start, p.seq.num_tokens))
        going = pending
        while True:
            tokens = self.runner.execute(inputs).argmax(dim=-1).tolist()
            for p, token in zip(going, tokens, strict=True):
                proposals[p.seq.seq_id].append(token)
            going = [p for p in going if len(proposals[p.seq.seq_id]) < p.room]
            if not going:
                return proposals
            inputs = StepInputs()
            for p in going:
                self._feed(inputs, p.state, proposals[p.seq.seq_id][-1:])

    def release(self, seq: Sequence) -> None:
        """Free seq's draft blocks (it finished, was aborted or preempted)."""
        state = self.states.pop(seq.seq_id, None)
        if state is not None:
            self.kv.free(state)

    def _admit(self, seqs: list[Sequence], num_running: int) -> list[_Pending]:
        """The sequences proposed for this step, their draft slots grown for every token the
        draft feeds: the catch-up and all proposals but the last."""
        pending: list[_Pending] = []
        catch_up_total = 0
        for seq in seqs:
            room = proposal_room(self.config, seq, self.max_model_len, num_running)
            if room < 1:
                continue
            state = self.states.get(seq.seq_id) or DraftState(seq.seq_id)
            self._rewind(state, seq)
            catch_up = seq.num_tokens - state.num_computed_tokens
            if pending and catch_up_total + catch_up > self.max_catch_up:
                continue
            if not self.kv.can_grow(state, catch_up + room - 1):
                continue
            self.kv.grow(state, catch_up + room - 1)
            self.states[seq.seq_id] = state
            pending.append(_Pending(seq, state, room))
            catch_up_total += catch_up
        return pending

    def _rewind(self, state: DraftState, seq: Sequence) -> None:
        """Drop the draft's KV past what the target confirmed, and the blocks only it used."""
        state.num_computed_tokens = min(state.num_computed_tokens, seq.num_computed_tokens)
        keep = self.kv.blocks_needed(state.num_computed_tokens)
        while len(state.block_table) > keep:
            self.kv.allocator.release(state.block_table.pop())

    def _feed(self, inputs: StepInputs, state: DraftState, token_ids: list[int]) -> None:
        inputs.add_sequence(token_ids, state.num_computed_tokens, state.block_table,
                            self.kv.block_size)
        state.num_computed_tokens += len(token_ids)
