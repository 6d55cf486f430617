"""A short run of each trainer and format reproduces the recorded outputs: every tensor the step hands TRL's loss,
every logged metric and loss, and the final weights (`tests/fixtures/step_identity.json`).

The cases cover each path of the step: GRPO and RLOO estimators, PPO's critic credit with 'gae' and 'turn_gae',
the trajectory and step-wise formats (steps left out of the rows among them), packed and padded forwards, a
background rollout under `max_policy_lag`, and an agent's episodes. A change to the step's code that is meant to
keep its maths must keep these numbers; one that changes the maths re-records them on purpose:

    TRL_MULTITURN_RECORD_IDENTITY=1 python -m pytest tests/trainers/test_step_identity.py

Tensors are compared through fingerprints (shape, NaN count, sum, sum of |x| and a sum weighted by a fixed
pattern), weights per parameter, all within a relative 1e-5 (one process's float32 sums, whatever the machine).
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import tiny_rl_args
from datasets import Dataset
from toy_envs import ReplyScoringEnv, openai_loop_agent, reply_characters

import trl_multiturn as tm
from trl_multiturn.agents import AgentEnvironment

FIXTURE = Path(__file__).parents[1] / "fixtures" / "step_identity.json"
RECORD = os.environ.get("TRL_MULTITURN_RECORD_IDENTITY") == "1"
ROWS = [{"turns": 2, "id": i} for i in range(8)]  # 2 tasks x num_generations=2 per step
GOALS = [{"goal": "Go north and open the chest."}] * 2 + [{"goal": "Find the key."}] * 2
CLOCK_KEYS = ("runtime", "per_second", "step_time")  # wall-clock metrics
WHOLE_REPLY = "trl_multiturn.rollout.parsing:whole_reply"


GRPO = (tm.MultiTurnGRPOTrainer, tm.MultiTurnGRPOConfig)
RLOO = (tm.MultiTurnRLOOTrainer, tm.MultiTurnRLOOConfig)
PPO = (tm.MultiTurnPPOTrainer, tm.MultiTurnPPOConfig)
PLAIN = dict(reward_mode="dense", action_parser=WHOLE_REPLY, max_completion_length=6, max_steps=1)
# name: (trainer and config, config overrides, reward_funcs, environment factory, rows)
CASES = {
    "grpo_trajectory_prefix": (GRPO, dict(PLAIN, packing="prefix", beta=0.04), [reply_characters],
                               ReplyScoringEnv, ROWS),
    "grpo_stepwise_padded": (GRPO, dict(PLAIN, packing="padded", episode_format="stepwise",
                                        advantage_estimator="turn_grpo"), None, ReplyScoringEnv, ROWS),
    "rloo_trajectory_prefix": (RLOO, dict(PLAIN, packing="prefix", loss_granularity="turn",
                                          advantage_estimator="turn_rloo"), [reply_characters], ReplyScoringEnv,
                               ROWS),
    "ppo_gae_trajectory_prefix": (PPO, dict(PLAIN, packing="prefix", num_generations=2), [reply_characters],
                                  ReplyScoringEnv, ROWS),
    "ppo_gae_trajectory_padded": (PPO, dict(PLAIN, packing="padded", num_generations=2, beta=0.04), None,
                                  ReplyScoringEnv, ROWS),
    # steps_per_batch=2 leaves some of the 8 steps out of the rows: the critic values them in a pass of their own
    "ppo_turn_gae_stepwise_prefix": (PPO, dict(PLAIN, packing="prefix", episode_format="stepwise",
                                               advantage_estimator="turn_gae", num_generations=2,
                                               steps_per_batch=2, per_device_train_batch_size=2), None,
                                     ReplyScoringEnv, ROWS),
    "ppo_gae_stepwise_padded": (PPO, dict(PLAIN, packing="padded", episode_format="stepwise", num_generations=2),
                                None, ReplyScoringEnv, ROWS),
    "grpo_policy_lag": (GRPO, dict(PLAIN, max_policy_lag=1, max_steps=2), [reply_characters], ReplyScoringEnv,
                        ROWS),
    # greedy (top_k=1): the agents' calls reach the model in batches that depend on thread timing
    "grpo_agent": (GRPO, dict(reward_mode="dense", max_turns=4, max_steps=1, top_k=1), None,
                   AgentEnvironment(openai_loop_agent), GOALS),
}


def fingerprint(tensor: torch.Tensor) -> list:
    """[shape, NaN count, sum, sum of |x|, sum of x * cos(index)] of a tensor (NaNs counted, then read as 0)."""
    x = tensor.detach().double().cpu().reshape(-1)
    nans = int(torch.isnan(x).sum())
    x = torch.nan_to_num(x, nan=0.0)
    pattern = torch.cos(torch.arange(x.numel(), dtype=torch.float64))
    return [list(tensor.shape), nans, x.sum().item(), x.abs().sum().item(), (x * pattern).sum().item()]


def run_case(name, model, output_dir) -> dict:
    (trainer_cls, config_cls), overrides, reward_funcs, env, rows = CASES[name]
    args = tiny_rl_args(config_cls, output_dir, **overrides)
    kwargs = {} if reward_funcs is None else {"reward_funcs": reward_funcs}
    trainer = trainer_cls(model, args=args, environment_factory=env, train_dataset=Dataset.from_list(rows),
                          **kwargs)
    steps = []
    step = trainer._generate_and_score_completions

    def recorded(inputs):
        output = step(inputs)
        steps.append({key: fingerprint(value) for key, value in sorted(output.items())
                      if isinstance(value, torch.Tensor)})
        return output

    trainer._generate_and_score_completions = recorded  # TRL calls it on the instance
    torch.manual_seed(0)
    trainer.train()
    logs = [{key: value for key, value in sorted(log.items())
             if isinstance(value, (int, float)) and not any(clock in key for clock in CLOCK_KEYS)}
            for log in trainer.state.log_history]
    weights = {key: fingerprint(value)[2:] for key, value in sorted(trainer.model.state_dict().items())}
    return {"steps": steps, "logs": logs, "weights": weights}


def assert_close(recorded, now, where: str) -> None:
    if isinstance(recorded, dict):
        assert sorted(recorded) == sorted(now), f"{where}: keys {sorted(recorded)} != {sorted(now)}"
        for key in recorded:
            assert_close(recorded[key], now[key], f"{where}.{key}")
    elif isinstance(recorded, list):
        assert len(recorded) == len(now), f"{where}: {recorded} != {now}"
        for i, (a, b) in enumerate(zip(recorded, now)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(recorded, float) and math.isnan(recorded):
        assert isinstance(now, float) and math.isnan(now), f"{where}: {now} != NaN"
    else:
        assert now == pytest.approx(recorded, rel=1e-5, abs=1e-6), f"{where}: {now} != {recorded}"


@pytest.mark.parametrize("name", list(CASES))
def test_a_short_run_reproduces_the_recorded_outputs(name, tiny_chatml_model, tmp_path):
    now = json.loads(json.dumps(run_case(name, tiny_chatml_model, tmp_path)))  # as the fixture stores it
    assert now["steps"] and now["logs"]
    if RECORD:
        recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
        recorded[name] = now
        FIXTURE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    assert_close(json.loads(FIXTURE.read_text())[name], now, name)
