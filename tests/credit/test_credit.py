"""Credit assignment: every advantage estimator against hand-computed values, its baseline's membership rules, and
an end-to-end run with every trainer it is registered for."""

import functools
import math
import random

import pytest
import torch
from conftest import tiny_rl_args

from trl_multiturn.credit import ESTIMATORS, CreditBatch, discounted_returns, shape_turn_rewards
from trl_multiturn.credit.estimators import gigpo, grpo, reinforce_pp, rloo, turn_grpo, turn_rloo

EPS = 1e-4
SQRT3 = math.sqrt(1 / 3)  # std of {1, 0, 1} and of {1, 0, 0}
SQRT2 = math.sqrt(1 / 2)  # std of {1, 0}


def hand_batch() -> CreditBatch:
    """Group 0: episodes of 2, 3 and 1 turns (returns 1, 0, 1) and a failed one with large rewards.
    Group 1: two equal episodes (returns 2 and 2): no signal. Observations reuse group 0's texts on purpose."""
    return CreditBatch.from_lists(
        turn_rewards=[[0, 1], [0, 0, 0], [1], [5, 5], [1, 1], [1, 1]],
        group_ids=[0, 0, 0, 0, 1, 1],
        valid=[True, True, True, False, True, True],
        observations=[["start", "hall"], ["start", "hall", "hall"], ["start"], ["start", "hall"],
                      ["start", "hall"], ["start", "cellar"]],
    )


def rows(*values):
    """Pad each episode's per-turn values to 3 turns with the 0 every estimator puts past an episode's end."""
    return torch.tensor([list(v) + [0.0] * (3 - len(v)) for v in values])


ZERO_TAIL = [(), (), ()]  # the failed episode and the two equal episodes of group 1
BATCH_BASELINE = {"reinforce_pp"}  # estimators whose baseline is the whole batch, not the episode's group
GROUP_BASELINE = sorted(set(ESTIMATORS) - BATCH_BASELINE)


# -- hand-computed values -----------------------------------------------------------------------------------------


def test_grpo_by_hand():
    a, b = (1 - 2 / 3) / (SQRT3 + EPS), (0 - 2 / 3) / (SQRT3 + EPS)  # group 0: mean 2/3, std sqrt(1/3)
    expected = rows((a, a), (b, b, b), (a,), *ZERO_TAIL)
    torch.testing.assert_close(grpo(hand_batch()), expected)
    unscaled = rows((1 / 3,) * 2, (-2 / 3,) * 3, (1 / 3,), *ZERO_TAIL)
    torch.testing.assert_close(grpo(hand_batch(), scale=False), unscaled)


def test_rloo_by_hand():
    # Each baseline is the mean of the two other valid returns of group 0: (0+1)/2, (1+1)/2, (1+0)/2.
    expected = rows((0.5, 0.5), (-1, -1, -1), (0.5,), *ZERO_TAIL)
    torch.testing.assert_close(rloo(hand_batch()), expected)


def test_turn_grpo_by_hand():
    # Returns-to-go: [1, 1], [0, 0, 0], [1]. Turn 0: all three (mean 2/3). Turn 1: only the 2- and 3-turn episodes
    # (mean 1/2: the 1-turn episode is not counted as a 0). Turn 2: the 3-turn episode alone, no baseline: 0.
    expected = rows((1 / 3, 1 / 2), (-2 / 3, -1 / 2, 0), (1 / 3,), *ZERO_TAIL)
    torch.testing.assert_close(turn_grpo(hand_batch(), scale=False), expected)
    s0, s1 = SQRT3 + EPS, SQRT2 + EPS
    scaled = rows((1 / 3 / s0, 1 / 2 / s1), (-2 / 3 / s0, -1 / 2 / s1, 0), (1 / 3 / s0,), *ZERO_TAIL)
    torch.testing.assert_close(turn_grpo(hand_batch()), scaled)


