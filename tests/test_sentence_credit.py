"""Per-sentence credit (``ClozeCaption-v0``'s ``credit="sentence"``, ours): each sentence's share of
the reward (leave one out), its tokens found in the generated ids, and the update training them with
the sentence's own advantage."""

from __future__ import annotations

import gymnasium
import pytest
import torch
from test_cloze_env import ENV_ID, _index, _play

import agentcap_envs  # noqa: F401  (registers the built-in environments)
from agentcap.agents.tiny import build_tiny
from agentcap.algorithms.grpo import clipped_objective
from agentcap.judges.questions import sentence_spans, sentences
from agentcap.rollout.credit import token_pieces
from agentcap.training.harness import Row
from agentcap.training.update import set_advantages


def _credited(toy_soundscapes, **kwargs):
    return gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact",
                          defer_scoring=True, **kwargs)


def test_sentence_spans_are_where_the_sentences_lie():
    text = " From 0.5 s to 1.0 s, a man speaks. A door slams; a dog barks.\n\nThe end "
    spans = sentence_spans(text)
    assert [text[a:b].strip() for a, b in spans] == sentences(text)
    assert sentences(text) == ["From 0.5 s to 1.0 s, a man speaks.", "A door slams", "a dog barks.", "The end"]
    assert sentence_spans("") == [] and sentence_spans(" ; ") == []


def test_each_sentence_is_credited_its_leave_one_out_share(toy_soundscapes, sound_rows):
    """A sentence's utility is the caption's reward minus that of the caption without it: the gold
    caption's own sentences earn, an invented one is charged (it lengthens the caption past the
    length ramp's tolerance, and answers nothing)."""
    index = _index(sound_rows, 3)
    caption = sound_rows[index]["caption"] + " From 9.0 s to 9.5 s, a trumpet plays. A trumpet plays again."
    env = _credited(toy_soundscapes, credit="sentence")
    episode = _play(env, index, caption)[4]["episode"]
    score = env.unwrapped.score([episode])[0]
    credit = score.text_credit[0]
    spans = sentence_spans(caption)
    assert len(credit) == len(spans) >= 4
    assert [end for end, _ in credit] == [start for start, _ in spans[1:]] + [len(caption)]
    plain = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact")
    for (start, _), (end, share) in zip(spans, credit):  # a sentence and its separator come out together
        assert share == pytest.approx(score.reward - _play(plain, index, (caption[:start] + caption[end:]).strip())[1])
    gold, invented = [share for _, share in credit[:-2]], [share for _, share in credit[-2:]]
    assert min(gold) > 0 and max(invented) < min(gold)
    # the paper's credit: one utility for the whole caption, no pieces; the reward itself unchanged
    caption_env = _credited(toy_soundscapes)
    same = caption_env.unwrapped.score([_play(caption_env, index, caption)[4]["episode"]])[0]
    assert same.text_credit == [None] and same.reward == score.reward


def test_credit_terms_make_the_shares_of_those_components_alone(toy_soundscapes, sound_rows):
    """``credit_terms`` without length: a sentence's share is the leave-one-out difference of the
    other components only (length, a whole caption's property, pays long sentences otherwise); the
    caption's reward keeps every component."""
    index = _index(sound_rows, 3)
    caption = sound_rows[index]["caption"] + " From 9.0 s to 9.5 s, a trumpet plays loudly and for a long time."
    weights = {"esr": 1.0, "ectr": 1.0, "length": 0.5, "count": 1.0}
    env = _credited(toy_soundscapes, credit="sentence", weights=weights, credit_terms=["esr", "ectr", "count"])
    score = env.unwrapped.score([_play(env, index, caption)[4]["episode"]])[0]
    full = _credited(toy_soundscapes, credit="sentence", weights=weights)
    full_score = full.unwrapped.score([_play(full, index, caption)[4]["episode"]])[0]
    assert score.reward == full_score.reward
    evidence = gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), prompt="compact",
                              weights={**weights, "length": 0.0})
    whole = _play(evidence, index, caption)[1]
    spans, credit = sentence_spans(caption), score.text_credit[0]
    for (start, _), (end, share) in zip(spans, credit):
        assert share == pytest.approx(whole - _play(evidence, index, (caption[:start] + caption[end:]).strip())[1])
    lengths = [share for _, share in full_score.text_credit[0]]
    assert lengths != pytest.approx([share for _, share in credit])  # length did count in the default shares


