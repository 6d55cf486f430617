"""Sampling log-probs as the generation backends report them, on their way to TRL's importance-sampling correction."""

import math

from trl_multiturn.trainers.multiturn import MultiTurnMixin


def test_a_none_logprob_from_vllm_is_passed_on():
    # vLLM reports a token whose log-prob is NaN as None (trl's `extract_logprobs`); TRL maps it back to NaN. Here it
    # comes after a failed episode's placeholder (NaN), where the "no log-probs at all" check meets it first.
    token_lists = [([1], [2], [0], [math.nan]), ([1], [5, 6, 7], [1, 0, 1], [None, math.nan, -0.5])]
    logps = MultiTurnMixin._episode_logprobs(None, token_lists)
    assert math.isnan(logps[0][0]) and logps[1][0] is None and logps[1][2] == -0.5


def test_the_transformers_path_reports_no_logprobs():
    token_lists = [([1], [5, 6], [1, 0], [math.nan, math.nan]), ([1], [8], [0], [math.nan])]
    assert MultiTurnMixin._episode_logprobs(None, token_lists) is None
