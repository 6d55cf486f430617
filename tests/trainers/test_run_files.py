"""What a run leaves beside its model: episode settings read back by evaluation, eval_results.json, trl-multiturn's
model card (and the folder push_to_hub would upload), learning curves drawn from the trainer's logs."""

import dataclasses
import functools
import json
import shutil

import pytest
from conftest import tiny_rl_args
from datasets import Dataset
from transformers import TrainerCallback

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer
from trl_multiturn.envs import TextWorldEnv
from trl_multiturn.episode_settings import saved_rules
from trl_multiturn.evaluation import evaluate
from trl_multiturn.rollout.rules import EpisodeRules

pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

SYSTEM_PROMPT = "Reply with one command."


class LogRecorder(TrainerCallback):
    """Stands for a `report_to` integration: those are callbacks that receive `on_log`."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


@pytest.fixture(scope="module")
def trained_run(tiny_chatml_model, textworld_train_tasks, textworld_games_dir, tmp_path_factory):
    """Two GRPO steps (beta > 0, so KL is logged) on TextWorld, saved, then a held-out evaluation recorded."""
    out = tmp_path_factory.mktemp("run") / "tiny-grpo"
    args = tiny_rl_args(MultiTurnGRPOConfig, out, beta=0.1, max_turns=2, max_completion_length=6,
                        max_episode_tokens=900, system_prompt=SYSTEM_PROMPT, action_parser="whole_reply",
                        reward_mode="dense", advantage_estimator="turn_grpo")
    recorder = LogRecorder()
    factory = functools.partial(TextWorldEnv, games_dir=str(textworld_games_dir))
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, environment_factory=factory,
                                   train_dataset=textworld_train_tasks, callbacks=[recorder])
    trainer.train()
    trainer.save_model(str(out))
    rules = EpisodeRules(max_turns=2, max_completion_length=6, system_prompt=SYSTEM_PROMPT,
                         action_parser="whole_reply")
    result = evaluate(trainer.model, factory, textworld_train_tasks, trainer.processing_class, rules=rules,
                      progress=False)
    trainer.record_evaluation(result, split="train")
    return {"trainer": trainer, "out": out, "result": result, "recorder": recorder, "base": tiny_chatml_model}


def test_episode_settings_are_saved_with_the_model(trained_run):
    saved = json.loads((trained_run["out"] / "episode_settings.json").read_text())
    assert saved["system_prompt"] == SYSTEM_PROMPT and saved["action_parser"] == "whole_reply"
    assert (saved["max_turns"], saved["max_completion_length"], saved["max_episode_tokens"]) == (2, 6, 900)
    env = saved["environment"]
    assert env["name"] == "textworld" and env["class"].endswith(":TextWorldEnv")
    assert env["settings"]["games_dir"] == trained_run["trainer"].environment_factory.keywords["games_dir"]


def test_checkpoints_carry_episode_settings(tiny_chatml_model, textworld_train_tasks, textworld_games_dir,
                                            tmp_path):
    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path, max_steps=1, max_turns=2, save_strategy="steps",
                        save_steps=1, system_prompt="checkpointed")
    trainer = MultiTurnGRPOTrainer(model=tiny_chatml_model, args=args, train_dataset=textworld_train_tasks,
                                   environment_factory=lambda: TextWorldEnv(games_dir=str(textworld_games_dir)))
    trainer.train()
    saved = json.loads((tmp_path / "checkpoint-1" / "episode_settings.json").read_text())
    assert saved["system_prompt"] == "checkpointed" and saved["max_turns"] == 2
    assert saved["environment"]["class"].endswith("<lambda>")  # a lambda's settings cannot be known
    card = (tmp_path / "README.md").read_text()  # TRL writes the card with each checkpoint: ours
    assert "trained with multi-turn GRPO" in card and "fine-tuned version of [None]" not in card


def test_evaluate_reads_the_saved_rules_and_explicit_rules_win(trained_run, textworld_train_tasks):
    out = str(trained_run["out"])
    result = evaluate(out, None, textworld_train_tasks, progress=False)  # the environment comes from the file too
    played = result.settings
    assert (played["system_prompt"], played["action_parser"], played["max_turns"]) == (
        SYSTEM_PROMPT, "whole_reply", 2)
    assert all(ep.prompt_messages[0] == {"role": "system", "content": SYSTEM_PROMPT} for ep in result.episodes)
    assert all(ep.num_turns <= 2 for ep in result.episodes)
    assert all(len(ep.completion_ids) > 0 for ep in result.episodes)
    rules = dataclasses.replace(saved_rules(out), max_turns=1, system_prompt="other")
    override = evaluate(out, None, textworld_train_tasks.select([0]), rules=rules, progress=False)
    assert override.settings["max_turns"] == 1 and override.episodes[0].num_turns == 1
    assert override.episodes[0].prompt_messages[0]["content"] == "other"


def test_eval_results_are_written_and_logged(trained_run):
    result, out = trained_run["result"], trained_run["out"]
    record = json.loads((out / "eval_results.json").read_text())
    summary = record["summary"]
    assert summary["n"] == len(result.episodes) == 2 and record["split"] == "train"
    assert summary["successes"] == sum(ep.won for ep in result.episodes)
    assert summary["ci_low"] <= summary["success_rate"] <= summary["ci_high"]
    assert summary["mean_return"] == pytest.approx(sum(sum(ep.turn_rewards) for ep in result.episodes) / 2)
    assert summary["mean_turns"] == pytest.approx(sum(ep.num_turns for ep in result.episodes) / 2)
    # Per complexity: both games are w2-o3-q4.
    assert summary["by_quest_length"]["4"]["n"] == 2 and summary["by_world_size"]["2"]["n"] == 2
    outcomes = record["outcomes"]
    assert [o["task"]["seed"] for o in outcomes] == [ep.task["seed"] for ep in result.episodes]
    assert [o["won"] for o in outcomes] == [ep.won for ep in result.episodes]
    assert record["settings"]["system_prompt"] == SYSTEM_PROMPT
    logged = [log for log in trained_run["recorder"].logs if "heldout/success_rate" in log]
    assert logged and logged[-1]["heldout/n"] == 2.0
    assert logged[-1]["heldout/success_rate"] == pytest.approx(summary["success_rate"])


def test_model_card_names_base_environment_algorithm_and_results(trained_run):
    from huggingface_hub import ModelCard

    card = ModelCard.load(trained_run["out"] / "README.md")
    text = card.text
    assert "fine-tuned version of [None]" not in card.content
    assert f"a local model (`{trained_run['base']}`)" in text  # the tiny model has no Hub id
    assert "multi-turn GRPO" in text and "`MultiTurnGRPOTrainer`" in text
    assert "| environment | `textworld` |" in text
    assert "| reward_mode | `dense` |" in text and "| advantage_estimator | `turn_grpo` |" in text
    assert f"| system_prompt | `{SYSTEM_PROMPT}` |" in text and "| max_turns | `2` |" in text
    summary = trained_run["result"].summary()
    assert "## Evaluation" in text
    assert f"| all | {summary['success_rate']:.1%} |" in text and "| quest_length=4 |" in text
    assert {"trl-multiturn", "grpo", "textworld"} <= set(card.data.tags)


def test_base_model_is_named_for_the_offline_default_and_for_our_checkpoints(trained_run, tmp_path, monkeypatch):
    from trl_multiturn.model_card import base_model_name

    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(tmp_path))
    offline = shutil.copytree(trained_run["base"], tmp_path / "smollm2-135m-instruct")
    assert base_model_name(str(offline)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_name("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    # A checkpoint trained from the offline default names it in its card; one trained from that checkpoint too.
    card = (trained_run["out"] / "README.md").read_text()
    warm_start = tmp_path / "warm_start"
    warm_start.mkdir()
    (warm_start / "README.md").write_text(card.replace("library_name:", "base_model: HuggingFaceTB/SmolLM2-135M-"
                                                                        "Instruct\nlibrary_name:", 1))
    assert base_model_name(str(warm_start)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_name(trained_run["base"]) is None  # a bare local folder says nothing
    # The card of a trainer that loads the offline default from its local folder names SmolLM2 on the Hub.
    from huggingface_hub import ModelCard

    args = tiny_rl_args(MultiTurnGRPOConfig, tmp_path / "from-offline")
    trainer = MultiTurnGRPOTrainer(model=str(offline), args=args, environment_factory=TextWorldEnv,
                                   train_dataset=Dataset.from_list([{"game_file": "unused"}]))
    trainer.create_model_card()
    card = ModelCard.load(tmp_path / "from-offline" / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "fine-tuned version of [HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/" in card.text
    (warm_start / "README.md").write_text("---\nbase_model: [\n---\nbroken metadata")
    assert base_model_name(str(warm_start)) is None


def test_push_to_hub_uploads_the_card_settings_and_results(trained_run, monkeypatch):
    import transformers.trainer

    trainer, out = trained_run["trainer"], trained_run["out"]
    uploads = []

    class FakeApi:
        def upload_folder(self, **kwargs):
            uploads.append(kwargs)

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: FakeApi())
    monkeypatch.setattr(trainer, "hub_model_id", "someone/tiny-grpo", raising=False)
    trainer.push_to_hub()
    [upload] = uploads
    assert upload["folder_path"] == str(out) and upload["repo_id"] == "someone/tiny-grpo"
    uploaded = {p.name for p in out.iterdir() if not p.name.startswith("_") and not p.name.startswith("checkpoint-")}
    assert {"README.md", "episode_settings.json", "eval_results.json", "config.json", "model.safetensors",
            "trainer_state.json"} <= uploaded
    card = (out / "README.md").read_text()
    assert "trl-multiturn eval --model_name_or_path someone/tiny-grpo --num_eval_games" in card
    assert "## Evaluation" in card


def test_plot_draws_the_logged_curves_of_several_runs(trained_run, tmp_path):
    from trl_multiturn.commands.cli import main
    from trl_multiturn.plotting import heldout_points, log_curves, plot_runs

    out = trained_run["out"]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    curves = log_curves(history)
    assert {"episodes/success_rate", "episodes/mean_return", "episodes/mean_turns", "kl", "entropy"} <= set(curves)
    assert curves["kl"][0] == [1, 2]
    second = tmp_path / "second"
    (second / "checkpoint-2").mkdir(parents=True)  # a run read from its latest checkpoint
    shutil.copy(out / "trainer_state.json", second / "checkpoint-2" / "trainer_state.json")
    fig = plot_runs([out, second], tmp_path / "curves.png")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss", "success rate", "mean return", "mean turns", "KL", "entropy"]
    kl_lines = fig.axes[4].get_lines()
    assert len(kl_lines) == 2 and list(kl_lines[0].get_ydata()) == curves["kl"][1]
    # The held-out evaluation kept in `out` is one star at the last step (its file and, once the state is saved
    # again, its log record: the same point, drawn once).
    summary = trained_run["result"].summary()
    last = max(rec["step"] for rec in history if "step" in rec)
    assert heldout_points(out, history) == ([last], [summary["success_rate"]])
    stars = [line for line in fig.axes[1].get_lines() if line.get_marker() == "*"]
    assert stars and list(stars[0].get_ydata()) == [summary["success_rate"]]
    assert list(stars[0].get_xdata()) == [last]
    # A run that never logged KL (beta 0) or success (SFT) gets no such panel.
    third = tmp_path / "sft-like"
    third.mkdir()
    (third / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 1, "loss": 2.0, "entropy": 1.5}, {"step": 2, "loss": 1.0, "entropy": 1.4}]}))
    assert [ax.get_title() for ax in plot_runs([third], tmp_path / "sft.png").axes] == ["loss", "entropy"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(out), str(second), "-o", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")


def test_card_names_the_lineage_an_adapter_and_the_model_index(trained_run, tmp_path, monkeypatch):
    """A model trained from a trl-multiturn checkpoint names that stage (and the stages before it) in its card's
    text and `lineage` metadata; a folder holding a LoRA adapter says `library_name: peft`; the held-out results
    are the `model-index`; paths inside the cache are written relative to it."""
    from huggingface_hub import ModelCard

    from trl_multiturn.model_card import build_model_card

    trainer, parent = trained_run["trainer"], trained_run["out"]
    parent_card = ModelCard.load(parent / "README.md")
    summary = trained_run["result"].summary()
    [index] = parent_card.data.eval_results
    assert (index.metric_type, index.metric_value) == ("success_rate", pytest.approx(summary["success_rate"]))
    assert (index.dataset_type, index.dataset_split) == ("textworld", "train")
    assert parent_card.data.lineage == [{"model": parent.name, "algorithm": "GRPO", "steps": 2}]
    assert parent_card.data.library_name == "transformers"

    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(tmp_path / "cache"))
    child = tmp_path / "child"
    child.mkdir()
    (child / "adapter_config.json").write_text("{}")
    settings = {**trainer.episode_settings(),
                "environment": {"name": "textworld", "settings": {"games_dir": str(tmp_path / "cache" / "games")}}}
    card = build_model_card(model_name="child", trainer_name="MultiTurnRLOOTrainer", base_model=None,
                            local_base=str(parent), args=trainer.args, settings=settings, global_step=5,
                            folder=str(child))
    assert card.data.library_name == "peft"
    assert card.data.lineage == [{"model": parent.name, "algorithm": "GRPO", "steps": 2},
                                 {"model": "child", "algorithm": "RLOO", "steps": 5}]
    assert f"through GRPO (`{parent.name}`, 2 steps), trained with multi-turn RLOO as a LoRA adapter" in card.text
    assert "'games_dir': '<cache>/games'" in card.text and str(tmp_path) not in card.text
    assert card.data.eval_results is None  # nothing evaluated in the child's folder yet


def test_card_names_the_training_tasks_and_the_starting_models_score(trained_run, tmp_path):
    """The card says which tasks the model trained on (their number and kinds) and, when the start played the same
    held-out tasks first (`eval_start_model`), its score beside the trained model's."""
    from huggingface_hub import ModelCard

    from trl_multiturn.model_card import START_EVAL_RESULTS_FILE, update_card_evaluation

    text = ModelCard.load(trained_run["out"] / "README.md").text
    tasks = trained_run["trainer"].episode_settings()["tasks"]
    assert f"| training tasks | {tasks['num_tasks']} tasks (`" in text and "quest_length=4" in text
    assert "The starting model" not in text  # this run did not evaluate its start
    folder = shutil.copytree(trained_run["out"], tmp_path / "run")
    trained_run["result"].save(folder, START_EVAL_RESULTS_FILE, model="outputs/start")
    assert update_card_evaluation(folder)
    text = ModelCard.load(folder / "README.md").text
    summary = trained_run["result"].summary()
    assert (f"The starting model (`outputs/start`) on the same held-out tasks before training: "
            f"{summary['successes']}/{summary['n']} won") in text
