"""Replies that act outside a TextWorld story are refused in every form the story's parser would act on.

The oracle is the real story. TextWorld turns on Inform's action trace, which names every action the story carries
out, out-of-world ones included ("[restarting the game]"); a yes/no question left pending shows in how the story
answers the next "y"; a saved game or transcript shows as a file. Every input on which the story acts outside its
world must be refused by `refused_word`, and after any attack the game must play on and be won with full score.
"""

import re

import pytest
import textworld
from hypothesis import assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from trl_multiturn.envs.textworld.commands import (
    REFUSED_VERBS,
    REFUSED_WORDS,
    WORD_SEPARATORS,
    dictionary_key,
    normalize_action,
    refused_word,
)
from trl_multiturn.envs.textworld.env import TextWorldEnv

# TextWorld silences this Jericho warning at import; pytest re-enables warnings per test.
pytestmark = pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")

GAMES = {
    "tw-simple": {"challenge": "tw-simple", "rewards": "dense", "goal": "detailed", "seed": 0},
    "custom": {"world_size": 2, "nb_objects": 3, "quest_length": 4, "seed": 0},
}
RHETORICAL = "That was a rhetorical question."
# Actions of the trace that act on the interpreter, its files or TextWorld's tracker rather than the story.
OUT_OF_STORY = ("restarting the game", "restoring the game", "quitting the game", "saving the game",
                "switching the story transcript", "tracing the actions", "turning on the", "turning off the",
                "printing the entire state", "reporting max score", "reporting the version number", "printing the id")
TRACE = re.compile(r"\[([^\]]+)\]")

ATTACK_WORDS = ["restart", "restore", "quit", "q", "save", "undo", "again", "g", "oops", "o", "script", "transcript",
                "transcripts", "script on", "transcript off", "unscript", "noscript", "tw-trace-actions",
                "tw-extra-infos score", "tw-extra-infos description", "tw-print max_score", "tw-print player id",
                "print_state", "print_statexyz", "enable print state option", "disable print state option",
                "restrict commands"]
# Out-of-world commands that only print, and in-world ones that change nothing: passed to the story.
HARMLESS = ["verbose", "superbrief", "score", "notify", "version", "verify", "pronouns", "goal", "help", "y", "look",
            "inventory", "x me", "wait"]
# Where the parser reads a command: alone, in chains (". " "then" ","), as an order to the player, upper-cased.
CONTEXTS = ["{}", "{}.", "me, {}", "MYSELF,{U}", "self , {}", "look. {}", "look.{}", "look then {}", "LOOK THEN {U}",
            "look, {}", "i,{}", "z, then {}", "x me then me, {}", "look. me, {}", '"{}"', ".{}"]


@pytest.fixture(scope="module")
def game_files(textworld_games_dir):
    env = TextWorldEnv(games_dir=str(textworld_games_dir))
    return {name: env.game_file(task) for name, task in GAMES.items()}


class Story:
    """The real story, replayed for each probe from the state it had right after TextWorld's reset."""

    def __init__(self, game_file, workdir):
        self.engine = textworld.start(str(game_file), textworld.EnvInfos(admissible_commands=True))
        self.engine.reset()  # TextWorld turns Inform's action trace on here
        self.jericho = self.engine.unwrapped._jericho
        self.start = self.jericho.get_state()
        self.workdir = workdir

    def effect_outside_the_story(self, command: str) -> str | None:
        """What the story did outside its world on `command` (then "y"), or None."""
        self.jericho.set_state(self.start)
        said = self.jericho.step(command)[0]
        answer = self.jericho.step("y")[0]
        written = sorted(path.name for path in self.workdir.iterdir())
        for path in self.workdir.iterdir():
            path.unlink()
        actions = [action for action in TRACE.findall(said + answer) if action.startswith(OUT_OF_STORY)]
        if actions:
            return actions[0]
        if RHETORICAL not in answer:
            return f"a question was pending: 'y' was answered {answer[:60]!r}"
        for parser_word in ('does not provide "undo"', "can't be corrected"):  # undo and oops reached the parser
            if parser_word in said:
                return parser_word
        return f"wrote {written}" if written else None

    def close(self):
        self.engine.close()


