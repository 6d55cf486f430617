"""Sampling log-probs as the generation backends report them, on their way to the importance-sampling corrections."""

import math

from trl_multiturn.trainers.step_tensors import sampling_logps


def test_a_none_logprob_from_vllm_is_passed_on_as_nan():
    # vLLM reports a token whose log-prob is NaN as None (trl's `extract_logprobs`). Here it comes after a failed
    # episode's placeholder (NaN), where the "no log-probs at all" check meets it first.
    logps = sampling_logps([[math.nan], [None, math.nan, -0.5]])
    assert math.isnan(logps[0][0]) and math.isnan(logps[1][0]) and logps[1][2] == -0.5


def test_the_transformers_path_reports_no_logprobs():
    assert sampling_logps([[math.nan, math.nan], [math.nan]]) is None
    assert sampling_logps([[None], []]) is None
