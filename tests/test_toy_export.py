"""An exported toy agent (the offline demos' ToyMediaLM) is a Hugging Face model folder: a fresh
process loads it with `AutoModelForCausalLM` (registered by importing agentcap.agents.toy, or through
the folder's remote code) and generates exactly what the trained model generates (issue 35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentcap.agents.toy import ToyConfig, ToyMediaLM
from agentcap.commands.export import _save_model

ROOT = Path(__file__).resolve().parents[1]

LOAD = r"""
import json, sys, torch
torch.set_num_threads(1)  # as the test process (conftest)
folder, how = sys.argv[1], sys.argv[2]
from transformers import AutoConfig, AutoModelForCausalLM
if how == "registered":
    import agentcap.agents.toy  # noqa: F401  (registers agentcap_toy_media with the Auto classes)
    model = AutoModelForCausalLM.from_pretrained(folder)
else:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
assert AutoConfig.from_pretrained(folder, trust_remote_code=True).model_type == "agentcap_toy_media"
model.eval()
ids = torch.tensor([[3, 4, 5, 6]])
wave = torch.sin(torch.arange(8000) / 7.0).tolist()
logits = model(ids, media=[{"waveform": wave}]).logits
out = model.generate(ids, media=[{"waveform": wave}], max_new_tokens=6, do_sample=False)
print(json.dumps({"class": type(model).__name__, "logits": logits[0, -1].tolist(), "tokens": out[0].tolist()}))
"""


@pytest.mark.slow  # two fresh processes import transformers and torch
def test_an_exported_toy_agent_loads_and_generates_in_plain_transformers(tmp_path, capsys):
    torch.manual_seed(0)
    model = ToyMediaLM(ToyConfig(vocab_size=24, media="audio", hidden_size=16, num_layers=1, num_heads=2,
                                 intermediate_size=32)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folder = tmp_path / "policy"
    _save_model(model, str(folder))
    assert "toy format" not in capsys.readouterr().err
    assert {"config.json", "model.safetensors"} <= set(os.listdir(folder)) and "toy_model.pt" not in os.listdir(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # saving changes nothing
    # agentcap's own loader reads the folder back, bit for bit
    again = ToyMediaLM.from_pretrained(str(folder))
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.tensor([[3, 4, 5, 6]])
    wave = torch.sin(torch.arange(8000) / 7.0).tolist()
    with torch.no_grad():
        logits = model(ids, torch.ones_like(ids), [{"waveform": wave}])[0, -1].tolist()
        tokens = model.generate(ids, torch.ones_like(ids), [{"waveform": wave}], max_new_tokens=6,
                                do_sample=False)[0].tolist()
    for how in ("registered", "remote_code"):
        run = subprocess.run([sys.executable, "-c", LOAD, str(folder), how], cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        got = json.loads(run.stdout.strip().splitlines()[-1])
        assert got["class"] == "ToyMediaForCausalLM"
        # the same weights and inputs; a fresh process may pick another CPU kernel, so the last bits can differ
        torch.testing.assert_close(torch.tensor(got["logits"]), torch.tensor(logits), rtol=1e-5, atol=1e-6, msg=how)
        assert got["tokens"] == tokens, how
