"""Training rows (`trl_multiturn.trainers.rows`): what each episode format's episodes become as TRL's rows, and how
the credit's per-turn values map onto those rows; an agent's rewritten history turns a trajectory rollout into step
rows."""

import torch

from trl_multiturn.rollout.episode import Episode, Status, Turn
from trl_multiturn.rollout.formats import StepWise, Trajectory
from trl_multiturn.trainers.batch import RolloutBatch
from trl_multiturn.trainers.rows import StepRows, StepSample, TrajectoryRows, fit_steps, row_layout


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
    layout = row_layout(Trajectory().as_played(True).name)
    assert isinstance(layout, StepRows) and isinstance(row_layout(Trajectory.name), TrajectoryRows)
    rows, stepped = layout.training_rows([{"task": 0}], batch, None, 2, None, False)
    assert stepped.steps == [StepSample(0, 0, [5], [7], [1], [-0.1]), StepSample(0, 1, [5, 7, 6], [8, 9], [1, 1],
                                                                                   [-0.2, -0.3])]
    assert rows == [{"task": 0}] * 2 and stepped.row_turn_spans() == [[(0, 1)], [(0, 2)]]


def test_the_credit_maps_per_turn_values_onto_each_formats_rows():
    episodes = [_episode([[5], [5, 7, 6]]), _episode([[5], [5, 7, 6]])]
    trajectory = RolloutBatch(episodes, [[1.0, 2.0], [3.0, 4.0]], torch.ones(1), num_generations=2)
    steps = fit_steps(trajectory.step_samples(), 4, 4, None)
    stepwise = RolloutBatch(episodes, trajectory.turn_rewards, torch.ones(1), num_generations=2,
                            layout=StepRows(), steps=[steps[3], None, steps[0]])
    per_turn = [[1.0, 2.0], [3.0, 4.0]]
    assert trajectory.layout.row_turn_values(trajectory, per_turn) == per_turn
    assert stepwise.layout.row_turn_values(stepwise, per_turn) == [[4.0], [], [1.0]]
    advantages = torch.tensor(per_turn)
    assert stepwise.layout.row_turn_advantages(stepwise, advantages).tolist() == [[4.0], [0.0], [1.0]]
    per_token = torch.tensor([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0], [3.0, 30.0, 300.0]])
    assert trajectory.layout.turn_sums(trajectory, per_token[:2]) == [[1.0, 110.0], [2.0, 220.0]]
    assert stepwise.layout.turn_sums(stepwise, per_token) == [[333.0, 0.0], [0.0, 111.0]]  # a left-out turn: 0
