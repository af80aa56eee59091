"""`agentcap plan`: memory per rank and stage from config.json files only (tiny stand-ins here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import yaml

from agentcap.commands.plan import GIB, lora_params, model_size, plan, plan_command
from agentcap.commands.plan_engines import ENGINE_DEFAULTS, acting_roles, harvest_roles

ROOT = Path(__file__).resolve().parents[1]
QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}
QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 500,
         "tie_word_embeddings": True}
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 300, "n_positions": 64}


def folder(root: Path, name: str, config: dict) -> str:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text(json.dumps(config))
    return name


@pytest.mark.parametrize("config", [QWEN2, QWEN3, GPT2], ids=["qwen2", "qwen3", "gpt2"])
def test_parameter_counts_equal_the_real_architectures(tmp_path, config):
    spec = dict(config)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(spec.pop("model_type"), **spec))
    real = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    assert model_size(str(tmp_path / folder(tmp_path, "m", config)), "m").params == real


def recipe(tmp_path: Path, strategy: str = "ddp", devices: int = 4, dtype: str = "float32", peft=None,
           precision: str = "32") -> dict:
    policy = {"model": folder(tmp_path, "policy", QWEN2), "dtype": dtype, "max_new_tokens": 16}
    if peft:
        policy["peft"] = peft
    return {
        "trainer": {"devices": devices, "strategy": strategy, "precision": precision},
        "model": {
            "env": {"id": "x", "kwargs": {"examiner": folder(tmp_path, "judge", QWEN3), "scorer": "rule"}},
            "agents": {"policy": policy, "other": {"model": folder(tmp_path, "other", GPT2), "dtype": dtype}},
            "minibatch_size": 8, "generation_batch_size": 4,
            "stages": [{"name": "sft", "kind": "sft", "agent": "policy"}, {"name": "eval", "kind": "evaluate"}],
        },
    }


def test_terms_of_a_training_stage(tmp_path):
    rows = plan(recipe(tmp_path), str(tmp_path), prompt_tokens=32)
    n = model_size(str(tmp_path / "policy"), "p").params
    other = model_size(str(tmp_path / "other"), "o").params
    judge = model_size(str(tmp_path / "judge"), "j").params
    sft, evaluate = rows
    assert sft["parameters"] == 4 * n and sft["gradients"] == 4 * n and sft["optimiser"] == 8 * n
    assert sft["frozen agents"] == 4 * other and sft["judge"] == 2 * judge and sft["kv cache"] == 0
    assert sft["activations"] > 0 and sft["ranks"] == 4
    assert evaluate["parameters"] == 0 and evaluate["frozen agents"] == 4 * (n + other) and evaluate["kv cache"] > 0
    assert sft["total"] == pytest.approx(sum(sft[k] for k in ("parameters", "gradients", "optimiser", "frozen agents",
                                                              "judge", "gathered blocks", "activations")))


@pytest.mark.parametrize("peft", [None, {"r": 8}])
def test_rollouts_ahead_count_the_sampler_copy_and_k_snapshots(tmp_path, peft):
    """max_staleness 2 with the HF backend: a copy of the agent samples beside the update (its KV cache
    adds to the activations) and two snapshots of what trains wait; with a vLLM engine only the
    snapshots of a full fine-tune count (the engine samples; an adapter's snapshots stay on the host)."""
    config = recipe(tmp_path, devices=1, peft=peft)
    config["model"]["stages"] = [{"name": "grpo", "kind": "grpo", "agent": "policy"}]
    serial = plan(config, str(tmp_path), prompt_tokens=32)[0]
    config["model"]["max_staleness"] = 2
    ahead = plan(config, str(tmp_path), prompt_tokens=32)[0]
    size = model_size(str(tmp_path / "policy"), "p")
    adapter = 4 * lora_params(size, peft) if peft else 0
    snapshot = adapter if peft else 4 * size.params
    assert serial["rollouts ahead"] == 0 and serial["kv cache"] > 0
    assert ahead["rollouts ahead"] == 4 * size.params + adapter + 2 * snapshot
    overlap = min(ahead["activations"], ahead["kv cache"])
    assert ahead["total"] == pytest.approx(serial["total"] + ahead["rollouts ahead"] + overlap)
    config["model"]["agents"]["policy"]["backend"] = "vllm"
    engine = plan(config, str(tmp_path), prompt_tokens=32)[0]
    assert engine["rollouts ahead"] == (0 if peft else 2 * snapshot)


def test_sharding_divides_by_the_world_and_bf16_halves(tmp_path):
    full = plan(recipe(tmp_path), str(tmp_path))[0]
    sharded = plan(recipe(tmp_path, strategy="grpo_fsdp"), str(tmp_path))[0]
    for key in ("parameters", "gradients", "optimiser", "frozen agents"):
        assert sharded[key] == pytest.approx(full[key] / 4)
    assert sharded["judge"] == pytest.approx(full["judge"] / 4)  # a local judge is sharded too
    assert sharded["gathered blocks"] > 0 == full["gathered blocks"]
    half = plan(recipe(tmp_path, dtype="bfloat16", precision="bf16-mixed"), str(tmp_path))[0]
    assert half["parameters"] == full["parameters"] / 2 and half["frozen agents"] == full["frozen agents"] / 2
    assert half["activations"] < full["activations"]
    # fp32 masters under bf16-mixed: FSDP2 gathers the blocks in bf16, half of fp32's
    mixed = plan(recipe(tmp_path, strategy="grpo_fsdp", precision="bf16-mixed"), str(tmp_path))[0]
    assert mixed["parameters"] == sharded["parameters"]
    blocks = [model_size(str(tmp_path / name), name).block for name in ("policy", "other", "judge")]
    assert sharded["gathered blocks"] == 2 * max(4 * blocks[0], 4 * blocks[1], 2 * blocks[2])  # judge: bf16
    assert mixed["gathered blocks"] == 2 * 2 * max(blocks)


def test_lora_trains_only_adapters(tmp_path):
    peft = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    row = plan(recipe(tmp_path, peft=peft), str(tmp_path))[0]
    size = model_size(str(tmp_path / "policy"), "p")
    adapters = 3 * (4 * (64 + 64) + 4 * (64 + 32))  # layers × r × (in + out) for q_proj and v_proj
    assert lora_params(size, peft) == adapters
    assert row["gradients"] == 4 * adapters and row["optimiser"] == 8 * adapters
    assert row["parameters"] == 4 * size.params + 4 * adapters


@pytest.mark.slow  # `agentcap plan` in subprocesses
def test_the_command_names_the_largest_term_when_it_does_not_fit(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(recipe(tmp_path)))
    args = ["--config", str(config), "--root", str(tmp_path)]
    fits = subprocess.run([sys.executable, "-m", "agentcap.cli", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # registered as a subcommand
    assert fits.returncode == 0, fits.stderr
    assert "| sft | policy | 0–3 |" in fits.stdout and "| eval | - | 0–3 |" in fits.stdout
    assert plan_command([*args, "--device-memory", "1e-4"]) == 2
    out, err = capsys.readouterr()
    assert "NO: largest term" in out
    assert err.count("\n") == 1 and "stage sft does not fit the device:" in err and "GiB per rank > 0.0001 GiB" in err
    assert plan_command([*args, "--root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert ".model: " in err and "config.json not found" in err


def test_a_served_judge_holds_nothing_in_the_ranks(tmp_path):
    config = recipe(tmp_path)
    kwargs = config["model"]["env"]["kwargs"]
    loaded = plan(config, str(tmp_path))[0]["judge"]
    kwargs["temporal_examiner"] = {"url": "http://127.0.0.1:8000/v1", "model": "examiner"}
    assert plan(config, str(tmp_path))[0]["judge"] == loaded > 0  # only the loaded examiner counts
    kwargs["examiner"] = {"url": "http://127.0.0.1:8000/v1", "model": "examiner"}
    assert plan(config, str(tmp_path))[0]["judge"] == 0


def test_every_paper_recipe_plans_from_the_shipped_stand_ins():
    for name in ("read", "audiomap", "acecap"):
        config = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
        rows = plan(config, str(ROOT / "tools" / "plan_models"))
        assert rows and all(r["ranks"] == 8 and r["sharded"] for r in rows), name
        assert all(0 < r["total"] < 1000 * GIB for r in rows)
        if name != "read":  # READ's GPT-2 coherence scorer is loaded; the 27B judges are served
            assert all(r["judge"] == 0 for r in rows), name


# --- vLLM engines and host memory --------------------------------------------------------------
DEVICE_GIB = 0.01  # a device of 10.24 MiB: the tiny engines take a visible share of it


def two_engines(tmp_path: Path, shares=(0.3, 0.2)) -> dict:
    """policy (Qwen2, fp32 learner, bf16 engine) and other (GPT-2, bf16 learner, engine dtype auto)."""
    engine = {"enable_sleep_mode": True}
    return {
        "trainer": {"devices": 4, "strategy": "grpo_fsdp", "precision": "bf16-mixed"},
        "model": {
            "env": {"id": "x", "kwargs": {"mode": "game"}},
            "agents": {
                "policy": {"model": folder(tmp_path, "policy", QWEN2), "dtype": "float32", "backend": "vllm",
                           "vllm": {**engine, "dtype": "bfloat16", "gpu_memory_utilization": shares[0]}},
                "other": {"model": folder(tmp_path, "other", GPT2), "dtype": "bfloat16", "backend": "vllm",
                          "vllm": {**engine, "gpu_memory_utilization": shares[1]}},
            },
            "minibatch_size": 4, "generation_batch_size": 4,
            "stages": [
                {"name": "warm", "kind": "sft", "agent": "policy"},     # no rollout: no engine built yet
                {"name": "eval", "kind": "evaluate"},                   # the game: both act
                {"name": "grpo", "kind": "grpo", "agent": "policy", "env": {"mode": "policy"}},  # other: used next
                {"name": "eval2", "kind": "evaluate"},
                {"name": "tune", "kind": "sft", "agent": "other"},      # nobody acts; other trains
                {"name": "replay", "kind": "grpo", "agent": "other", "env": {"mode": "other"},
                 "harvest": {"mode": "game"}},                          # the harvest plays both first
                {"name": "final", "kind": "evaluate"},
            ],
        },
    }


def test_engines_awake_and_asleep_by_stage_with_host_memory_per_node(tmp_path):
    residual = 0.001  # GiB a sleeping engine keeps
    rows = plan(two_engines(tmp_path), str(tmp_path), device_gib=DEVICE_GIB, ranks_per_node=2, sleeping_gib=residual)
    # by hand: Qwen2 block = q 64·64 + k 64·32 + v 64·32 + o 64·64 + gate, up, down 3·64·128 + norms 2·64
    # + biases (4 + 2·2)·16 = 37,120; × 3 layers + embeddings and head 2·1000·64 + final norm 64 = 239,424.
    # GPT-2 block = 4·32² + 2·32·128 + 9·32 + 128 = 12,704; × 2 + tokens 300·32 + positions 64·32 + final
    # norm 2·32 = 37,120 (tied head)
    n_policy, n_other = 239_424, 37_120
    assert model_size(str(tmp_path / "policy"), "p").params == n_policy
    assert model_size(str(tmp_path / "other"), "o").params == n_other
    device = DEVICE_GIB * GIB
    reserve = {"policy": 0.3 * device, "other": 0.2 * device}
    weights = {"policy": 2 * n_policy, "other": 2 * n_other}  # both engines bf16 (other: auto = its bf16 learner)
    specs = rows[0]["specs"]
    for role in ("policy", "other"):
        assert specs[role].weights == weights[role] and specs[role].reserve == pytest.approx(reserve[role])
        assert specs[role].kv_cache == pytest.approx(reserve[role] - weights[role])
    A = "awake"
    assert [r["states"] for r in rows] == [
        {},                                  # warm: engines are built at their first rollout
        {"policy": A, "other": A},           # eval
        {"policy": A, "other": 1},           # grpo: other is used again (eval2) before it trains: level 1
        {"policy": A, "other": A},           # eval2
        {"policy": 1, "other": 2},           # tune: other trains now (level 2), policy is used in final (level 1)
        {"policy": 1, "other": A},           # replay: the harvest woke policy, then it sleeps again (final uses it)
        {"policy": A, "other": A},           # final
    ]
    warm, evaluate, grpo, eval2, tune, replay, final = rows
    asleep = residual * GIB
    assert warm["engines"] == 0 and warm["engine copies"] == 0
    assert evaluate["engines"] == pytest.approx(reserve["policy"] + reserve["other"]) and evaluate["engine copies"] == 0
    assert grpo["engines"] == pytest.approx(reserve["policy"] + asleep) and grpo["engine copies"] == weights["other"]
    # level 2 keeps nothing on the host, level 1 the bf16 weights; both leave `residual` on the device
    assert tune["engines"] == pytest.approx(2 * asleep) and tune["engine copies"] == weights["policy"]
    # the device holds the harvest's two awake engines, the host the copy of the engine that sleeps after it
    assert replay["engines"] == pytest.approx(reserve["policy"] + reserve["other"])
    assert replay["engine copies"] == weights["policy"]
    assert all(r["kv cache"] == 0 for r in rows)  # the engines hold the rollout's KV cache, not HF generate
    loading = (4 * n_policy + 2 * n_other) / 4  # 1/N of each agent in its learner dtype
    for row in rows:
        assert row["loading"] == loading
        assert row["host"] == row["engine copies"] + loading
        assert row["host per node"] == 2 * row["host"]  # two ranks per node
    assert grpo["host per node"] == 2 * (2 * 37_120 + (4 * 239_424 + 2 * 37_120) / 4)
    learner = sum(grpo[k] for k in ("parameters", "gradients", "optimiser", "frozen agents", "judge",
                                    "gathered blocks", "activations"))
    assert grpo["total"] == pytest.approx(learner + grpo["engines"])


def test_an_engine_without_sleep_mode_stays_awake_and_an_adapter_engine_keeps_its_base(tmp_path):
    config = two_engines(tmp_path)
    config["model"]["agents"]["other"]["vllm"]["enable_sleep_mode"] = False
    config["model"]["agents"]["policy"]["peft"] = {"r": 4}
    rows = plan(config, str(tmp_path), device_gib=DEVICE_GIB)
    assert rows[2]["states"] == {"policy": "awake", "other": "awake"}
    assert rows[4]["states"] == {"policy": 1, "other": "awake"}  # an adapter engine sleeps at level 1 at most


def test_roles_on_a_shared_base_count_one_engine(tmp_path):
    """share_base_with a vLLM role, through vLLM: one engine holds the base once (an adapter per role),
    awake while either role acts; the shared role's rollouts ahead are its adapter's, on the host."""
    config = two_engines(tmp_path)
    agents = config["model"]["agents"]
    agents["policy"]["peft"] = {"r": 4}
    agents["other"] = {"model": agents["policy"]["model"], "share_base_with": "policy", "peft": {"r": 4}, "backend": "vllm"}
    config["model"]["max_staleness"] = 1
    rows = plan(config, str(tmp_path), device_gib=DEVICE_GIB)
    specs = rows[0]["specs"]
    assert list(specs) == ["policy"] and specs["policy"].roles == ("policy", "other")
    assert specs["policy"].weights == 2 * 239_424  # the bf16 base, once
    # the replay stage trains `other` alone (mode other) through the shared engine: awake, no KV cache of HF
    replay = rows[5]
    assert replay["states"] == {"policy": "awake"} and replay["kv cache"] == 0 and replay["rollouts ahead"] == 0
    assert rows[2]["states"] == {"policy": "awake"}  # grpo of policy in mode policy


def test_the_plan_follows_the_modules_engine_policy_on_the_recipe(tmp_path):
    """plan_engines mirrors agentcap.training.engines without importing it: the same acting roles and
    the same sleep level for every engine that goes to sleep, stage by stage, on ACE-Cap."""
    from agentcap.core.schedule import Stage
    from agentcap.rollout.splits import EnvConfig
    from agentcap.training import engines as runtime

    config = yaml.safe_load((ROOT / "configs" / "acecap.yaml").read_text())
    model = config["model"]
    roles, env = list(model["agents"]), EnvConfig(**model["env"])
    stages = [Stage(**stage) for stage in model["stages"]]
    uses = [runtime.acting_roles(stage, env, roles) for stage in stages]
    assert uses == [acting_roles(stage, roles, model["env"]["kwargs"]) for stage in model["stages"]]
    rows = plan(config, str(ROOT / "tools" / "plan_models"))
    before: dict = {}
    for index, row in enumerate(rows):
        levels = runtime.sleep_levels(stages, index, uses, roles)
        for role, state in row["states"].items():
            if state == "awake":
                assert levels[role] == 0, (row["stage"], role)
            elif before.get(role) == "awake" or role in row["harvest awake"]:  # goes to sleep in this stage
                assert levels[role] == state, (row["stage"], role)
        before = row["states"]
    assert {1, 2} <= {s for row in rows for s in row["states"].values()}  # both levels occur


def test_acting_roles_follow_the_mode_and_the_stages_agent():
    roles = ["captioner", "composer", "instruct"]
    assert acting_roles({"kind": "sft", "agent": "composer"}, roles, {}) == set()
    assert acting_roles({"kind": "evaluate"}, roles, {"mode": "game"}) == set(roles)
    assert acting_roles({"kind": "grpo", "agent": "captioner", "env": {"mode": "captioner"}}, roles, {}) == {"captioner"}
    assert acting_roles({"kind": "grpo", "agent": "composer", "env": {"mode": "instruct"}}, roles, {}) == {
        "composer", "instruct"}  # a GRPO stage's own agent always acts
    replay = {"kind": "grpo", "agent": "instruct", "env": {"mode": "instruct"}, "harvest": {"mode": "game"}}
    assert acting_roles(replay, roles, {}) == {"instruct"} and harvest_roles(replay, roles, {}) == set(roles)


def test_engine_defaults_are_the_backends():
    from agentcap.agents.backends.base import VLLMOptions

    defaults = VLLMOptions()
    assert ENGINE_DEFAULTS == {key: getattr(defaults, key) for key in ENGINE_DEFAULTS}


def refused(tmp_path: Path, capsys, config: dict, *extra: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert plan_command(["--config", str(path), "--root", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_a_recipe_that_cannot_fit_is_refused_naming_the_stage(tmp_path, capsys):
    device = ["--device-memory", str(DEVICE_GIB), "--prompt-tokens", "8", "--sleeping-engine", "1e-4"]
    assert "stage eval does not fit the device" in refused(tmp_path, capsys, two_engines(tmp_path, (0.5, 0.5)), *device)
    err = refused(tmp_path, capsys, two_engines(tmp_path), *device, "--host-memory", "1e-6")
    assert "stage warm does not fit the host" in err and "GiB per node > 1e-06 GiB" in err and "4 ranks ×" in err
    err = refused(tmp_path, capsys, two_engines(tmp_path, (0.3, 1e-4)), *device)
    assert "agents.other.vllm.gpu_memory_utilization 0.0001 reserves" in err and "no room for a KV cache" in err


def test_memory_plan_doc_is_what_the_command_prints(capsys):
    """docs/memory-plan.md is generated (tools/gen_memory_plan.py): every recipe's section is the command's output."""
    doc = (ROOT / "docs" / "memory-plan.md").read_text()
    spec = importlib.util.spec_from_file_location("gen_memory_plan", ROOT / "tools" / "gen_memory_plan.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    for name, extra, _ in generator.RECIPES:  # the recipes as written, and ACE-Cap with rollouts on GPUs of their own
        config = f"configs/{name}.yaml"
        assert plan_command(["--config", str(ROOT / config), "--root", str(ROOT / "tools" / "plan_models"), *extra]) == 0
        out = capsys.readouterr().out.replace(str(ROOT / config), config)
        assert out in doc, f"docs/memory-plan.md is stale for {config}: run python tools/gen_memory_plan.py"