def test_turn_rloo_by_hand():
    # Turn 0: leave-one-out over {1, 0, 1}. Turn 1: over {1, 0}, so each sees the other's return-to-go.
    expected = rows((0.5, 1.0), (-1, -1, 0), (0.5,), *ZERO_TAIL)
    torch.testing.assert_close(turn_rloo(hand_batch()), expected)


def test_gigpo_by_hand():
    # Episode term (scale=False): R - 2/3 = [1/3, -2/3, 1/3]. Step term: anchor "start" = turn 0 of the three valid
    # episodes, returns-to-go {1, 0, 1}; anchor "hall" = (ep0, t1) and (ep1, t1), (ep1, t2), returns {1, 0, 0}, mean
    # 1/3. Group 1 reuses "start" and "hall" but is another task: its anchors are {2, 2}, {1} and {1} -> 0.
    expected = rows((1 / 3 + 1 / 3, 1 / 3 + 2 / 3), (-2 / 3 - 2 / 3, -2 / 3 - 1 / 3, -2 / 3 - 1 / 3), (1 / 3 + 1 / 3,),
                    *ZERO_TAIL)
    torch.testing.assert_close(gigpo(hand_batch(), scale=False), expected)
    a, b = 1 / 3 / (SQRT3 + EPS), 2 / 3 / (SQRT3 + EPS)
    scaled = rows((a + a, a + b), (-b - b, -b - a, -b - a), (a + a,), *ZERO_TAIL)
    torch.testing.assert_close(gigpo(hand_batch()), scaled)
    # The weight scales only the step term: A(w) - w * A(1) = (1 - w) * A_E, and A_E is grpo's advantage.
    half = gigpo(hand_batch(), step_weight=0.5, scale=False) - 0.5 * gigpo(hand_batch(), scale=False)
    torch.testing.assert_close(half, 0.5 * grpo(hand_batch(), scale=False))


def test_reinforce_pp_by_hand():
    # Live turns of valid episodes and their returns-to-go: [1, 1], [0, 0, 0], [1], [2, 1], [2, 1] (10 turns, the
    # failed episode left out). Mean 9/10; unbiased variance = (sum G^2 - 10 mean^2) / 9 = (13 - 8.1) / 9.
    mean, std = 0.9, math.sqrt(4.9 / 9)
    centred = rows((1 - mean, 1 - mean), (-mean,) * 3, (1 - mean,), (), (2 - mean, 1 - mean), (2 - mean, 1 - mean))
    torch.testing.assert_close(reinforce_pp(hand_batch(), scale=False), centred)
    torch.testing.assert_close(reinforce_pp(hand_batch()), centred / (std + EPS))
    # No group baseline: group 1's two equal episodes are above the batch mean and are pushed up, where every
    # group-baseline estimator gives them exactly 0.
    assert torch.all(reinforce_pp(hand_batch())[4:, :2] > 0)


def test_discount_applies_to_returns_to_go_and_gigpo_episode_term_is_undiscounted():
    batch = CreditBatch.from_lists([[0, 0, 1], [0, 0, 0]], [0, 0], [True, True],
                                   [["a", "b", "c"], ["a", "x", "y"]])
    torch.testing.assert_close(discounted_returns(batch.rewards, batch.turn_mask, 0.5),
                               torch.tensor([[0.25, 0.5, 1.0], [0, 0, 0]]))
    # turn_rloo: turn k compares 0.5^(2-k) with 0.
    torch.testing.assert_close(turn_rloo(batch, gamma=0.5), torch.tensor([[0.25, 0.5, 1.0], [-0.25, -0.5, -1.0]]))
    # gigpo: episode term R - mean = +-1/2 undiscounted; step term only at the shared anchor "a": +-(0.25 - 0.125).
    torch.testing.assert_close(gigpo(batch, gamma=0.5, scale=False),
                               torch.tensor([[0.5 + 0.125, 0.5, 0.5], [-0.5 - 0.125, -0.5, -0.5]]))


