"""Model set-ups from a recipe or the command line (TRL's ModelConfig: LoRA, dtype), and chat templates that rewrite
history (Qwen3's), fixed by a setting."""

import json
from pathlib import Path

import pytest
import torch
import trl
from conftest import tiny_rl_args
from datasets import Dataset
from rollout_checks import assert_env_mask_exact, assert_token_exact
from toy_envs import CountingEnv

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.commands.cli import main, trainer_parser
from trl_multiturn.evaluation import evaluate
from trl_multiturn.model_setup import model_setup_kwargs
from trl_multiturn.rollout.chat_tokens import ChatTemplateError
from trl_multiturn.rollout.rules import EpisodeRules
from trl_multiturn.testing import build_tiny_model

QWEN3_TRAINING = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
TASKS = [{"target": 2}, {"target": 1}]


def _train_argv(model, games_dir, out, *extra):
    return ["--model_name_or_path", model, "--output_dir", str(out), "--world_size", "2", "--nb_objects", "3",
            "--quest_length", "4", "--num_train_games", "2", "--num_eval_games", "0", "--games_dir", str(games_dir),
            "--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_turns", "2",
            "--max_completion_length", "8", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true", "--remove_unused_columns", "false", *extra]


def test_cli_use_peft_trains_a_lora_adapter(tiny_chatml_model, textworld_games_dir, tmp_path):
    from peft import PeftModel

    from trl_multiturn.commands.env_tasks import train_on_env

    lora = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    script_args, env_args, training_args, model_args = trainer_parser("grpo").parse_args_and_config(
        args=_train_argv(tiny_chatml_model, textworld_games_dir, tmp_path / "api", *lora))
    trainer = train_on_env(MultiTurnGRPOTrainer, script_args, env_args, training_args, model_args)
    assert isinstance(trainer.model, PeftModel)
    config = trainer.model.peft_config["default"]
    assert config.r == 4 and config.lora_alpha == 8 and set(config.target_modules) == {"q_proj", "v_proj"}
    assert trainer.state.global_step == 1
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    # The command: the saved model is the adapter, with the rank asked for.
    out = tmp_path / "cli"
    assert main(["train", "grpo", *_train_argv(tiny_chatml_model, textworld_games_dir, out, *lora)]) == 0
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize("flag,dtype", [("--torch_dtype", torch.bfloat16), ("--dtype", torch.bfloat16),
                                        (None, torch.float32)])
def test_the_dtype_asked_for_reaches_the_model(tiny_chatml_model, textworld_games_dir, tmp_path, flag, dtype):
    extra = [flag, "bfloat16"] if flag else []
    _, _, training_args, model_args = trainer_parser("grpo").parse_args_and_config(
        args=_train_argv(tiny_chatml_model, textworld_games_dir, tmp_path, *extra))
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=training_args, environment_factory=CountingEnv,
                                   train_dataset=Dataset.from_list(TASKS),
                                   **model_setup_kwargs(model_args, training_args))
    assert trainer.model.dtype == dtype
    assert training_args.model_init_kwargs["dtype"] == str(dtype).removeprefix("torch.")


