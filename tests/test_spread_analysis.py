"""tools/spread_analysis.py: tied groups per GRPO stage and kind, and the questions and answers of logged groups."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import spread_analysis  # noqa: E402

STAGES = [{"name": "S1", "kind": "evaluate"}, {"name": "composer_grpo", "kind": "grpo", "agent": "composer"}]


def test_ties_are_counted_per_stage_and_kind_and_questions_per_logged_group(tmp_path, monkeypatch):
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({"model": {"stages": STAGES, "rollout_batch_size": 8, "group_size": 4}}))
    history = {"a": [{"stage": 1.0, "utility/question/zero_spread": 1.0, "utility/final/zero_spread": 0.5},
                     {"stage": 1.0, "utility/question/zero_spread": 0.5, "utility/final/zero_spread": 0.0},
                     {"stage": 0.0}, {"other": 1.0}],
               "b": [{"stage": 1.0, "utility/question/zero_spread": 0.0, "utility/final/zero_spread": 0.0}]}
    monkeypatch.setattr(spread_analysis, "wandb_history", lambda run: history[Path(run).name])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rows = [{"stage": "composer_grpo", "tick": 3, "agent": "composer", "kind": "question", "response": q}
            for q in ("ASK : when?", "ASK : when? ", "ASK : what?")]
    rows += [{"stage": "composer_grpo", "tick": 3, "agent": "instruct", "kind": "answer", "response": "At 1 s."}] * 3
    (tmp_path / "a" / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    text = spread_analysis.main([str(tmp_path / "a"), str(tmp_path / "b"), "--config", str(config)])
    assert "| composer_grpo | final | 1 of 6 | 1/4, 0/2 |" in text
    assert "| composer_grpo | question | 3 of 6 | 3/4, 0/2 |" in text
    assert "| a | composer_grpo | (2, 1) |" in text


def test_held_out_games_say_whether_the_composer_copied_c0(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({"model": {"stages": STAGES, "rollout_batch_size": 8, "group_size": 4}}))
    (tmp_path / "a" / "eval").mkdir(parents=True)

    def game(c0: str, final: str, g2p_c0: float = 0.0, g2p_evidence: float = 0.0) -> dict:
        return {"trace": f"captioner/caption: {c0}\ncomposer/question: ASK : When?\ninstruct/answer: At 1 s.\n"
                         f"composer/final: {final}", "g2p_c0": g2p_c0, "g2p_evidence": g2p_evidence}

    games = [game("A bell dings. A woman speaks.", "A bell dings. A woman speaks."),
             game("A bell dings. A woman speaks.", "A bell dings.", -0.5, -0.25),  # the answer told something new
             game("A bell dings.", "A bell dings at 1 s. Paper rustles.", -0.5, -0.5),
             {"trace": "captioner/caption: A bell dings."}]  # a captioner-only episode: not a game
    (tmp_path / "a" / "eval" / "S1.jsonl").write_text("\n".join(json.dumps(g) for g in games) + "\n")
    text = spread_analysis.main([str(tmp_path / "a"), "--config", str(config)])
    assert "| a | S1 | 3 | 1 | 1 | 1 | 1 |" in text


def test_each_reward_component_gets_its_spread_inside_groups_and_its_correlation_with_the_advantage(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({"model": {"stages": [{"name": "grpo_r2", "kind": "grpo", "agent": "policy"}],
                                                "rollout_batch_size": 4, "group_size": 4}}))
    (tmp_path / "a").mkdir()
    rows = []
    for tick, esr in ((1, (0.0, 0.5, 1.0, 0.5)), (2, (1.0, 1.0, 0.0, 0.0))):
        mean = sum(esr) / 4
        for e in esr:  # the advantage follows ESR; ECTR is the same inside each group
            rows.append({"stage": "grpo_r2", "tick": tick, "agent": "policy", "kind": "caption",
                         "response": "a b" if e > mean else "a b c",  # the better rollouts are shorter
                         "advantage": e - mean, "reward": e + 0.3, "reward/esr": e, "reward/ectr": 0.3 * tick})
    (tmp_path / "a" / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spread = spread_analysis.component_spread(str(tmp_path / "a"))["grpo_r2"]
    assert abs(spread["reward/esr"][1] - 1.0) < 1e-9 and abs(spread["reward"][1] - 1.0) < 1e-9
    assert abs(spread["reward/esr"][0] - (0.3535533905932738 + 0.5) / 2) < 1e-9 and spread["reward/esr"][2] == 2
    assert spread["reward/ectr"][0] == 0.0 and math.isnan(spread["reward/ectr"][1])  # no spread
    assert spread["words"][1] < -0.8  # the advantage favours the shorter responses
    text = spread_analysis.main([str(tmp_path / "a"), "--config", str(config)])
    assert "| a | grpo_r2 | reward/esr | 0.427 | +1.00 | 2 |" in text
    assert "| a | grpo_r2 | reward/ectr | 0.000 | — | 2 |" in text  # no spread: no correlation


def test_groups_whose_rollouts_differ_only_in_their_numbers_are_counted(tmp_path):
    (tmp_path / "a").mkdir()
    texts = {1: ["From 0.5 s to 1.9 s, a bell rings.", "From 0.7 s to 2 s, a bell rings."],  # numbers only
             2: ["From 0.5 s to 1.9 s, a bell rings.", "From 0.5 s to 1.9 s, a dog barks."],  # words
             3: ["A bell rings.", "A bell rings."]}  # no spread at all: not counted
    rows = [{"stage": "grpo_r2", "tick": t, "agent": "policy", "kind": "caption", "response": x, "advantage": 0.0}
            for t, xs in texts.items() for x in xs]
    (tmp_path / "a" / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert spread_analysis.number_only_groups(str(tmp_path / "a")) == {"grpo_r2": (1, 2)}
