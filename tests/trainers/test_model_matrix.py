"""The model-family conformance matrix (trl_multiturn/trainers/model_matrix.py over trl_multiturn/model_families.py):
every family of the table is exact or refused in one line on every path, the default path is exact for all of
them, the refusals follow the layer types a model has (not a list of names), docs/models.md is the matrix's current
output, and a real rollout and training step per family group hold what the forwards promise."""

import importlib.util
import logging
from pathlib import Path

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from rollout_checks import assert_env_mask_exact, assert_token_exact
from toy_envs import CountingEnv

from trl_multiturn.model_families import FAMILIES, build_model, build_tokenizer, family
from trl_multiturn.trainers.model_matrix import ATOL, COLUMNS, run_matrix
from trl_multiturn.trainers.packing import packing_refusal, sequence_mixer_refusal

ROOT = Path(__file__).resolve().parents[2]

STREAMING_LAYERS = {"Qwen3.5": "Qwen3_5GatedDeltaNet", "Qwen3-Next": "Qwen3NextGatedDeltaNet", "LFM2": "Lfm2ShortConv",
                    "Nemotron-H": "NemotronHMamba2Mixer", "Falcon-H1": "FalconH1Mixer",
                    "GraniteMoeHybrid": "GraniteMoeHybridMambaLayer"}
"""The families whose layers run over the sequence as a stream (the issue's probe measured each inexact in tree-mask
packs), with the layer class that holds their convolution."""
SLIDING = ("Gemma 3", "Gemma 4", "GPT-OSS", "OLMo 3")
"""The families with sliding-window layers: their window (16) is shorter than the matrix's rows (the 24-token prompt
and a reply), so they pack only with the tree mask cut to the window (`packing.WINDOWED_FAMILIES`)."""
ATTENTION_ONLY = tuple(f.name for f in FAMILIES if f.name not in STREAMING_LAYERS)


@pytest.fixture(scope="module")
def matrix():
    return run_matrix()


def test_the_table_holds_every_named_family():
    names = {f.name for f in FAMILIES}
    assert names == set(STREAMING_LAYERS) | set(SLIDING) | {
        "Llama (SmolLM2)", "Qwen3", "Qwen3-MoE", "GLM-4 MoE", "SmolLM3", "DeepSeek-V3", "Phi-4 (mini)"}
    with pytest.raises(ValueError, match="model family 'Qwen9'.*'Qwen3.5'"):
        family("Qwen9")


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_every_cell_is_exact_refused_or_not_supported(matrix, name):
    cells = matrix[name]
    assert list(cells) == list(COLUMNS)
    wrong = {column: str(cell) for column, cell in cells.items() if cell.verdict not in
             ("exact", "refused", "not supported")}
    assert not wrong
    # the default path (and the padded one) is exact for every family, a refusal is one line naming the setting
    assert cells["auto"].verdict == cells["padded"].verdict == "exact"
    for cell in cells.values():
        if cell.verdict == "refused" and "packing" in cell.detail:
            assert "\n" not in cell.detail and cell.detail.endswith("use packing='padded'")


def test_streaming_layers_pack_exactly_by_forking_their_states(matrix):
    """Gated DeltaNet, Mamba2 and short-convolution layers: the shared prefix forwarded once and each branch
    continued from its layer states (`packing_states`), so "prefix", step-wise rows and LoRA are exact, gradients
    included; "auto" pads the matrix's group (its 24-token prompt saves less than the forked forwards cost,
    `packing.fork_cost`); PPO's critic, where transformers builds one from the policy (Qwen3-Next), forks its own
    layer states, its values and their gradients exact."""
    for name in STREAMING_LAYERS:
        cells = matrix[name]
        assert all(cells[column].verdict == "exact" for column in ("prefix", "step-wise", "LoRA")), name
        assert cells["auto"].detail == "padded", name
        assert cells["PPO critic"].verdict in ("exact", "not supported"), name
    assert matrix["Qwen3-Next"]["PPO critic"].verdict == "exact"


