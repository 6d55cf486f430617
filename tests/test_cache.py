"""One cache-folder rule (`trl_multiturn.cache`): one variable, one folder name, old folders and the old variable
still found."""

import json
import logging

import pytest

from trl_multiturn import cache
from trl_multiturn.cache import cache_dir
from trl_multiturn.envs.swegym.tasks import default_cache_dir
from trl_multiturn.envs.textworld.env import default_games_dir


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home with none of the variables set."""
    for name in ("TRL_MULTITURN_CACHE", "TRL_MULTITURN_GAMES_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cache, "_warned", set())
    return tmp_path


def test_every_cache_folder_follows_the_variable_then_xdg_then_home(home, monkeypatch):
    assert default_games_dir() == home / ".cache" / "trl_multiturn" / "textworld_games"
    assert default_cache_dir() == home / ".cache" / "trl_multiturn" / "swegym"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert default_cache_dir() == home / "xdg" / "trl_multiturn" / "swegym"  # SWE-Gym ignored XDG before
    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(home / "mine"))
    assert default_games_dir() == home / "mine" / "textworld_games"
    assert default_cache_dir() == home / "mine" / "swegym"
    assert cache_dir("smollm2-135m-instruct") == home / "mine" / "smollm2-135m-instruct"


def test_the_model_folder_is_found_through_the_rule(home, monkeypatch):
    """`offline_default_model` returns an existing conversion from the cache folder without converting again."""
    from trl_multiturn.models import CONVERSION, offline_default_model

    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(home / "mine"))
    done = home / "mine" / "smollm2-135m-instruct"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    (done / "conversion.json").write_text(json.dumps({"conversion": CONVERSION}))
    (done / "model.safetensors").write_bytes(b"")
    assert offline_default_model() == str(done)


def test_an_old_hyphenated_folder_is_used_with_a_warning_until_the_new_one_exists(home, caplog):
    old = home / ".cache" / "trl-multiturn" / "smollm2-135m-instruct"
    old.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="trl_multiturn.cache"):
        assert cache_dir("smollm2-135m-instruct") == old
        assert cache_dir("smollm2-135m-instruct") == old
    assert len(caplog.records) == 1 and "move it to" in caplog.records[0].getMessage()
    new = home / ".cache" / "trl_multiturn" / "smollm2-135m-instruct"
    new.mkdir(parents=True)
    assert cache_dir("smollm2-135m-instruct") == new


def test_the_old_folder_is_not_used_when_the_variable_is_set(home, monkeypatch):
    (home / ".cache" / "trl-multiturn" / "swegym").mkdir(parents=True)
    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(home / "mine"))
    assert default_cache_dir() == home / "mine" / "swegym"


def test_swegym_folder_under_home_is_still_found_with_xdg_set(home, monkeypatch):
    old = home / ".cache" / "trl_multiturn" / "swegym"
    old.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert default_cache_dir() == old


def test_the_old_games_variable_still_works_with_a_future_warning(home, monkeypatch):
    monkeypatch.setenv("TRL_MULTITURN_GAMES_DIR", str(home / "games"))
    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(home / "mine"))
    with pytest.warns(FutureWarning, match=r"TRL_MULTITURN_GAMES_DIR is deprecated: set \$TRL_MULTITURN_CACHE"):
        assert default_games_dir() == home / "games"
    assert default_cache_dir() == home / "mine" / "swegym"  # it names the games folder only


def test_the_offline_default_is_converted_with_the_hub_special_tokens_and_again_when_its_conversion_is_old(
        home, monkeypatch):
    """The real GGUF conversion: the tokenizer ends a turn with `<|im_end|>` (transformers 5.17's GGUF loader reads
    `<|im_start|>`, which no assistant turn ends with), config and generation config agree, and a cached checkpoint
    from before `conversion.json` (the one that could hold the wrong token) is converted again, not trusted."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from trl_multiturn.models import CONVERSION, offline_default_model

    monkeypatch.setenv("TRL_MULTITURN_CACHE", str(home / "mine"))
    old = home / "mine" / "smollm2-135m-instruct"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    (old / "model.safetensors").write_bytes(b"")
    path = offline_default_model()
    assert path == str(old)
    assert json.loads((old / "conversion.json").read_text()) == {"conversion": CONVERSION}
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_start|>",
                                                                               "<|im_end|>")
    eos = tokenizer.eos_token_id
    assert AutoConfig.from_pretrained(path).eos_token_id == GenerationConfig.from_pretrained(path).eos_token_id == eos
    turn = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                         tokenize=True, return_dict=False)
    assert eos in list(turn)
