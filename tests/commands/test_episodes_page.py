"""`trl-multiturn episodes RUN_DIR`: the HTML page of a model folder's evaluated episodes, built from a real
evaluation (tiny model, a user-style environment) and checked in a real headless Chromium: the filters hide and show
what they say, an episode opens to its turns, the rewards are coloured."""

import json
import os
import shutil

import pytest
from toy_envs import CountingEnv

from trl_multiturn.commands.cli import main
from trl_multiturn.commands.episodes import episodes_page, outcome, reward_colour
from trl_multiturn.evaluation import evaluate, load_eval_results
from trl_multiturn.rollout.rules import EpisodeRules

TASKS = [{"target": 1}, {"target": 3}, {"target": 0}]  # won in one turn; lost after 2 of 3; target 0 fails at reset


@pytest.fixture(scope="module")
def run_dir(tiny_chatml_model, tmp_path_factory):
    from datasets import Dataset

    folder = tmp_path_factory.mktemp("evaluated")
    result = evaluate(tiny_chatml_model, CountingEnv, Dataset.from_list(TASKS), progress=False,
                      rules=EpisodeRules(max_turns=2, max_completion_length=4, action_parser="whole_reply"))
    result.save(folder, split="test")
    return folder


def test_outcomes_keep_the_conversation_and_each_turns_reward(run_dir):
    [record] = load_eval_results(run_dir)
    won, lost, failed = record["outcomes"]
    assert (outcome(won), outcome(lost), outcome(failed)) == ("won", "lost", "failed")
    assert won["turn_rewards"] == [1.0] and lost["turn_rewards"] == [1.0, 2.0]  # CountingEnv: turn k earns k
    roles = [m["role"] for m in lost["messages"]]
    assert roles[-4:] == ["assistant", "user", "assistant", "user"]
    assert lost["messages"][0]["content"].startswith("Count to 3")


def test_page_shows_every_episode_turn_by_turn(run_dir):
    page = episodes_page(load_eval_results(run_dir), "run")
    assert page.count('<details class="episode ') == 3
    assert "won (1)" in page and "lost (1)" in page and "failed (1)" in page
    assert "reward +2.000" in page and "give &#x27;target&#x27;" in page  # the failure's reason, escaped
    assert "http" not in page  # self-contained: nothing fetched


def test_reward_colour_scales_with_sign_and_size():
    assert reward_colour(0.0, 2.0) == "transparent"
    assert reward_colour(2.0, 2.0) == "rgba(40, 170, 40, 0.60)"
    assert reward_colour(-1.0, 2.0) == "rgba(210, 40, 40, 0.30)"


def test_cli_writes_the_page_and_names_a_folder_without_evaluations(run_dir, tmp_path, capsys):
    assert main(["episodes", str(run_dir)]) == 0
    assert (run_dir / "episodes.html").is_file() and "wrote" in capsys.readouterr().out
    assert main(["episodes", str(tmp_path)]) == 2
    assert "no eval_results*.json here" in capsys.readouterr().err


def test_the_page_shows_the_starting_models_episodes_first(run_dir, tmp_path):
    """A run with `eval_start_model` keeps the start's evaluation in start_eval_results.json: its episodes lead the
    page, labelled, before the trained model's."""
    from trl_multiturn.commands.episodes import write_episodes_page
    from trl_multiturn.model_card import START_EVAL_RESULTS_FILE

    folder = shutil.copytree(run_dir, tmp_path / "run")
    record = json.loads((folder / "eval_results.json").read_text())
    record["outcomes"] = record["outcomes"][:1]
    record["summary"] = {**record["summary"], "n": 1, "successes": 1, "failed": 0}
    (folder / START_EVAL_RESULTS_FILE).write_text(json.dumps({**record, "model": "outputs/quickstart_sft"}))
    page = write_episodes_page(folder).read_text()
    start = page.index("start_eval_results.json (the starting model (outputs/quickstart_sft), before training)")
    assert start < page.index("<h2>eval_results.json")
    assert page.count('class="episode') == 1 + len(TASKS)  # the start's one episode and the trained model's


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.geteuid() != 0:
            pytest.skip("needs chromium and chromium-driver (scripts/setup.sh installs them as root)")
        pytest.fail("chromium/chromedriver missing: scripts/setup.sh installs them from the Debian archive")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1200,900"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def test_page_works_in_a_real_browser(run_dir, tmp_path):
    from selenium.webdriver.common.by import By

    page = run_dir / "browser.html"
    assert main(["episodes", str(run_dir), "-o", str(page)]) == 0
    browser = _browser()
    try:
        browser.get(page.as_uri())
        episodes = browser.find_elements(By.CSS_SELECTOR, ".episode")
        assert len(episodes) == 3 and all(e.is_displayed() for e in episodes)
        browser.find_element(By.CSS_SELECTOR, 'button[data-kind="failed"]').click()
        shown = [e for e in episodes if e.is_displayed()]
        assert len(shown) == 1 and "failed" in shown[0].get_attribute("class")
        assert browser.find_element(By.ID, "shown").text == "1"
        browser.find_element(By.CSS_SELECTOR, 'button[data-kind="lost"]').click()
        [lost] = [e for e in episodes if e.is_displayed()]
        replies = lost.find_elements(By.CSS_SELECTOR, ".reply")
        assert replies and not any(r.is_displayed() for r in replies)  # closed until clicked
        lost.find_element(By.TAG_NAME, "summary").click()
        assert all(r.is_displayed() for r in replies)
        colours = [r.value_of_css_property("background-color") for r in replies]
        assert colours[0] != colours[1] and all(c.startswith("rgba(40, 170, 40") for c in colours)  # +1 and +2
        shot = tmp_path / "page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 5000
    finally:
        browser.quit()
    record = json.loads(next(run_dir.glob("eval_results*.json")).read_text())
    assert len(record["outcomes"]) == 3


def test_play_prints_each_turn_and_writes_nothing(tiny_chatml_model, textworld_games_dir, tmp_path, capsys):
    """`trl-multiturn play`: eval's fields, one held-out game, printed turn by turn, no results file."""
    code = main(["play", "--model_name_or_path", tiny_chatml_model, "--games_dir", str(textworld_games_dir),
                 "--world_size", "1", "--nb_objects", "2", "--quest_length", "2", "--max_turns", "2",
                 "--max_completion_length", "4", "--results_dir", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("=== episode (") == 1 and "--- turn 1: reward" in printed and "reply: " in printed
    assert "observation: " in printed and "after " in printed and " turns, return " in printed
    assert not list(tmp_path.iterdir())  # nothing written, the model card untouched