def test_attention_only_families_pack_exactly(matrix):
    """The refusal is no wider than it must be: every attention-only family (latent attention, MoE routers, layers
    without positions included) packs, exactly, gradients included."""
    for name in ATTENTION_ONLY:
        cells = matrix[name]
        assert cells["auto"].detail == "packed", name
        assert all(cells[column].verdict == "exact" for column in ("prefix", "step-wise", "LoRA")), name


def test_sliding_window_families_pack_exactly_past_the_window(matrix):
    """Rows longer than the window: the sliding layers see only the window (else they would read the whole row and
    the log-probs would differ from each row's own forward), so "prefix" is exact and "auto" packs."""
    for name in SLIDING:
        assert family(name).options["sliding_window"] < 24, name
        assert name in ATTENTION_ONLY
        assert matrix[name]["prefix"].verdict == "exact" and matrix[name]["auto"].detail == "packed", name


def _script():
    spec = importlib.util.spec_from_file_location("model_matrix_script", ROOT / "scripts" / "model_matrix.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_docs_models_md_is_the_matrix_output(matrix):
    expected = _script().document(matrix, FAMILIES, ATOL)
    assert (ROOT / "docs" / "models.md").read_text() == expected, (
        "docs/models.md is stale: run `python scripts/model_matrix.py --write`")


def test_the_gpu_column_runs_its_entry_on_cpu(capsys):
    """scripts/gpu_check.sh's matrix call (bf16, a column per attention implementation), dry-run on CPU with one
    family: one table, the differences measured per cell, GPT-OSS (eager only) not supported under SDPA."""
    argv = ["--dtype", "float32", "bfloat16", "--attn", "sdpa", "eager", "--families", "Qwen3", "GPT-OSS"]
    assert _script().main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("model matrix on cpu")
    header, _, qwen3, gptoss = out.split("\n\n")[1].splitlines()[:4]
    assert header.count("| template [") == 1 and "| prefix [eager, bfloat16] |" in header
    cells = dict(zip(header.split(" | "), qwen3.split(" | "), strict=True))
    assert cells["prefix [sdpa, float32]"] == "exact" and cells["auto [eager, float32]"] == "exact (packed)"
    assert cells["prefix [sdpa, bfloat16]"].startswith("diff ")
    assert "not supported [1]" in gptoss and "does not support an attention implementation" in out


class _CausalConvMixer(torch.nn.Module):
    """A token mixer of a family the table does not know: a causal depthwise convolution over the sequence."""

    def __init__(self, mlp, hidden):
        super().__init__()
        self.mlp, self.conv = mlp, torch.nn.Conv1d(hidden, hidden, 3, groups=hidden, padding=2)

    def forward(self, x):
        return self.mlp(x) + self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


def test_a_new_family_with_a_convolution_is_refused_by_the_module_it_instantiates():
    """No layer_types tells it apart: the refusal reads the modules the model holds (a Conv1d over the sequence), so
    a family the library never heard of is refused too, by its layer's class."""
    model = build_model(family("Llama (SmolLM2)"))
    assert sequence_mixer_refusal(model) is None
    layer = model.model.layers[1]
    layer.mlp = _CausalConvMixer(layer.mlp, model.config.hidden_size)
    refusal = packing_refusal(model, 8)
    assert refusal.startswith("LlamaForCausalLM (llama) has convolutions in ['_CausalConvMixer']")
    assert refusal.endswith("use packing='padded'")


def test_what_cannot_pack_at_any_length_is_refused_at_start_or_padded_with_one_log_line(caplog):
    """`check_model_packing`, which a trainer calls before anything else: "prefix" raises the one line, "auto" logs
    it once, "padded" says nothing. An attention implementation that ignores the mask counts as a layer type does;
    a sliding window does not (the rows may fit it)."""
    from trl_multiturn.trainers import packing

    model = build_model(family("Qwen3"))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"^packing='prefix': Qwen3ForCausalLM \(qwen3\): "
                                         r"attn_implementation='flash_attention_2'.*use packing='padded'$"):
        packing.check_model_packing(model, "prefix")
    packing._LOGGED_PADDING.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiturn.trainers.packing"):
        for mode in ("auto", "auto", "padded"):
            packing.check_model_packing(model, mode)
    assert caplog.text.count("packing='auto' pads the rows: Qwen3ForCausalLM (qwen3): attn_implementation") == 1
    packing.check_model_packing(build_model(family("Gemma 3")), "prefix")  # sliding_window=16: judged per batch


