"""Beam search: one beam is greedy search; enough beams find the best-scoring sequence."""
import itertools
import math

import torch

from conftest import EOS_NEVER, PROMPT, llama
from sampling import autoregressive_generate, beam_search_generate


def test_one_beam_of_one_candidate_is_greedy_search():
    target = llama()
    expected = autoregressive_generate(PROMPT, target, max_gen_len=15, eos_tokens_id=EOS_NEVER, use_cache=True)
    assert beam_search_generate(PROMPT, target, max_gen_len=15, num_beams=1, top_k=1, eos_tokens_id=EOS_NEVER, pad_token_id=-1) == expected


@torch.no_grad()
def test_unpruned_beam_search_returns_the_best_penalised_sequence():
    vocab, length, eos, alpha, min_length = 4, 3, 3, 1.2, 5.0
    model = llama(vocab=vocab, init=0.3, seed=3)
    prompt = [1, 2]

    def score(seq):
        logprob = 0.0
        for i in range(len(seq)):
            logits = model(torch.tensor([prompt + list(seq[:i])])).logits[0, -1]
            logprob += torch.log_softmax(logits, -1)[seq[i]].item()
        return logprob / ((min_length + len(seq)) / (min_length + 1)) ** alpha

    hypotheses = []
    for size in range(1, length + 1):
        for seq in itertools.product(range(vocab), repeat=size):
            if eos not in seq[:-1] and (seq[-1] == eos or size == length):
                hypotheses.append(seq)
    best = max(hypotheses, key=score)
    out = beam_search_generate(prompt, model, max_gen_len=length, num_beams=vocab**length, top_k=vocab, min_length=min_length,
                               alpha=alpha, eos_tokens_id=eos, pad_token_id=-1)
    assert tuple(out) == best
    assert math.isclose(score(tuple(out)), max(map(score, hypotheses)))


def test_beam_search_stops_at_max_gen_len():
    target = llama()
    assert len(beam_search_generate(PROMPT, target, max_gen_len=7, eos_tokens_id=EOS_NEVER, pad_token_id=-1)) == 7
