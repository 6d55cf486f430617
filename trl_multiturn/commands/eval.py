"""`trl-multiturn eval`: greedy success of a saved model on the held-out tasks of a registered environment suite
(`trl_multiturn.envs.suites`: TextWorld, ALFWorld, SWE-Gym, or a user's own).

Episode settings and the environment come from the model's `episode_settings.json` (what it was trained with);
every argument given (command line or `--config` YAML) wins over them, and one that differs from training is printed
as such. TextWorld plays the game shape the model was trained on unless a shape is given, ALFWorld its task types
unless `--task_types` is given. A model trained on an
environment this command cannot build (a user's own) is refused rather than played on another. A training recipe works
as `--config`: its training-only fields are ignored with a note, and when it names an `output_dir` (and no
`--model_name_or_path` is given on the command line), the model trained there is evaluated, or refused with what to
run when there is none yet. Each evaluation is written to its own `eval_results_<env>_<split>_<tasks>_<digest>.json`
(the digest is of the episode settings played), never over another: in the folder of a model given by its folder,
whose model card lists them all, else in `outputs/eval/<model>` (never the shared model cache of the offline
default), or `--results_dir`. An evaluation whose every task fails before it is scored is an error naming the first
reason. `--agent` (a function, an `AgentCommand` or an `AgentEnvironment`) or `--agent_command` (a command line)
evaluates an agent served by the model on the environment's held-out task rows, into the same result format.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config_checks import Range, config_field, field_like
from ..envs.suites import SUITES
from ..episode_settings import (
    environment_factory_from_spec,
    load_episode_settings,
    saved_environment_settings,
    saved_rules,
    saved_suite,
)
from ..evaluation import evaluate
from ..model_card import update_card_evaluation
from ..model_setup import ModelSetup, set_cpu_threads
from ..rollout.rules import EpisodeRules, overrides, rule_overrides
from .env_tasks import SHAPE_FIELDS, environment_overrides, shape_name, suite_tasks
from .episodes import episode_text
from .script_args import EnvArguments, task_noun
from .study.spec import StudyEval


@dataclass
@rule_overrides
class EvalArguments(EnvArguments):
    """Rules of play and held-out tasks of `trl-multiturn eval`. Each rule of play (`EpisodeRules`) is an optional
    argument: left unset, it is the one saved in the model's `episode_settings.json`, else the default in
    brackets."""

    batch_size: int = field_like(StudyEval, "batch_size")
    results_dir: str | None = field(
        default=None,
        metadata={"help": "Where to write the results (default: the folder of a model given by its folder, else "
                          "outputs/eval/<model>, never the shared model cache)."},
    )
    progress: bool = field(default=True, metadata={"help": "A progress bar while playing (--no_progress: none)."})
    show_episodes: int = config_field(
        0, "Print the first N played episodes turn by turn: observation, reply, action read, reward, outcome "
           "(`trl-multiturn play` prints every one).", range=Range(ge=0))
    save_results: bool = field(
        default=True,
        metadata={"help": "Write the results file and update the model card (--no_save_results, as `play` does: "
                          "nothing written)."},
    )
    cpu_threads: int | None = field_like(ModelSetup, "cpu_threads")
    agent: str | None = field(
        default=None,
        metadata={"help": "Evaluate an agent served by the model: a 'package.module:name' path to an agent function "
                          "(task_row, session) -> reward, an AgentCommand or an AgentEnvironment, or a function of no "
                          "arguments returning one (e.g. trl_multiturn.agents.mini_swe_agent:"
                          "mini_swe_agent_environment). It plays each held-out task through the chat endpoint; its "
                          "verdict (`won`) is the success."})
    agent_command: str | None = field(
        default=None,
        metadata={"help": "Evaluate a command-line agent served by the model: the command line, run once per task "
                          "with the endpoint in its environment (trl_multiturn.agents.AgentCommand)."})


def config_model_dir(config_remaining: list[str], cli_args: list[str]) -> str | None:
    """The `output_dir` a training recipe names, when the command line names no model: the model that recipe
    trains. Refused, naming the folder and what to run, when it holds no saved model yet (its starting model is
    not evaluated in its place)."""
    if "--model_name_or_path" in cli_args or "--output_dir" not in config_remaining:
        return None
    output_dir = config_remaining[config_remaining.index("--output_dir") + 1]
    if not Path(output_dir, "config.json").is_file():
        recipe = cli_args[cli_args.index("--config") + 1] if "--config" in cli_args[:-1] else "RECIPE"
        algorithm = next((name for name in ("dagger", "sft", "ppo", "rloo") if name in Path(recipe).stem), "grpo")
        raise FileNotFoundError(
            f"--config {recipe}: the model it trains is not there (no {Path(output_dir, 'config.json')}); train it "
            f"first (trl-multiturn train {algorithm} --config {recipe}), or name the model to evaluate with "
            "--model_name_or_path")
    return output_dir


def default_results_dir(model_name_or_path: str, model_path: str) -> Path:
    """Where `eval` writes when no --results_dir is given: the folder of a model the user named by its folder (a
    trained run's; its card lists the evaluation), else `outputs/eval/<model>`: never the shared model cache that
    the offline default (or a Hub id) resolves to."""
    if Path(model_name_or_path).expanduser().is_dir():
        return Path(model_path)
    return Path("outputs", "eval", model_name_or_path.replace(":", "-").replace("/", "--"))


def check_scored(result, tasks: int) -> None:
    """Refuse an evaluation in which every task failed before it could be scored (a success rate of 0/0 says
    nothing): one error naming the first failure's reason, which names the field and the fix."""
    if result.n == 0 and result.failed:
        first = next(ep.failure for ep in result.episodes if ep.failed)
        raise ValueError(f"all {tasks} held-out tasks failed before they could be scored; the first: {first}")


def given_fields(argv: list[str]) -> set[str]:
    """The fields `argv` sets itself: `--name` options and the keys of its `--config` YAML."""
    names = {arg[2:].split("=")[0] for arg in argv if arg.startswith("--")}
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        names |= set(yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text()) or {})
    return names


