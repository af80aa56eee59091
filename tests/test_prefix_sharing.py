"""An item's G rollouts share one prefill (``agentcap.agents.prefix``) and sample exactly
what the plain prefill samples: seeded and greedy tokens, and the learner's log-probs after; the
learner's own forward encodes a repeated prompt once too, with the same loss and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_agents import tiny_agent

from agentcap.agents import AgentConfig, build_agent
from agentcap.agents.prefix import repeated_rows, shared_prompt_cache

G = 3
PROMPTS = ["describe the clip .", "what happens ? describe the sound of the clip , the man and the woman ."]


def grouped(items: list[dict]) -> list[dict]:
    """Each observation G times in a row, as the rollout driver asks for them."""
    return [o for o in items for _ in range(G)]


def text_items() -> list[dict]:
    return [{"agent": "policy", "messages": [{"role": "user", "content": p}], "media": {}} for p in PROMPTS]


def run_both(agent, obs: list[dict], count_module) -> dict[bool, tuple]:
    """Seeded tokens, greedy tokens, old log-probs and prompt tokens computed, sharing on and off."""
    computed: list[int] = []

    def count(module, args, kwargs):  # rows × positions of every forward (ids or embeddings)
        x = args[0] if args else kwargs.get("input_ids")
        x = kwargs["inputs_embeds"] if x is None else x
        computed.append(x.shape[0] * x.shape[1])

    hook = count_module.register_forward_pre_hook(count, with_kwargs=True)
    out = {}
    try:
        for share in (True, False):
            agent.share_prompts = share
            computed.clear()
            sampled = agent.generate(obs, seeds=[100 + i for i in range(len(obs))])
            tokens = sum(computed)
            greedy = agent.generate(obs, greedy=True, old_logprobs=False)
            out[share] = (
                [g.completion_ids.tolist() for g in sampled],
                [g.completion_ids.tolist() for g in greedy],
                [g.old_logprobs for g in sampled],
                tokens,
            )
    finally:
        hook.remove()
    return out


def assert_same_samples(out: dict[bool, tuple]) -> None:
    shared, plain = out[True], out[False]
    assert shared[0] == plain[0], "seeded sampling changed"
    assert shared[1] == plain[1], "greedy decoding changed"
    for a, b in zip(shared[2], plain[2]):  # the learner shares the prompt too: equal to float rounding
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert shared[3] < plain[3], f"no prefill was shared ({shared[3]} tokens computed vs {plain[3]})"


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama", "gpt2"])
def test_shared_prefill_samples_what_the_plain_prefill_samples(kind):
    """Left-padded prompts of two lengths, G copies each, and one prompt alone (a later turn whose
    rollouts diverged): positions must follow the mask."""
    agent = tiny_agent(kind, max_new_tokens=8, temperature=1.0)
    assert agent.share_prompts  # on by default
    alone = {"agent": "policy", "messages": [{"role": "user", "content": "caption : a dog barks ."}], "media": {}}
    obs = grouped(text_items()) + [alone]
    inputs = agent.encode(obs)
    assert (inputs["attention_mask"][:, 0] == 0).any(), "prompts should differ in length (left padding)"
    assert_same_samples(run_both(agent, obs, agent.model.get_input_embeddings()))


def test_the_toy_media_lm_shares_its_prefill(tmp_path):
    """The toy LM generates from embeddings (media prefix + tokens): equal media and text share."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Anna opens the red door .\nTom picks up the key .\n")
    torch.manual_seed(0)
    agent = build_agent("policy", AgentConfig(
        toy={"media": "features", "feature_dim": 8, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
             "intermediate_size": 32}, build_tokenizer_from=[str(texts)], max_new_tokens=8, temperature=2.0))
    rng = np.random.default_rng(0)
    items = [{"agent": "policy", "messages": [{"role": "user", "content": "Anna opens the" + " door" * i}],
              "media": {"features": rng.standard_normal((3 + i, 8)).astype(np.float32)}} for i in range(2)]
    assert_same_samples(run_both(agent, grouped(items), agent.model.lm.model))


def test_repeated_rows_finds_each_distinct_row_once():
    ids = torch.tensor([[0, 5, 6], [1, 2, 3], [0, 5, 6], [1, 2, 3], [1, 2, 4]])
    mask = torch.ones_like(ids)
    first, inverse = repeated_rows(ids, mask)
    assert torch.equal(ids[first][inverse], ids)  # every row rebuilt from its distinct row
    assert sorted(first.tolist()) == [0, 1, 4]
    assert repeated_rows(ids[[0, 1, 4]], mask[[0, 1, 4]]) is None  # nothing repeats: nothing to share
    other_mask = mask.clone()
    other_mask[2, 0] = 0  # same tokens, another mask: another prompt
    assert sorted(repeated_rows(ids, other_mask)[0].tolist()) == [0, 1, 2, 4]