@pytest.fixture(scope="module")
def tiny_qwen3_model(tmp_path_factory):
    """A tiny model with Qwen3's template, which strips earlier turns' reasoning (rewrites history)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), template="qwen3")


def _qwen3_trainer(model, tmp_path, **overrides):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=2, **overrides)
    return MultiTurnGRPOTrainer(model=model, args=args, environment_factory=CountingEnv,
                                train_dataset=Dataset.from_list(TASKS))


def test_a_template_that_rewrites_history_is_refused_without_the_setting(tiny_qwen3_model, tmp_path):
    with pytest.raises(ChatTemplateError, match="use_training_chat_template"):
        _qwen3_trainer(tiny_qwen3_model, tmp_path, use_training_chat_template=False)


@pytest.mark.parametrize("setting", [{}, {"chat_template_path": str(QWEN3_TRAINING),
                                          "use_training_chat_template": False}])
def test_with_the_setting_it_trains_token_exactly(tiny_qwen3_model, tmp_path, caplog, setting):
    trainer = _qwen3_trainer(tiny_qwen3_model, tmp_path, **setting)
    assert trainer.processing_class.chat_template == QWEN3_TRAINING.read_text()
    if not setting:
        assert "switched to TRL's training version" in caplog.text
    trainer.train()
    assert trainer.state.global_step == 1
    result = evaluate(trainer.model, CountingEnv, TASKS, trainer.processing_class, progress=False,
                      rules=EpisodeRules(max_turns=2, max_completion_length=6, action_parser="whole_reply"))
    for episode in result.episodes:
        assert_token_exact(trainer.model, episode)
        assert_env_mask_exact(trainer.processing_class, episode)
    trainer.save_model(str(tmp_path / "saved"))
    saved = (tmp_path / "saved" / "chat_template.jinja").read_text()
    assert saved == QWEN3_TRAINING.read_text()  # evaluation of the saved model plays with the template it trained with


def test_sft_switches_a_history_rewriting_template_too(tiny_qwen3_model, tmp_path):
    from trl_multiturn import MultiTurnSFTConfig, MultiTurnSFTTrainer

    episodes = Dataset.from_list([{"messages": [{"role": "user", "content": "Count to 2."},
                                                {"role": "assistant", "content": "one"},
                                                {"role": "user", "content": "Observation number 1."},
                                                {"role": "assistant", "content": "two"}]}] * 2)

    def args(**overrides):
        return MultiTurnSFTConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, use_cpu=True,
                                  bf16=False, report_to="none", save_strategy="no", max_length=None, **overrides)

    with pytest.raises(ChatTemplateError, match="use_training_chat_template"):
        MultiTurnSFTTrainer(tiny_qwen3_model, args=args(use_training_chat_template=False), train_dataset=episodes)
    trainer = MultiTurnSFTTrainer(tiny_qwen3_model, args=args(), train_dataset=episodes)
    assert trainer.processing_class.chat_template == QWEN3_TRAINING.read_text()
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.parametrize("example", ["textworld_grpo", "textworld_rloo", "textworld_ppo", "textworld_sft",
                                     "textworld_tools", "swegym_grpo", "alfworld_grpo"])
def test_the_examples_parse_the_model_setup(example, tmp_path, monkeypatch):
    import inspect
    import runpy

    from trl import TrlParser

    from trl_multiturn.model_setup import ModelSetup

    monkeypatch.chdir(tmp_path)
    module = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / f"{example}.py"), run_name="x")
    classes = [p.annotation for p in inspect.signature(module["main"]).parameters.values()]
    assert ModelSetup in classes
    parsed = TrlParser(tuple(classes)).parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--use_peft", "--lora_r", "4", "--torch_dtype",
         "bfloat16"])
    [model_args] = [x for x in parsed if isinstance(x, ModelSetup)]
    assert model_args.use_peft and model_args.lora_r == 4 and model_args.dtype == "bfloat16"


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("omp,local_world_size,asked,expected", [
    (None, None, None, lambda cores: cores),  # nothing set: every core this process may use
    ("1", None, None, lambda cores: 1),  # OMP_NUM_THREADS=1 is respected: never more threads than it
    (None, "2", None, lambda cores: max(1, cores // 2)),  # two processes on this machine share its cores
    ("64", None, None, lambda cores: cores),  # OMP_NUM_THREADS caps the default, never raises it
    ("1", None, 2, lambda cores: 2),  # the user's number wins
])
def test_a_cpu_run_uses_the_cores_it_may(torch_threads, monkeypatch, omp, local_world_size, asked, expected):
    import os

    from trl_multiturn.model_setup import ModelSetup

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    torch.set_num_threads(len(os.sched_getaffinity(0)) + 1)  # a count no case expects: the call must set it
    model_setup_kwargs(ModelSetup(cpu_threads=asked), MultiTurnGRPOConfig(output_dir="unused", use_cpu=True))
    assert torch.get_num_threads() == expected(len(os.sched_getaffinity(0)))


def test_cpu_threads_below_one_is_refused():
    from trl_multiturn.model_setup import ModelSetup

    with pytest.raises(ValueError, match=r"ModelSetup\.cpu_threads=0: give .*>= 1"):
        ModelSetup(cpu_threads=0)