@pytest.mark.parametrize("kwargs, message", [
    ({"credit": "sentence", "credit_terms": ["esr", "lenght"]}, r"credit_terms must name some of the reward components"),
    ({"credit": "sentence", "credit_terms": []}, r"credit_terms must name some"),
    ({"credit_terms": ["esr"]}, r"with credit='caption' there are none"),
])
def test_bad_credit_terms_are_refused(toy_soundscapes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), **kwargs)


def test_an_unknown_credit_is_refused(toy_soundscapes):
    with pytest.raises(ValueError, match=r"argument 'credit' must be one of \['caption', 'sentence'\], got 'token'"):
        gymnasium.make(ENV_ID, manifest=str(toy_soundscapes / "train.jsonl"), credit="token")


def test_tokens_fall_in_the_piece_where_their_text_ends():
    tokenizer = build_tiny("qwen2_audio", texts=["a beep from 0.5 s to 1.0 s . a dog barks ."]).tokenizer
    text = "a beep from 0.5 s to 1.0 s. a dog barks."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    pieces = token_pieces(tokenizer, ids, text, [28, len(text)])  # the second sentence starts at 28
    words = [tokenizer.decode([i]) for i in ids]
    assert pieces == [0] * 9 + [1] * 5, list(zip(words, pieces))  # "." closes the first; EOS joins the last
    assert token_pieces(tokenizer, ids, text, [len(text)]) == [0] * len(ids)
    for bad in ([], [28], [28, 28, len(text)], [0, len(text)]):
        with pytest.raises(ValueError, match="text credit ends must rise"):
            token_pieces(tokenizer, ids, text, bad)


def _row(group: int, utility: float, pieces=None, piece_utilities=None, length: int = 4) -> Row:
    row = Row(completion_ids=torch.arange(length), group=group, utility=utility)
    row.pieces, row.piece_utilities = pieces, piece_utilities
    return row


def test_a_captions_advantage_is_redistributed_over_its_pieces_by_their_shares():
    """Each token gets its span's advantage plus its piece's share minus the span's mean share, in
    the caption's units (divided by the caption group's sigma): the pieces of one caption average to
    its own advantage, so a caption is pushed as plain GRPO pushes it and only its sentences' parts
    change; rows without pieces keep one advantage; groups do not mix; tied captions give nothing."""
    a = _row(0, 1.0, [0, 0, 1, 1], [0.5, -0.5])
    b = _row(0, 0.0, [0, 1, 1, 1], [0.5, 0.1])
    c = _row(1, 2.0, [0, 0, 0, 0], [3.0])
    d = _row(1, 1.0)
    e = _row(2, 0.7, [0, 0, 1, 1], [0.4, 0.3])
    f = _row(2, 0.7, [0, 0, 0, 0], [0.7])
    set_advantages([a, b, c, d, e, f], 0.0, "population")
    assert (a.advantage, b.advantage, c.advantage, d.advantage) == (1.0, -1.0, 1.0, -1.0)
    # group 0's captions 1.0 and 0.0: sigma 0.5, so a share 0.5 above the caption's mean is one unit
    assert a.token_advantages == pytest.approx([2.0, 2.0, 0.0, 0.0])  # the invented sentence is not pushed up
    assert b.token_advantages == pytest.approx([-0.6, -1.4, -1.4, -1.4])  # the better sentence is pushed down less
    for row in (a, b):
        per_piece = {k: row.token_advantages[i] for i, k in enumerate(row.pieces)}
        assert sum(per_piece.values()) / len(per_piece) == pytest.approx(row.advantage)
    assert c.token_advantages == pytest.approx([1.0] * 4)  # one piece: the caption's advantage
    assert d.token_advantages is None
    assert e.token_advantages == [0.0] * 4 and f.token_advantages == [0.0] * 4  # tied captions: no signal
    set_advantages([a, b], 0.0, "none")  # Dr. GRPO: advantage u - mu, shares as they are
    assert a.token_advantages == pytest.approx([1.0, 1.0, 0.0, 0.0])  # 0.5 + (0.5 - 0), 0.5 + (-0.5 - 0)