def test_a_layer_type_the_library_does_not_know_is_refused():
    model = build_model(family("Qwen3"))
    model.config.layer_types = ["full_attention", "chunked_attention", "full_attention", "full_attention"]
    assert "layer_types ['chunked_attention']" in sequence_mixer_refusal(model)


@pytest.mark.parametrize("name", ["Qwen3.5", "LFM2", "Falcon-H1", "DeepSeek-V3", "Gemma 3", "SmolLM3"])
def test_a_rollout_is_token_exact_with_the_familys_template(name):
    """A greedy rollout of the family's model and template (evaluation's, the trainers' rollout): the ids played are
    the argmax of exactly the ids before them, the observations where the template puts them. DeepSeek-V3's
    template opens its generation prompt with <think>, which its rendering of a reply drops: refused at the start."""
    from trl_multiturn.evaluation import evaluate
    from trl_multiturn.rollout.chat_tokens import ChatTemplateError
    from trl_multiturn.rollout.rules import EpisodeRules

    fam = family(name)
    tokenizer = build_tokenizer(fam)
    model = build_model(fam, tokenizer)
    rules = EpisodeRules(max_turns=3, max_completion_length=8, action_parser="whole_reply")
    tasks = [{"target": 3}, {"target": 2}]
    if name == "DeepSeek-V3":
        with pytest.raises(ChatTemplateError, match="'DeepSeek-V3' cannot be extended token-exactly"):
            evaluate(model, CountingEnv, tasks, tokenizer, rules=rules, progress=False)
        return
    result = evaluate(model, CountingEnv, tasks, tokenizer, rules=rules, progress=False)
    assert sum(ep.num_turns for ep in result.episodes) > len(tasks)  # observations were appended
    for episode in result.episodes:
        assert_token_exact(model, episode)
        assert_env_mask_exact(tokenizer, episode)


def _trainer(trainer_name, name, tmp_path, **overrides):
    import trl_multiturn

    kind = {"grpo": "GRPO", "rloo": "RLOO", "ppo": "PPO"}[trainer_name]
    config_cls = getattr(trl_multiturn, f"MultiTurn{kind}Config")
    trainer_cls = getattr(trl_multiturn, f"MultiTurn{kind}Trainer")
    fam = family(name)
    tokenizer = build_tokenizer(fam)
    args = tiny_rl_args(config_cls, tmp_path, max_steps=1, max_turns=2, reward_mode="dense",
                        action_parser="trl_multiturn.rollout.parsing:whole_reply", **overrides)
    return trainer_cls(model=build_model(fam, tokenizer).train(), processing_class=tokenizer, args=args,
                       environment_factory=CountingEnv, train_dataset=Dataset.from_list([{"target": 2}] * 4))


def assert_old_logps_are_the_rows_own(trainer, inputs) -> None:
    """The step's old log-probs of every row equal a forward of that row alone, without padding."""
    rows = [(p[m.bool()].tolist(), c[cm.bool()].tolist()) for p, m, c, cm in
            zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], inputs["completion_mask"])]
    assert any(completion for _, completion in rows)
    policy = getattr(trainer.model, "policy", trainer.model)
    for b, (prompt, completion) in enumerate(rows):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1:-1] / trainer.temperature
        own = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        torch.testing.assert_close(inputs["old_per_token_logps"][b, :len(completion)], own, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("trainer_name", "name"), [("grpo", "Qwen3.5"), ("rloo", "LFM2")])