@pytest.mark.parametrize("name", GROUP_BASELINE)
def test_a_group_of_equal_returns_carries_no_advantage(name):
    # Group 1 of the hand batch: two equal episodes; every estimator gives them exactly 0 on every turn.
    adv = ESTIMATORS[name](hand_batch())
    assert torch.all(adv[4:] == 0)
    assert adv[:3].abs().sum() > 0  # while the mixed group 0 does carry signal
    # Exactly 0, not a rounding residue: 7 * 0.1 / 7 != 0.1 in float32, and /(std + eps) would blow it up to ~1e-4.
    equal = CreditBatch.from_lists([[0.1, 0.2]] * 7, [0] * 7, [True] * 7, [["a", "b"]] * 7)
    assert torch.all(ESTIMATORS[name](equal) == 0)


@pytest.mark.parametrize("name", sorted(BATCH_BASELINE))
def test_a_batch_of_equal_returns_carries_no_advantage(name):
    # Batch-level baselines: only a whole batch of equal returns-to-go is without signal, and then exactly 0.
    equal = CreditBatch.from_lists([[0.1, 0.1]] * 7, [0, 0, 1, 1, 2, 2, 3], [True] * 7, [["a", "b"]] * 7)
    assert torch.all(ESTIMATORS[name](equal, gamma=0.0) == 0)
    assert ESTIMATORS[name](hand_batch())[:3].abs().sum() > 0


# -- who is in a baseline -----------------------------------------------------------------------------------------


def _baseline(estimator, batch):
    """What was subtracted from each return-to-go (live turns; 0 elsewhere)."""
    returns = discounted_returns(batch.rewards, batch.turn_mask)
    return torch.where(batch.turn_mask, returns - estimator(batch), 0.0)


@pytest.mark.parametrize("estimator", [rloo, turn_rloo])
def test_rloo_baseline_excludes_the_episode_itself(estimator):
    turns = [[0, 1, 0], [1, 0, 0], [2, 2, 1], [0, 3]]
    before = _baseline(estimator, CreditBatch.from_lists(turns, [0] * 4, [True] * 4))
    changed = [[7, 1, 4], *turns[1:]]
    after = _baseline(estimator, CreditBatch.from_lists(changed, [0] * 4, [True] * 4))
    # Episode 0's baseline at turn 0 (its whole return; for turn_rloo every turn's return-to-go) is unchanged by
    # its own rewards, while every other episode's baseline at turn 0 moved by the change of episode 0's return
    # (1 -> 12) over the 3 others it is averaged with.
    torch.testing.assert_close(after[0, 0], before[0, 0])
    if estimator is turn_rloo:
        torch.testing.assert_close(after[0], before[0])
    torch.testing.assert_close(after[1:, 0], before[1:, 0] + (12 - 1) / 3)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_failed_episodes_are_excluded_from_every_baseline(name):
    estimator = ESTIMATORS[name]
    base = hand_batch()
    other = hand_batch()
    other.rewards[3] = torch.tensor([-40.0, 9.0, 0.0])  # the failed episode's rewards
    other.observations[3] = ["hall", "start"]
    adv = estimator(base)
    torch.testing.assert_close(estimator(other), adv)
    assert torch.all(adv[3] == 0)
    # ...while the same rewards on a valid episode do move its group's advantages.
    other.valid[3] = True
    assert not torch.allclose(estimator(other)[:3], adv[:3])


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_turns_past_an_episode_end_get_no_advantage(name):
    batch = hand_batch()
    assert torch.all(ESTIMATORS[name](batch)[~batch.turn_mask] == 0)


def _gigpo_step_reference(turn_rewards, groups, observations):
    """Brute force: for each (group, observation), the explicit list of turns; mean-centred returns-to-go."""
    anchors: dict[tuple, list[float]] = {}
    returns = [[sum(r[k:]) for k in range(len(r))] for r in turn_rewards]
    for i, obs in enumerate(observations):
        for k, o in enumerate(obs):
            anchors.setdefault((groups[i], o), []).append(returns[i][k])
    return [[returns[i][k] - sum(anchors[(groups[i], o)]) / len(anchors[(groups[i], o)]) for k, o in enumerate(obs)]
            for i, obs in enumerate(observations)]