def test_per_token_advantages_equal_per_row_ones_when_they_agree():
    torch.manual_seed(0)
    logprobs = torch.randn(3, 5, requires_grad=True)
    old = logprobs.detach() + 0.1 * torch.randn(3, 5)
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    rows = torch.tensor([1.0, -0.5, 0.25])
    by_row = clipped_objective(logprobs, old, rows, mask)["loss"]
    by_token = clipped_objective(logprobs, old, rows.unsqueeze(1).expand(3, 5).clone(), mask)["loss"]
    assert torch.allclose(by_row, by_token)
    mixed = rows.unsqueeze(1).repeat(1, 5)
    mixed[0, 2:] = -1.0  # row 0's later tokens pushed down: only they change sign in the gradient
    grad = torch.autograd.grad(clipped_objective(logprobs, old, mixed, mask)["loss"], logprobs)[0]
    same = torch.autograd.grad(by_row, logprobs)[0]
    assert torch.allclose(grad[1:], same[1:]) and torch.allclose(grad[0, :2], same[0, :2])
    assert (grad[0, 2:] * same[0, 2:] < 0).all()
    with pytest.raises(ValueError, match=r"advantages must be \[N\], one per row, or \[N, T\]"):
        clipped_objective(logprobs, old, torch.zeros(3, 4), mask)


def test_a_rollout_with_sentence_credit_trains_each_token_with_its_sentences_advantage(toy_soundscapes, sound_rows):
    """Sampled captions of a tiny audio LM: every credited span's tokens are placed in its sentences,
    the update runs on per-token advantages, and a span's tokens take only its sentences' values."""
    from tiny_agents import tiny_agent

    from agentcap.rollout.driver import RolloutDriver
    from agentcap.training.harness import UpdateHarness
    from agentcap.training.logs import rollout_metrics

    agent = tiny_agent("qwen2_audio", texts=[r["caption"] for r in sound_rows], max_new_tokens=24)
    driver = RolloutDriver(lambda: _credited(toy_soundscapes, credit="sentence"), {"policy": agent})
    batch = driver.run(indices=[0, 3], group_size=4, seed=3)
    spans = batch.spans_of("policy")
    credited = [s for s in spans if s.pieces is not None]
    assert credited, [s.text for s in spans]
    for span in credited:
        assert len(span.pieces) == span.completion_ids.numel()
        assert span.pieces == sorted(span.pieces) and span.pieces[-1] == len(sentence_spans(span.text)) - 1
    set_advantages(spans, 1e-6, "population")
    for span in credited:
        own = {round(a, 9) for a in span.token_advantages}
        assert len(own) <= len(span.piece_utilities)
    metrics = rollout_metrics(batch, spans, "policy", group_size=4)  # what W&B shows of the credit
    assert metrics["credit/policy/pieces"] == pytest.approx(sum(len(s.piece_utilities) for s in credited) / len(credited))
    against = sum(1 for s in credited for a in s.token_advantages if a * s.advantage < 0)
    assert metrics["credit/policy/against_action"] == pytest.approx(against / sum(len(s.pieces) for s in credited))
    harness = UpdateHarness(agent, lr=1e-3)
    before = [p.detach().clone() for p in agent.trainable_parameters()]
    stats = harness.update(spans)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.trainable_parameters()))