def test_no_sharing_where_it_does_not_apply():
    agent = tiny_agent("qwen2", max_new_tokens=4)
    repeated = agent.encode(grouped(text_items()))
    assert shared_prompt_cache(agent.model, repeated["attention_mask"], input_ids=repeated["input_ids"]) is not None
    distinct = agent.encode(text_items())
    assert agent.family.prompt_cache(distinct) is None
    agent.model.generation_config.cache_implementation = "static"  # the model's own cache: left alone
    assert agent.family.prompt_cache(repeated) is None


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_the_learner_encodes_a_repeated_prompt_once_with_the_same_loss_and_gradients(kind):
    """The update's forward continues every row from its prompt's shared, differentiable cache:
    log-probs and gradients equal the plain forward's to float rounding, with fewer positions run."""
    from agentcap.agents.agent import pad_right

    agent = tiny_agent(kind, max_new_tokens=6, temperature=1.0)
    agent.set_trainable(True)
    obs = grouped(text_items())
    gens = agent.generate(obs, seeds=list(range(len(obs))), old_logprobs=False)
    completion, mask = pad_right([g.completion_ids for g in gens], agent.tokenizer.pad_token_id)
    inputs = agent.encode(obs)
    computed: list[int] = []
    hook = agent.model.get_input_embeddings().register_forward_hook(lambda m, a, out: computed.append(out.shape[0] * out.shape[1]))
    results = {}
    for share in (True, False):
        agent.share_prompts = share
        agent.model.zero_grad()
        computed.clear()
        logprobs = agent.completion_logprobs(inputs, completion, mask)
        (-(logprobs * torch.linspace(0.5, 1.5, len(obs))[:, None]).sum()).backward()
        results[share] = (logprobs.detach(), {n: p.grad.clone() for n, p in agent.model.named_parameters()}, sum(computed))
    hook.remove()
    (shared, shared_grads, shared_tokens), (plain, plain_grads, plain_tokens) = results[True], results[False]
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert shared_tokens < plain_tokens


def test_the_learner_does_not_share_under_gradient_checkpointing():
    from agentcap.agents.checkpointing import enable_gradient_checkpointing

    agent = tiny_agent("qwen2", max_new_tokens=4)
    enable_gradient_checkpointing(agent.model)
    inputs = agent.encode(grouped(text_items()))
    completion = torch.ones(inputs["input_ids"].shape[0], 2, dtype=torch.long)
    calls = []
    agent.family.prompt_cache = lambda inputs: calls.append(1)
    agent.completion_logprobs(inputs, completion, torch.ones_like(completion))
    assert not calls


def test_a_sharded_learner_does_not_share_and_its_backward_runs(tmp_path):
    """Under FSDP2 the prefill would be a second forward of every sharded block before one backward,
    and that backward fails (its gathered weights are already freed): a sharded model reads each row
    whole, with the plain path's log-probs and gradients."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from agentcap.agents.agent import pad_right
    from agentcap.parallel.sharding import shard_agents

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        agent = tiny_agent("qwen2", max_new_tokens=4, temperature=1.0)
        agent.set_trainable(True)
        obs = grouped(text_items())
        gens = agent.generate(obs, seeds=list(range(len(obs))), old_logprobs=False)
        completion, mask = pad_right([g.completion_ids for g in gens], agent.tokenizer.pad_token_id)
        inputs = agent.encode(obs)
        agent.share_prompts = False
        plain = agent.completion_logprobs(inputs, completion, mask)
        plain.sum().backward()
        plain_grads = {n: p.grad.clone() for n, p in agent.model.named_parameters()}
        agent.model.zero_grad(set_to_none=True)
        shard_agents({"policy": agent}, init_device_mesh("cpu", (1,)))
        agent.share_prompts = True
        logprobs = agent.completion_logprobs(inputs, completion, mask)
        logprobs.sum().backward()
        torch.testing.assert_close(logprobs.detach(), plain.detach(), atol=1e-5, rtol=1e-5)
        for name, param in agent.model.named_parameters():
            grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            torch.testing.assert_close(grad, plain_grads[name.replace("_fsdp_wrapped_module.", "")], atol=1e-5, rtol=1e-4)
    finally:
        dist.destroy_process_group()
