"""Episode formats (`trl_multiturn.rollout.formats`): the rules choose one object per format, every format answers
every question the runner, the step and the credit ask, and an agent's rewritten history turns a trajectory rollout
into step rows. (What each format plays and trains is tested token-exact in test_stepwise*.py and test_rollout.py.)"""

import pytest
import torch

from trl_multiturn.rollout import Episode, RolloutBatch
from trl_multiturn.rollout.episode import Status, Turn
from trl_multiturn.rollout.formats import FORMATS, EpisodeFormat, StepSample, StepWise, Trajectory, fit_steps
from trl_multiturn.rollout.rules import EPISODE_FORMATS, EpisodeRules

PROTOCOL = sorted(name for name in vars(EpisodeFormat) if not name.startswith("_")) + ["label", "name"]


@pytest.mark.parametrize("name", EPISODE_FORMATS)
def test_every_format_answers_the_whole_protocol_and_is_chosen_by_its_config_name(name):
    history = "window:2" if name == "stepwise" else "full"
    chosen = EpisodeRules(episode_format=name, history=history).episode_format_strategy()
    assert type(chosen) is FORMATS[name] and chosen.name == name
    assert [member for member in PROTOCOL if not hasattr(chosen, member)] == []


def test_the_stepwise_format_holds_the_rules_history_policy():
    chosen = EpisodeRules(episode_format="stepwise", history="window:1").episode_format_strategy()
    turns = [[{"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": f"o{k}"}] for k in range(3)]
    assert chosen.history([{"role": "user", "content": "task"}], turns) == [{"role": "user", "content": "task"},
                                                                             *turns[-1]]


def _episode(contexts: list[list[int]] | None) -> Episode:
    """A two-turn episode; `contexts`: its turns' step-wise contexts (None: a trajectory episode)."""
    ep = Episode(task={}, prompt_ids=[5], prompt_messages=[{"role": "user", "content": "go"}],
                 completion_ids=[7, 8, 9], env_mask=[1, 1, 1], logprobs=[-0.1, -0.2, -0.3], status=Status.LOST)
    ep.turns = [Turn("a", "a", (0, 1), reward=1.0, observation="o", context=contexts and contexts[0]),
                Turn("b", "b", (1, 3), reward=2.0, context=contexts and contexts[1])]
    return ep


def test_an_agents_rewritten_history_makes_step_rows_under_the_trajectory_rules():
    trajectory = Trajectory()
    assert trajectory.as_played(False) is trajectory and isinstance(trajectory.as_played(True), StepWise)
    stepwise = StepWise()
    assert stepwise.as_played(False) is stepwise and stepwise.as_played(True) is stepwise
    batch = RolloutBatch([_episode([[5], [5, 7, 6]])], [[1.0, 2.0]], torch.ones(1), num_generations=1)
    rows, stepped = Trajectory().as_played(True).training_rows([{"task": 0}], batch, None, 2, None, False)
    assert stepped.steps == [StepSample(0, 0, [5], [7], [1], [-0.1]), StepSample(0, 1, [5, 7, 6], [8, 9], [1, 1],
                                                                                   [-0.2, -0.3])]
    assert rows == [{"task": 0}] * 2 and stepped.row_turn_spans() == [[(0, 1)], [(0, 2)]]


def test_the_credit_maps_per_turn_values_onto_each_formats_rows():
    episodes = [_episode([[5], [5, 7, 6]]), _episode([[5], [5, 7, 6]])]
    trajectory = RolloutBatch(episodes, [[1.0, 2.0], [3.0, 4.0]], torch.ones(1), num_generations=2)
    steps = fit_steps(trajectory.step_samples(), 4, 4, None)
    stepwise = RolloutBatch(episodes, trajectory.turn_rewards, torch.ones(1), num_generations=2,
                            format=StepWise(), steps=[steps[3], None, steps[0]])
    per_turn = [[1.0, 2.0], [3.0, 4.0]]
    assert trajectory.format.row_turn_values(trajectory, per_turn) == per_turn
    assert stepwise.format.row_turn_values(stepwise, per_turn) == [[4.0], [], [1.0]]
    advantages = torch.tensor(per_turn)
    assert stepwise.format.row_turn_advantages(stepwise, advantages).tolist() == [[4.0], [0.0], [1.0]]
    per_token = torch.tensor([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0], [3.0, 30.0, 300.0]])
    assert trajectory.format.turn_sums(trajectory, per_token[:2]) == [[1.0, 110.0], [2.0, 220.0]]
    assert stepwise.format.turn_sums(stepwise, per_token) == [[333.0, 0.0], [0.0, 111.0]]  # a left-out turn: 0