@pytest.fixture
def story(game_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the interpreter saves games and transcripts into the working directory
    story = Story(game_files["tw-simple"], tmp_path)
    yield story
    story.close()


def test_every_form_the_story_acts_on_outside_its_world_is_refused(story):
    acted = {}
    for word in ATTACK_WORDS:
        for context in CONTEXTS:
            command = context.format(word, U=word.upper())
            effect = story.effect_outside_the_story(command)
            if effect is not None:
                acted[command] = effect
                assert refused_word(normalize_action(command)) is not None, (command, effect)
    # The oracle sees the attacks it must see: the one, chains, orders, abbreviations, long spellings.
    for command in ("me, restart", "look, q", "x me then me, save", "LOOK THEN RESTORE", "g", "o", "undo",
                    "transcripts", "print_statexyz", "me, tw-extra-infos description", "restrict commands"):
        assert command in acted, command
    assert len(acted) > len(ATTACK_WORDS) * len(CONTEXTS) // 2  # 260 of the 432 forms


def test_harmless_commands_reach_the_story(story):
    for word in HARMLESS:
        for context in ("{}", "look. {}", "me, {}"):
            command = context.format(word)
            assert story.effect_outside_the_story(command) is None, command
            assert refused_word(normalize_action(command)) is None, command


def test_story_dictionary_matches_the_screening(game_files):
    """The stories' word separators and 9-Z-character words are the ones `refused_word` assumes."""
    from jericho import FrotzEnv

    for game_file in game_files.values():
        story = game_file.read_bytes()
        dictionary = int.from_bytes(story[0x08:0x0A], "big")
        assert story[dictionary + 1 : dictionary + 1 + story[dictionary]].decode() == WORD_SEPARATORS
        engine = FrotzEnv(str(game_file))
        try:
            entries = {entry.word for entry in engine.get_dictionary()}
        finally:
            engine.close()
        keys = {dictionary_key(entry) for entry in entries}
        assert len(keys) == len(entries)  # the key tells every dictionary word apart
        for word in ("transcript", "superbrief", "print_state", "tw-extra-infos", "tw-trace-actions", "restart", "q"):
            assert dictionary_key(word) in keys, word  # the story stores the word as its key says
    assert dictionary_key("transcripts") == dictionary_key("transcrip") == dictionary_key("TRANSCRIPT")
    assert dictionary_key("tw-extra-infos") == dictionary_key("tw-extra")
    assert dictionary_key("restarts") != dictionary_key("restart")


def test_game_commands_are_not_refused(game_files):
    """No command of the games' walkthroughs or admissible commands is refused; nor are one-letter object names."""
    for name, task in GAMES.items():
        env = TextWorldEnv(games_dir=str(game_files[name].parent))
        try:
            env.reset(task)
            commands = set()
            for action in env.expert_actions(task):
                result = env.step(action)
                commands |= {action, *result.info["admissible_commands"]}
        finally:
            env.close()
        assert len(commands) > 10
        assert [command for command in commands if refused_word(normalize_action(command))] == []
    # TextWorld names objects "type Q box": a one-letter word is refused only where the story reads a verb.
    for command in ("take type q key", "open q", "unlock type g box with type o key", "put type Q key on g"):
        assert refused_word(command) is None, command
    for command in ("q", "take key. g", "look, o", "x me then Q", '"g'):
        assert refused_word(normalize_action(command)) in REFUSED_VERBS, command


@hypothesis_settings(max_examples=200)
@given(st.text(max_size=60), st.sampled_from(REFUSED_WORDS), st.text(alphabet=" .,\"", min_size=1, max_size=5),
       st.text(max_size=40))
def test_a_refused_word_is_refused_wherever_it_stands(before, word, gap, after):
    assume(len(normalize_action(before)) < 100)  # NFKD can lengthen text ("\ufdfa" is 18 letters): keep the word
    command = normalize_action(before + gap + word.upper() + " " + after)
    assert refused_word(command) is not None


# Multi-step attacks played through the env between the walkthrough's steps.
ATTACK_SEQUENCES = [
    ["me, restart", "y"], ["save"], ["restore"],  # a walkthrough step comes first and between: a rewind would show
    ["restart", "yes"], ["RESTART", "Y"], ["look. q", "y"], ["x me then me, quit", "y"], ["script", "look"],
    ["transcript on"],
    ["blorp", "oops restart", "y"], ["me, blorp", "oops restart", "y"], ["xyzzy", "o quit", "y"],
    ["look", "g"], ["again"], ["undo"], ["look. undo"],
    ["tw-extra-infos description"], ["tw-trace-actions"], ["print_state"], ["enable print state option"],
    ["restrict commands"], ["tw-print max_score"],
    ["say ] [opening the chest drawer - succeeded", "look"],  # brackets would forge the trace TextWorld reads
    ["\\q"], ["\\help", "\x14"],  # dumb-frotz escapes and control characters made the interpreter wait forever
    [".", ",,,", "then then then", '"', ". , . then ,"], ["." * 300],  # separators only
    ["x me. " * 40 + "restart"], ["look " * 37 + "looks restartxyz"],  # cut at 198 characters, to "...restart"
    ["verbose", "brief", "superbrief", "notify", "score", "version", "verify"],  # passed through, harmless
    ["pronouns", "help", "goal", "y", "no"],
]


@pytest.mark.parametrize("game", sorted(GAMES))
def test_attacks_change_nothing_and_the_walkthrough_still_wins(game, game_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = GAMES[game]
    env = TextWorldEnv(games_dir=str(game_files[game].parent))
    try:
        env.reset(task)
        walkthrough = env.expert_actions(task)
        rewards, score = [], 0
        for index, attack in enumerate(ATTACK_SEQUENCES):
            if index < len(walkthrough) - 1:  # progress between attacks, so that a rewind would show
                result = env.step(walkthrough[index])
                rewards.append(result.reward)
                score = result.info["score"]
            for reply in attack:
                result = env.step(reply)
                assert (result.reward, result.done, result.won) == (0.0, False, False), (attack, reply)
                assert result.info["score"] == score, (attack, reply)
                if refused_word(normalize_action(reply)) is not None:
                    assert result.observation.endswith("is not available in this game."), (attack, reply)
            answer = env.step("y")  # answered as a plain command: no question was left pending
            assert answer.observation == RHETORICAL, (attack, answer)
            story_says = env.step("score").observation  # the story's own score: no restart or restore behind us
            assert f"scored {score} out of a possible" in story_says, (attack, story_says)
            assert list(tmp_path.iterdir()) == [], attack  # no saved game, no transcript
        results = [env.step(action) for action in walkthrough[len(rewards):]]
        assert results[-1].won and [r.done for r in results] == [False] * (len(results) - 1) + [True]
        assert sum(rewards) + sum(r.reward for r in results) == results[-1].info["max_score"] > 0
    finally:
        env.close()


@hypothesis_settings(max_examples=25)
@given(st.lists(st.lists(st.sampled_from(
    [*ATTACK_WORDS, *HARMLESS, "me", "myself", "then", "and", ".", ",", '"', "[", "]", "\\", "y", "type q", "blorp"]),
    min_size=1, max_size=8), min_size=1, max_size=3))
def test_random_replies_of_dangerous_words_change_nothing(game_files, tmp_path_factory, replies):
    """Random replies built from the dangerous words, separators and harmless commands: the custom game's
    walkthrough still wins with full score afterwards, no question is pending and no file is written."""
    import os

    workdir = tmp_path_factory.mktemp("replies")
    task = GAMES["custom"]
    env = TextWorldEnv(games_dir=str(game_files["custom"].parent))
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        env.reset(task)
        for words in replies:
            result = env.step(" ".join(words))
            assert (result.reward, result.done, result.won) == (0.0, False, False), words
        assert env.step("y").observation == RHETORICAL
        assert list(workdir.iterdir()) == []
        results = [env.step(action) for action in env.expert_actions(task)]
        assert results[-1].won and sum(r.reward for r in results) == results[-1].info["max_score"]
    finally:
        os.chdir(cwd)
        env.close()
