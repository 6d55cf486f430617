"""Episode formats (`trl_multiturn.rollout.formats`): the rules choose one object per format, and every format
answers every question the runner and the trainers' set-up ask. (What each format plays and trains is tested
token-exact in test_stepwise*.py and test_rollout.py; the training rows it becomes in tests/trainers/test_rows.py.)"""

import pytest

from trl_multiturn.rollout.formats import FORMATS, EpisodeFormat
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