def test_a_streaming_family_trains_packed_from_forked_states(trainer_name, name, tmp_path, caplog):
    """packing="prefix" on a family with Gated DeltaNet (Qwen3.5) or short-convolution (LFM2) layers: the trainer
    starts without a refusal, its step's old log-probs (forked from the shared prompt's layer states) are those of
    the rows' own forwards, and it trains a step (its rollout generated without the episode-history cache)."""
    from trl_multiturn.trainers import packing

    packing._LOGGED_PADDING.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiturn.trainers.packing"):
        trainer = _trainer(trainer_name, name, tmp_path, packing="prefix", num_iterations=2)
    assert "pads the rows" not in caplog.text
    assert trainer.generation.history_cache is None
    assert_old_logps_are_the_rows_own(trainer, trainer._generate_and_score_completions([{"target": 2}] * 4))
    trainer.train()
    assert trainer.state.global_step == 1


def test_stepwise_ppo_with_a_critic_from_a_latent_attention_policy_packs(tmp_path):
    """DeepSeek-V3 (latent attention, MoE routers; its template refused for the trajectory format, any template
    serves the step-wise one): PPO with the critic built from the policy, packing="prefix", trains a step, and the
    step's old log-probs are those of the rows' own forwards."""
    trainer = _trainer("ppo", "DeepSeek-V3", tmp_path, packing="prefix", num_generations=1, episode_format="stepwise",
                       history="full", num_iterations=2)
    assert_old_logps_are_the_rows_own(trainer, trainer._generate_and_score_completions([{"target": 2}] * 4))
    trainer.train()
    assert trainer.state.global_step == 1


def test_ppo_trains_a_streaming_family_with_its_critic_from_forked_states(tmp_path, monkeypatch):
    """packing="prefix" on Qwen3-Next (Gated DeltaNet; its critic built from the policy, a token-classification
    model with the same layers): the trainer starts without a refusal, the step's old log-probs and the critic's
    values (each model continued from its own forked layer states) are those of each row's own forward, and it trains
    a step whose loss forward forks policy and critic together."""
    from trl_multiturn.trainers import packing
    from trl_multiturn.trainers.value_model import token_values

    outputs = []

    def counted(model, plan, *args, output="policy", **kwargs):
        outputs.append(output)
        return run_forks(model, plan, *args, output=output, **kwargs)

    run_forks = packing.run_forks
    monkeypatch.setattr(packing, "run_forks", counted)
    trainer = _trainer("ppo", "Qwen3-Next", tmp_path, packing="prefix", num_generations=2, num_iterations=2)
    with torch.no_grad():  # a new head values every state at 0: the comparison would be weak (values of order 0.1)
        trainer.unwrapped_critic.score.weight.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    inputs = trainer._generate_and_score_completions([{"target": 2}] * 4)
    # forked: the old log-probs (through the policy-and-critic module), the reference's, the critic's values
    assert outputs.count("policy") == 2 and outputs.count("values") == 1, outputs
    assert_old_logps_are_the_rows_own(trainer, inputs)
    critic, sampled = trainer.unwrapped_critic, (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    assert inputs["old_values"][sampled].abs().sum() > 0
    for b in range(len(sampled)):
        prompt = inputs["prompt_ids"][b][inputs["prompt_mask"][b].bool()]
        completion = inputs["completion_ids"][b][inputs["completion_mask"][b].bool()]
        row = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            own = token_values(critic, row, torch.ones_like(row), len(completion))[0]
        kept = sampled[b, :len(completion)]
        torch.testing.assert_close(inputs["old_values"][b, :len(completion)][kept], own[kept], atol=1e-4, rtol=0)
    outputs.clear()
    trainer.train()
    assert trainer.state.global_step == 1 and "both" in outputs
