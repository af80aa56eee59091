"""Chosen-token log-probs: equal to log_softmax's in value and gradient, without [N, T, V] tensors."""

from __future__ import annotations

import pytest
import torch

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.agent import pad_right
from agentcap.agents.logprobs import chosen_logprobs, plain_head

V = 97


def reference(hidden, weight, targets, temperature):
    logp = torch.log_softmax((hidden @ weight.t()).float() / temperature, dim=-1)
    chosen = logp.gather(-1, targets[:, None]).squeeze(-1)
    return chosen, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [3, 1024])
def test_chosen_logprobs_match_log_softmax_in_value_and_gradient(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(10, 16, requires_grad=True)
    weight = torch.randn(V, 16, requires_grad=True)
    targets = torch.randint(0, V, (10,))
    g = torch.randn(10)
    lp, ent = chosen_logprobs(hidden, weight, targets, temperature=0.7, chunk=chunk)
    (lp * g).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_lp, ref_ent = reference(hidden, weight, targets, 0.7)
    (ref_lp * g).sum().backward()
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent.detach())
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], weight.grad)
    assert not ent.requires_grad  # entropy is logged, never differentiated


@pytest.fixture
def llama(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("Anna opens the red door .\nTom picks up the key .\n")
    torch.manual_seed(0)
    tiny = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "tie_word_embeddings": True}
    agent = build_agent("policy", AgentConfig(tiny=tiny, build_tokenizer_from=[str(texts)], max_new_tokens=5,
                                               temperature=0.8))
    agent.set_trainable(True)
    return agent


def batch(agent):
    obs = [{"agent": "policy", "messages": [{"role": "user", "content": "Anna opens the" + " door" * i}]}
           for i in range(3)]
    torch.manual_seed(1)
    rows = [torch.randint(3, 30, (n,)) for n in (4, 2, 5)]
    completion, mask = pad_right(rows, agent.tokenizer.pad_token_id)
    return agent.encode(obs), completion, mask


def test_agent_logprobs_and_gradients_equal_the_full_softmax(llama):
    assert plain_head(llama.model) is not None  # the chunked path is the one under test
    inputs, completion, mask = batch(llama)
    lp, ent = llama.completion_logprobs(inputs, completion, mask, with_entropy=True)
    lp.sum().backward()
    fast = {n: p.grad.clone() for n, p in llama.model.named_parameters()}
    llama.model.zero_grad()
    logits = llama.family.logits(inputs, completion, mask).float() / llama.temperature
    logp = torch.log_softmax(logits, -1)
    ref = logp.gather(-1, completion[..., None]).squeeze(-1) * mask
    ref.sum().backward()
    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(ent, (-(logp.exp() * logp).sum(-1) * mask).detach())
    for n, p in llama.model.named_parameters():
        torch.testing.assert_close(fast[n], p.grad, msg=n)


def test_no_vocabulary_sized_tensor_is_kept_for_backward(llama):
    """What autograd saves grows with N·T·H, never N·T·V: the peak memory of an update."""
    inputs, completion, mask = batch(llama)
    vocab = llama.model.get_output_embeddings().weight.shape[0]
    saved: list[torch.Size] = []

    def pack(t):
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        llama.completion_logprobs(inputs, completion, mask, with_entropy=True)
    wide = [s for s in saved if len(s) >= 2 and s[-1] == vocab and s.numel() >= vocab * int(mask.sum())]
    assert not wide, f"vocabulary-wide tensors saved for backward: {wide}"


def test_a_swapped_in_reference_model_is_scored_with_its_own_head(llama):
    """agents.reference swaps family.model: the chunked path must read that model's head."""
    from agentcap.agents.reference import Reference

    inputs, completion, mask = batch(llama)
    reference = Reference(llama)
    with torch.no_grad():
        reference.model.get_output_embeddings().weight.mul_(2.0)
        logits = reference.model(**llama.family.sequence_inputs(inputs, completion, mask)).logits
    t = completion.shape[1]
    logp = torch.log_softmax(logits[:, -(t + 1) : -1].float() / llama.temperature, -1)
    want = logp.gather(-1, completion[..., None]).squeeze(-1) * mask
    torch.testing.assert_close(reference.completion_logprobs(llama, inputs, completion, mask), want)