def choose_env(requested: str | None, trained_on: dict, model: str) -> str:
    """The environment to play: `--env`, else the one the model was trained on (the suite of its saved import path,
    `saved_suite`). A model trained on an environment this command cannot build is refused unless `--env` names
    one; an `--env` other than training's is printed."""
    trained = saved_suite(trained_on) or trained_on.get("name")
    if requested is None:
        if trained_on and trained not in SUITES:
            raise ValueError(f"{model} was trained on {trained_on.get('class') or trained!r}, which no registered "
                             f"suite names (trl-multiturn eval plays {', '.join(SUITES)}): register it with "
                             "trl_multiturn.envs.suites.register_suite, evaluate it with "
                             "trl_multiturn.evaluate(model, environment_factory, tasks), or give --env to play one of "
                             "those anyway")
        return trained or "textworld"
    if trained and requested != trained:
        print(f"note: --env {requested} differs from the environment the model was trained on "
              f"({trained_on.get('class') or trained})")
    return requested


def choose_alfworld_task_types(eval_args, trained_tasks: dict | None, given: set[str]) -> None:
    """Play the task types of the training games unless `--task_types` gives them (then nothing is printed: the
    paper trains on some types and evaluates on all six)."""
    trained = [shape["task_type"] for shape in (trained_tasks or {}).get("shapes", []) if "task_type" in shape]
    if trained and "task_types" not in given:
        eval_args.task_types = trained
        print(f"note: playing {', '.join(trained)} games, the task types the model was trained on (--task_types "
              "to play others)")


def choose_textworld_shape(script_args, trained_tasks: dict | None, given: set[str]) -> None:
    """Play the training games' shape unless the arguments give one (then a shape other than training's is
    printed). Training on several shapes needs an explicit one."""
    shapes = [{k: shape[k] for k in SHAPE_FIELDS} for shape in (trained_tasks or {}).get("shapes", [])
              if all(k in shape for k in SHAPE_FIELDS)]
    if not shapes or script_args.challenge:
        return
    named = "/".join(shape_name(shape) for shape in shapes)
    if given & set(SHAPE_FIELDS):
        chosen = {k: getattr(script_args, k) for k in SHAPE_FIELDS}
        if chosen not in shapes:
            print(f"note: playing {shape_name(chosen)} games; the model was trained on {named}")
        return
    if len(shapes) > 1:
        raise ValueError(f"the model was trained on several TextWorld shapes ({named}): give the one to play with "
                         "--world_size, --nb_objects and --quest_length")
    for key, value in shapes[0].items():
        setattr(script_args, key, value)
    print(f"note: playing {named} games, the shape the model was trained on")