def test_gigpo_anchors_are_exactly_equal_observations_within_one_group():
    rng = random.Random(0)
    for _ in range(20):
        n = 8
        lengths = [rng.randint(1, 5) for _ in range(n)]
        turn_rewards = [[float(rng.randint(0, 2)) for _ in range(L)] for L in lengths]
        observations = [[rng.choice(["room A", "room B", "room a", "room A "]) for _ in range(L)] for L in lengths]
        groups = [i // 4 for i in range(n)]
        batch = CreditBatch.from_lists(turn_rewards, groups, [True] * n, observations)
        step = gigpo(batch, scale=False) - gigpo(batch, scale=False, step_weight=0.0)
        expected = _gigpo_step_reference(turn_rewards, groups, observations)
        for i in range(n):
            torch.testing.assert_close(step[i, : lengths[i]], torch.tensor(expected[i]), atol=1e-5, rtol=0)


def test_gigpo_needs_observations():
    batch = hand_batch()
    batch.observations = None
    with pytest.raises(ValueError, match="observations"):
        gigpo(batch)


def test_reward_modes_and_format_penalty():
    env = [0.0, 1.0, 0.0]
    assert shape_turn_rewards(env, won=True, mode="sparse") == [0.0, 0.0, 1.0]
    assert shape_turn_rewards(env, won=False, mode="sparse") == [0.0, 0.0, 0.0]
    assert shape_turn_rewards(env, won=True, mode="dense") == env
    assert shape_turn_rewards(env, won=True, mode="shaped", success_reward=2.0) == [0.0, 1.0, 2.0]
    assert shape_turn_rewards(env, won=False, mode="dense", format_errors=[True, False, True],
                              format_penalty=0.5) == [-0.5, 1.0, -0.5]
    # The paper's scaling: a won episode's rewards over its number of non-zero rewards (2 here); a lost one over
    # one more (the win it did not reach).
    assert shape_turn_rewards([0.0, 1.0, 0.0, 3.0], won=True, mode="dense_scaled") == [0.0, 0.5, 0.0, 1.5]
    assert shape_turn_rewards([0.0, 1.0, 0.0, 3.0], won=False, mode="dense_scaled") == pytest.approx(
        [0.0, 1 / 3, 0.0, 1.0])
    assert shape_turn_rewards([0.0, 0.0], won=True, mode="dense_scaled") == [0.0, 0.0]
    with pytest.raises(ValueError, match="reward_mode='final'"):
        shape_turn_rewards(env, won=True, mode="final")


def _scaled_return(env_rewards, won):
    return sum(shape_turn_rewards(env_rewards, won=won, mode="dense_scaled"))


@pytest.mark.parametrize("collected", [1, 2, 3, 10, 100])
def test_dense_scaled_never_pays_a_loss_as_much_as_a_win(collected):
    # A point per rewarded step (TextWorld's dense games). The shortest win: one rewarded step. The longest loss:
    # `collected` rewarded steps among twice as many turns, then the turn budget runs out.
    shortest_win = _scaled_return([1.0], won=True)
    long_win = _scaled_return([0.0, 1.0] * 50, won=True)
    loss = _scaled_return([1.0, 0.0] * collected, won=False)
    assert shortest_win == 1.0 and long_win == pytest.approx(1.0)
    assert 0 < loss < shortest_win
    assert loss == pytest.approx(collected / (collected + 1))


def test_dense_scaled_collecting_partial_rewards_and_stalling_earns_less_than_winning():
    # A 4-step quest played two ways: win it (4 points), or take 3 of its points, then stall until the budget ends
    # (or lose). Unscaled losses made the attack pay 3 against the win's 1.
    win = _scaled_return([1.0, 0.0, 1.0, 1.0, 1.0], won=True)
    stall = _scaled_return([1.0, 1.0, 1.0] + [0.0] * 9, won=False)
    assert win == pytest.approx(1.0) and stall == pytest.approx(0.75) and stall < win
    # Farming the same reward again and again (where a game pays it twice) does not reach a win either.
    assert _scaled_return([1.0] * 40, won=False) < win


# -- end to end ---------------------------------------------------------------------------------------------------


def _registered_pairs():
    """(trainer, estimator) for every estimator: GRPO and RLOO take any name in `ESTIMATORS`, so they take turns
    over them (both build the estimator's batch and spread its (B, turns) output over the tokens in the same
    `_token_advantages`, whichever estimator it is; each trainer's own default trains in test_grpo.py and
    test_rloo.py, and each gets episode- and turn-level estimators here); PPO takes the critic's
    `VALUE_ESTIMATORS`."""
    from trl_multiturn.credit.gae import VALUE_ESTIMATORS

    return ([(("grpo", "rloo")[i % 2], name) for i, name in enumerate(sorted(ESTIMATORS))]
            + [("ppo", name) for name in sorted(VALUE_ESTIMATORS)])


def _trainer(name):
    """(trainer class, config class, its registry, extra config fields for this test)."""
    import trl_multiturn as tm
    from trl_multiturn.credit.gae import VALUE_ESTIMATORS

    return {
        "grpo": (tm.MultiTurnGRPOTrainer, tm.MultiTurnGRPOConfig, ESTIMATORS, {}),
        # A turn-level estimator needs one importance ratio per turn; every estimator trains with it.
        "rloo": (tm.MultiTurnRLOOTrainer, tm.MultiTurnRLOOConfig, ESTIMATORS, {"loss_granularity": "turn"}),
        "ppo": (tm.MultiTurnPPOTrainer, tm.MultiTurnPPOConfig, VALUE_ESTIMATORS, {"num_generations": 2}),
    }[name]


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
@pytest.mark.parametrize("trainer_name,estimator", _registered_pairs())
def test_every_estimator_trains_end_to_end_on_textworld(trainer_name, estimator, tiny_chatml_model, tmp_path,
                                                        textworld_train_tasks, textworld_games_dir, monkeypatch):
    from trl_multiturn.envs import TextWorldEnv

    trainer_cls, config_cls, registry, extra = _trainer(trainer_name)
    calls = []
    original = registry[estimator]

    @functools.wraps(original)
    def recording(batch, **options):
        out = original(batch, **options)
        calls.append((batch, out))
        return out

    monkeypatch.setitem(registry._entries, estimator, recording)  # a Registry refuses a second registration
    args = tiny_rl_args(config_cls, tmp_path, advantage_estimator=estimator, reward_mode="dense", max_steps=1,
                        max_turns=2, **extra)
    trainer = trainer_cls(model=tiny_chatml_model, args=args, train_dataset=textworld_train_tasks,
                          environment_factory=lambda: TextWorldEnv(games_dir=str(textworld_games_dir)))
    result = trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    assert len(calls) == 1
    batch, out = calls[0]
    if registry is ESTIMATORS:
        assert out.shape == batch.rewards.shape and torch.isfinite(out).all()
        assert torch.all(out[~batch.turn_mask] == 0)
        assert batch.observations is not None and all(len(o) == int(m.sum())
                                                      for o, m in zip(batch.observations, batch.turn_mask))
        logged = [log for log in trainer.state.log_history if "credit/advantage_mean" in log]
        assert logged and "credit/zero_advantage_groups" in logged[0]
    else:  # a critic's estimator: per-token advantages, only on the tokens the model sampled
        assert out.advantages.shape == batch.mask.shape and torch.isfinite(out.advantages).all()
        assert torch.all(out.advantages[~batch.mask.bool()] == 0) and batch.mask.any()