def results_name(env: str, split: str, tasks: str, settings: dict) -> str:
    """`eval_results_<env>_<split>_<tasks>_<digest>.json`: one file per distinct evaluation."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"eval_results_{env}_{split}_{tasks}_{digest}.json"


def played_rules(saved: dict, eval_args, eval_max_turns: int | None = None) -> EpisodeRules:
    """The rules saved with the model (`saved_rules`) with those the arguments give (`--max_turns`, else the
    recipe's `eval_max_turns`) in their place; each given rule that differs from the saved one is printed."""
    trained = saved_rules(saved)
    given = {"max_turns": eval_max_turns} if eval_max_turns else {}
    given.update(overrides(eval_args))
    for name, value in given.items():
        if saved and value != getattr(trained, name):
            print(f"note: {name}={value!r} differs from the rule the model was trained by "
                  f"({getattr(trained, name)!r})")
    return dataclasses.replace(trained, **given)


def run_eval(parser, argv: list[str]) -> int:
    """Parse `argv` with `parser` (a `TrlParser` of `TextWorldScriptArguments` and `EvalArguments`), evaluate,
    print and save the result; exit code 0 when at least one episode was scored."""
    script_args, eval_args, config_remaining, cli_remaining = parser.parse_args_and_config(
        argv, return_remaining_strings=True, separate_remaining_strings=True)
    if cli_remaining:
        parser.error(parser.unknown_options(cli_remaining))
    trained = config_model_dir(config_remaining, argv)
    if trained:
        print(f"note: evaluating the model the recipe trained, output_dir={trained} "
              "(pass --model_name_or_path to evaluate another)")
        script_args.model_name_or_path = trained
    if config_remaining:
        ignored = sorted(key[2:] for key in config_remaining if key.startswith("--"))
        print(f"note: ignoring the config's training-only fields: {', '.join(ignored)}")
    model_path = script_args.model_path
    saved = load_episode_settings(model_path)
    spec = saved.get("environment") or {}
    env = choose_env(eval_args.env, spec, model_path)
    suite = SUITES[env]
    if env == "textworld":
        choose_textworld_shape(script_args, saved.get("tasks"), given_fields(argv))
    if env == "alfworld":
        choose_alfworld_task_types(eval_args, saved.get("tasks"), given_fields(argv))
    overrides = environment_overrides(env, script_args, eval_args)
    settings = {**saved_environment_settings(spec, env), **overrides}
    factory = environment_factory_from_spec(spec, env, **overrides)
    agent = eval_args.agent or eval_args.agent_command
    if agent is not None:
        from ..agents.spec import agent_environment

        factory = agent_environment(eval_args.agent, eval_args.agent_command)
    if "games_dir" in suite.aliases and not script_args.games_dir:
        script_args.games_dir = settings.get(suite.aliases["games_dir"])  # held-out games beside the training games
    tasks = suite_tasks(env, "eval", script_args, eval_args, settings)
    print(f"evaluating {f'the agent {agent} served by ' if agent else ''}{model_path} on {len(tasks)} held-out "
          f"{env} tasks ({suite.held_out})" + (f" by the rules of play saved in {model_path}" if saved else ""))
    import torch

    if not torch.cuda.is_available():
        set_cpu_threads(eval_args.cpu_threads)
    result = evaluate(model_path, factory, tasks, rules=played_rules(saved, eval_args, script_args.eval_max_turns),
                      temperature=script_args.eval_temperature, batch_size=eval_args.batch_size,
                      episode_settings=saved, progress=eval_args.progress)
    if agent is not None:
        result.settings["agent"] = agent
    how = "greedy" if script_args.eval_temperature == 0 else f"temperature-{script_args.eval_temperature:g}"
    for record in result.outcomes()[:eval_args.show_episodes]:
        print(episode_text(record))
    check_scored(result, len(tasks))
    print(f"held-out {how} evaluation on {len(tasks)} {task_noun(env)}: {result}")
    results_dir = eval_args.results_dir or default_results_dir(script_args.model_name_or_path, model_path)
    if eval_args.save_results:
        split = {"alfworld": eval_args.eval_split, "swegym": "held-out"}.get(env, "test")
        textworld_shape = env == "textworld" and not script_args.challenge
        shape = (shape_name({k: getattr(script_args, k) for k in SHAPE_FIELDS}) if textworld_shape
                 else script_args.challenge or {"alfworld": "+".join(eval_args.task_types or ["all-types"])}.get(env,
                                                                                                        env))
        name = results_name(env, split, f"{shape}-n{len(tasks)}", result.settings)
        path = result.save(results_dir, name, env=env, model=script_args.model_name_or_path, split=split,
                           tasks=f"{shape}, {len(tasks)} tasks")
        print(f"results: {path}")
        if update_card_evaluation(results_dir):
            print(f"model card updated: {Path(results_dir, 'README.md')}")
    return 0 if result.n else 1
