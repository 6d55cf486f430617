"""Rollout and trainer throughput in one table; not a test.

    nice -n 15 python benchmarks/rollout_throughput.py                 # about 3 minutes on 2 shared cores
    python benchmarks/rollout_throughput.py --episodes 32 --turns 10 --train-steps 6
    nice -n 15 python benchmarks/rollout_throughput.py --sections f    # the heavy-tailed rows alone

Rows (all with a tiny random model, so that the environment and the loop's own costs show):

(a) The delay environment (each step sleeps `--delay` s, no CPU) with the default settings, without and with
    `rollout_overlap`: wall time against the lockstep bound, the generation time plus turns x delay (what the rollout
    costs if every episode's step of a turn runs at once). With overlap one half's steps run while the other half
    generates, so the wall time can go below the bound.
(b) The same episodes played one at a time (a loop over single-episode rollouts): the serial cost.
(c) TextWorld (generated w2-o3-q4 games) and ALFWorld (the test fixture's real game) rollouts with the defaults,
    without and with overlap: episodes and sampled tokens per second, environment steps included.
(d) transformers against vLLM (CPU) generation: measured by `benchmarks/vllm_cpu.py` in its own venv; see the
    README (not re-run here).
(f) A heavy-tailed delay environment (each step sleeps a seeded lognormal time: median `--tail-median` s, p99 20x
    the median) at 16 and 64 episodes, lockstep (`rollout_schedule="turn"`) against `rollout_schedule="episode"`,
    and the physical bound of the episode-scheduled run: its longest episode's own environment time plus the time of
    the generate calls that episode took part in (no schedule can finish before that episode has). Each episode's
    step times depend only on the seed and the episode, so both schedules sleep the same times.
(e) Trainer time per trained (sampled) token: `MultiTurnGRPOTrainer` on a multi-turn environment against TRL's own
    single-turn `GRPOTrainer`, same model, batch, steps and sampled tokens per sequence (`--turns-per-episode` replies
    of `--reply-tokens` against one completion of their product). The first step (warm-up) is not timed. Per trained
    token the multi-turn trainer also pays for the observation and template tokens between turns, which the model
    reads but is not trained on; per batch token (every position the model reads) it does not. TRL's trainer also
    runs with its prompt padded to the multi-turn sequences' length: the same trained and read tokens per sequence.
(g) Steps per hour of `MultiTurnGRPOTrainer` where the environment dominates (the delay environment at `--lag-delay`
    s per step, `--turns-per-episode` turns), on-policy (`max_policy_lag=0`: each step waits for its rollout) against
    `max_policy_lag=1` (the next step's rollout plays while this step trains): the mean wall time of the steps after
    the first, median over `--train-repeats` alternating runs. The best overlap can give is (rollout + training) /
    max(rollout, training), which is near 1 when the rollout is much longer than a training step.

Prefix-tree packing of a step's rows against padded rows (forwarded tokens, time per optimizer step, peak memory) has
its own script and table: benchmarks/packing.py, benchmarks/results/packing.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl_multiturn import Environment, StepResult  # noqa: E402

ALFWORLD_FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "alfworld"
OPENING = "Wait for it."


class DelayEnv(Environment):
    """Every step sleeps `delay` seconds; episodes never end by themselves."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def reset(self, task):
        self.turn = 0
        return OPENING

    def step(self, action):
        time.sleep(self.delay)
        self.turn += 1
        return StepResult(f"Turn {self.turn}.", reward=0.0)


class HeavyTailEnv(Environment):
    """Each step sleeps a lognormal time (median `task["median"]` s, log-scale `TAIL_SIGMA`: p99 = 20x the median),
    drawn from a generator seeded by the task's seed and episode; never ends by itself. The slept time is the
    step's `info["env_s"]`."""

    def reset(self, task):
        self.rng = random.Random(f"{task['seed']}-{task['episode']}")
        self.median, self.episode = task["median"], task["episode"]
        return f"Episode {self.episode}. {OPENING}"

    def step(self, action):
        seconds = self.rng.lognormvariate(math.log(self.median), TAIL_SIGMA) if self.median > 0 else 0.0
        time.sleep(seconds)
        return StepResult("Go on.", reward=0.0, info={"env_s": seconds})


TAIL_SIGMA = math.log(20) / statistics.NormalDist().inv_cdf(0.99)  # p99 / median = exp(2.326 sigma) = 20


def timed_generator(model_dir: str):
    """(tokenizer, generate_fn, the calls made so far as (seconds, contexts))."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_multiturn.rollout.generation import hf_generate_fn

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    generate = hf_generate_fn(model, tokenizer, temperature=1.0)
    calls = []

    def timed(contexts, max_new_tokens):
        start = time.perf_counter()
        out = generate(contexts, max_new_tokens)
        calls.append((time.perf_counter() - start, contexts))
        return out

    return tokenizer, timed, calls


def seconds(calls) -> float:
    return sum(s for s, _ in calls)


def play(factory, rows, model_dir: str, turns: int, overlap: bool = False, one_at_a_time: bool = False,
         parser=None):
    """(wall s, generation s, episodes) of one timed rollout after a warm-up on the same rows, as a training run's
    rollouts after its first: every episode slot's worker process is started (forked) and its environment built."""
    from trl_multiturn.rollout import EpisodeRunner
    from trl_multiturn.rollout.rules import EpisodeRules

    tokenizer, generate, calls = timed_generator(model_dir)
    rules = EpisodeRules(max_turns=turns, max_completion_length=8, action_parser=parser or "first_line")
    runner = EpisodeRunner(factory, tokenizer, generate, rules, overlap=overlap)
    try:
        runner(rows)
        calls.clear()
        start = time.perf_counter()
        episodes = [ep for row in rows for ep in runner([row])] if one_at_a_time else runner(rows)
        return time.perf_counter() - start, seconds(calls), episodes
    finally:
        runner.close()


def wait_action(reply: str) -> str:
    return "wait"


def delay_rows(args, model_dir):
    """Rows (a) and (b)."""
    factory, rows = functools.partial(DelayEnv, args.delay), [{}] * args.episodes
    bound_steps = args.turns * args.delay
    out = []
    serial_wall, serial_gen, _ = play(factory, rows, model_dir, args.turns, one_at_a_time=True,
                                      parser=f"{__name__}:wait_action")
    for overlap in (False, True):
        wall, gen, _ = play(factory, rows, model_dir, args.turns, overlap=overlap, parser=f"{__name__}:wait_action")
        name = "(a) delay env, defaults" + (" + rollout_overlap" if overlap else "")
        out.append((name, wall, f"generation {gen:.2f} s; bound {gen + bound_steps:.2f} s",
                    f"wall / bound {wall / (gen + bound_steps):.2f}; {serial_wall / wall:.1f}x faster than (b)"))
    out.append(("(b) delay env, one episode at a time", serial_wall, f"generation {serial_gen:.2f} s",
                f"wall / bound {serial_wall / (serial_gen + bound_steps):.2f}"))
    return out


def environment_rows(args, model_dir, tmp):
    """Rows (c)."""
    from trl_multiturn.envs import ALFWorldEnv, TextWorldEnv
    from trl_multiturn.envs.alfworld import list_tasks
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    games_dir = os.path.join(tmp, "games")
    tw_tasks = list(textworld_tasks(2, 3, 4, split="train", num_games=args.games, games_dir=games_dir))
    alf_tasks = list(list_tasks(ALFWORLD_FIXTURE))
    cases = [("TextWorld w2-o3-q4", functools.partial(TextWorldEnv, games_dir=games_dir), tw_tasks),
             ("ALFWorld (fixture game)", functools.partial(ALFWorldEnv, data_path=str(ALFWORLD_FIXTURE)), alf_tasks)]
    out = []
    for name, factory, tasks in cases:
        rows = [tasks[i % len(tasks)] for i in range(args.env_episodes)]
        for overlap in (False, True):
            wall, gen, episodes = play(factory, rows, model_dir, args.turns, overlap=overlap)
            sampled = sum(sum(ep.env_mask) for ep in episodes)
            turns = sum(ep.num_turns for ep in episodes)
            out.append((f"(c) {name}, defaults" + (" + rollout_overlap" if overlap else ""), wall,
                        f"{len(rows)} episodes, {turns} turns; generation {gen:.2f} s",
                        f"{len(rows) / wall:.2f} episodes/s; {sampled / wall:.0f} sampled tokens/s"))
    return out


def heavy_tail_rows(args, model_dir):
    """Rows (f)."""
    from trl_multiturn.rollout import EpisodeRunner
    from trl_multiturn.rollout.rules import EpisodeRules

    tokenizer, timed, calls = timed_generator(model_dir)

    def episodes_in(contexts):
        return {int(re.search(r"Episode (\d+)\.", tokenizer.decode(c)).group(1)) for c in contexts}

    out = []
    for n in (16, 64):
        rows = [{"episode": k, "seed": args.seed, "median": args.tail_median} for k in range(n)]
        walls = {}
        for schedule in ("turn", "episode"):
            rules = EpisodeRules(max_turns=args.turns, max_completion_length=8,
                                 action_parser=f"{__name__}:wait_action")
            runner = EpisodeRunner(HeavyTailEnv, tokenizer, timed, rules, schedule=schedule)
            try:
                runner([{**row, "median": 0.0} for row in rows])  # warm-up: workers forked, environments built
                calls.clear()
                start = time.perf_counter()
                episodes = runner(rows)
                walls[schedule] = time.perf_counter() - start
            finally:
                runner.close()
            generation = seconds(calls)
            env_s = [sum(info["env_s"] for info in ep.infos) for ep in episodes]
            if schedule == "turn":
                out.append((f"(f) heavy-tailed delay env, {n} episodes, lockstep", walls["turn"],
                            f"{len(calls)} generate calls, {generation:.2f} s; environment time per episode: "
                            f"median {statistics.median(env_s):.2f} s, max {max(env_s):.2f} s", ""))
                continue
            members = [(s, episodes_in(contexts)) for s, contexts in calls]
            own_generation = [sum(s for s, held in members if k in held) for k in range(n)]
            longest = max(range(n), key=lambda k: env_s[k] + own_generation[k])
            bound = env_s[longest] + own_generation[longest]
            out.append((f"(f) heavy-tailed delay env, {n} episodes, rollout_schedule='episode'", walls["episode"],
                        f"{len(calls)} generate calls, {generation:.2f} s; bound {bound:.2f} s (episode {longest}: "
                        f"environment {env_s[longest]:.2f} s + its generate calls {own_generation[longest]:.2f} s)",
                        f"wall / bound {walls['episode'] / bound:.2f}; {walls['turn'] / walls['episode']:.1f}x "
                        f"faster than lockstep"))
    return out


def random_reward(completions, **kwargs):
    import random

    return [random.random() for _ in completions]


def padded_opening(model_dir: str, prompt_tokens: int) -> str:
    """OPENING followed by filler words, so that its chat-templated prompt is about `prompt_tokens` tokens long."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def length(words: int) -> int:
        text = " ".join([OPENING, *["wait"] * words])
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)
        return len(tokenizer(prompt, add_special_tokens=False).input_ids)

    per_word = (length(100) - length(0)) / 100
    return " ".join([OPENING, *["wait"] * max(0, round((prompt_tokens - length(0)) / per_word))])


def trainer_seconds_per_token(args, model_dir, tmp, multi_turn: bool, opening: str = OPENING):
    """(trained tokens, tokens in the batch, seconds) over the steps after the first. Trained tokens are the sampled
    ones (the loss mask); the batch's tokens are every position the model reads: prompt, replies and (multi-turn)
    observations and template tokens between turns. TRL's single-turn prompt is `opening`."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    common = dict(output_dir=os.path.join(tmp, f"train-{multi_turn}"), num_generations=4,
                  per_device_train_batch_size=args.train_batch, max_steps=args.train_steps, learning_rate=1e-5,
                  use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                  temperature=1.0)
    stamps, batch_tokens = [], []

    class StepClock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())
            if multi_turn:  # every position the step's episodes read (one rollout per step here)
                batch_tokens.append(sum(ep.num_tokens for ep in trainer.last_rollout.episodes))

    if multi_turn:
        config = MultiTurnGRPOConfig(max_turns=args.turns_per_episode, max_completion_length=args.reply_tokens,
                                     action_parser=f"{__name__}:wait_action", remove_unused_columns=False, **common)
        trainer = MultiTurnGRPOTrainer(model=model_dir, args=config, environment_factory=DelayEnv,
                                       reward_funcs=[random_reward],
                                       train_dataset=Dataset.from_list([{"task": i} for i in range(64)]),
                                       callbacks=[StepClock()])
    else:
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(max_completion_length=args.reply_tokens * args.turns_per_episode, **common)
        prompts = [{"prompt": [{"role": "user", "content": opening}]} for _ in range(64)]
        trainer = GRPOTrainer(model=model_dir, args=config, reward_funcs=[random_reward],
                              train_dataset=Dataset.from_list(prompts), callbacks=[StepClock()])
    trainer.train()
    logs = [log for log in trainer.state.log_history if "completions/mean_length" in log]
    trained = sum(log["completions/mean_length"] for log in logs[1:]) * args.train_batch
    if not multi_turn:  # TRL's `num_tokens`: prompt and completion tokens seen so far
        batch_tokens = [logs[0]["num_tokens"]] + [b["num_tokens"] - a["num_tokens"] for a, b in zip(logs, logs[1:])]
    return trained, sum(batch_tokens[1:]), stamps[-1] - stamps[0]


def trainer_rows(args, model_dir, tmp):
    """Rows (e): the trainers alternate `--train-repeats` times (a change in the machine's load hits all); each figure
    is the median over the repeats. TRL's single-turn GRPOTrainer runs twice per repeat: with the short opening (the
    same trained tokens per sequence), and with a prompt padded to the multi-turn sequences' length (the same trained
    tokens and the same tokens read per sequence: the like-for-like comparison)."""
    names = {"trl": "(e) TRL GRPOTrainer, single turn",
             "multi": "(e) MultiTurnGRPOTrainer, delay env (0 s)",
             "trl_long": "(e) TRL GRPOTrainer, single turn, prompt as long as the multi-turn context"}
    runs = {name: [] for name in names}
    opening = None
    for _ in range(args.train_repeats):
        for name in names:
            trained, batch, seconds = trainer_seconds_per_token(args, model_dir, tmp, name == "multi",
                                                                opening if name == "trl_long" else OPENING)
            runs[name].append((seconds / trained, seconds / batch, trained, batch, seconds))
            if name == "multi" and opening is None:  # tokens read per sequence beyond the trained ones
                opening = padded_opening(model_dir, round((batch - trained) / ((args.train_steps - 1)
                                                                             * args.train_batch)))
    med = {k: [statistics.median(run[i] for run in v) for i in range(5)] for k, v in runs.items()}
    out = []
    for key, name in names.items():
        per_trained, per_batch, trained, batch, seconds = med[key]
        ratio = ""
        if key == "multi":
            pairs = {base: ", ".join(f"{m[0] / t[0]:.2f}" for m, t in zip(runs["multi"], runs[base]))
                     for base in ("trl", "trl_long")}
            ratio = (f"; {per_trained / med['trl'][0]:.2f}x and {per_batch / med['trl'][1]:.2f}x TRL's short-prompt "
                     f"run (per trained token, run by run: {pairs['trl']}x); {per_trained / med['trl_long'][0]:.2f}x "
                     f"TRL's long-prompt run per trained token (run by run: {pairs['trl_long']}x)")
        out.append((name, seconds, f"{args.train_steps - 1} steps, {trained:.0f} trained of {batch:.0f} tokens; "
                    f"median of {args.train_repeats}", f"{per_trained * 1000:.2f} ms per trained token, "
                    f"{per_batch * 1000:.2f} ms per batch token{ratio}"))
    return out


def lagged_step_seconds(args, model_dir, tmp, lag: int) -> float:
    """Mean seconds per optimizer step after the first, for `max_policy_lag=lag` on the delay environment."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer

    stamps = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

    config = MultiTurnGRPOConfig(
        output_dir=os.path.join(tmp, f"lag-{lag}"), num_generations=4, per_device_train_batch_size=args.train_batch,
        max_steps=args.train_steps, learning_rate=1e-5, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", logging_steps=1, seed=0, max_turns=args.turns_per_episode,
        max_completion_length=args.reply_tokens, action_parser=f"{__name__}:wait_action",
        remove_unused_columns=False, max_policy_lag=lag)
    trainer = MultiTurnGRPOTrainer(model=model_dir, args=config,
                                   environment_factory=functools.partial(DelayEnv, args.lag_delay),
                                   reward_funcs=[random_reward],
                                   train_dataset=Dataset.from_list([{"task": i} for i in range(64)]),
                                   callbacks=[StepClock()])
    trainer.train()
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def policy_lag_rows(args, model_dir, tmp):
    """Rows (g): on-policy against `max_policy_lag=1`, alternating `--train-repeats` times; medians."""
    runs = {0: [], 1: []}
    for _ in range(args.train_repeats):
        for lag in runs:
            runs[lag].append(lagged_step_seconds(args, model_dir, tmp, lag))
    med = {lag: statistics.median(v) for lag, v in runs.items()}
    detail = (f"{args.train_steps - 1} timed steps, {args.train_batch} episodes x {args.turns_per_episode} turns, "
              f"delay env {args.lag_delay * 1000:.0f} ms per step; median of {args.train_repeats}")
    return [(f"(g) GRPO, max_policy_lag={lag}", med[lag] * (args.train_steps - 1), detail,
             f"{3600 / med[lag]:.0f} steps per hour ({', '.join(f'{s:.2f}' for s in runs[lag])} s per step)"
             + (f"; {med[0] / med[1]:.2f}x on-policy's" if lag else "")) for lag in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16, help="episodes of the delay environment")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds per step of the delay environment")
    parser.add_argument("--env-episodes", type=int, default=8, help="episodes of TextWorld and ALFWorld")
    parser.add_argument("--games", type=int, default=2, help="distinct w2-o3-q4 TextWorld games")
    parser.add_argument("--train-steps", type=int, default=12,
                        help="trainer steps (the first, which starts the environment workers, is not timed; with 3 "
                             "timed steps the run-by-run ratios spread over 1.15-1.41x)")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-repeats", type=int, default=3, help="alternating runs of each trainer")
    parser.add_argument("--turns-per-episode", type=int, default=4, help="replies per multi-turn training episode")
    parser.add_argument("--reply-tokens", type=int, default=8, help="tokens per reply of a training episode")
    parser.add_argument("--tail-median", type=float, default=0.05,
                        help="median seconds per step of the heavy-tailed delay environment (rows f)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the heavy-tailed step times")
    parser.add_argument("--lag-delay", type=float, default=0.05,
                        help="seconds per step of the delay environment of rows g")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="the rows to run (d is never re-run)")
    args = parser.parse_args()

    from trl_multiturn.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(os.path.join(tmp, "tiny"))
        rows = []
        for section in args.sections:
            rows += SECTIONS[section](args, model_dir, tmp)
    load = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} CPU cores, load average {load:.1f} at the end; delay env {args.delay * 1000:.0f} ms "
          f"per step, {args.episodes} episodes x {args.turns} turns; heavy-tailed delay env: median "
          f"{args.tail_median * 1000:.0f} ms per step, p99 20x, seed {args.seed}, {args.turns} turns\n")
    print("| row | wall (s) | detail | figure |")
    print("| --- | ---: | --- | --- |")
    for name, wall, detail, figure in rows:
        print(f"| {name} | {wall:.2f} | {detail} | {figure} |")
    print("| (d) transformers vs vLLM (CPU) | | SmolLM2-135M, TextWorld w1-o2-q2, 16 episodes x 4 turns | see "
          "`benchmarks/vllm_cpu.py` in the README (not re-run) |")


SECTIONS = {
    "a": lambda args, model_dir, tmp: delay_rows(args, model_dir),  # with (b)
    "c": environment_rows,
    "e": trainer_rows,
    "f": lambda args, model_dir, tmp: heavy_tail_rows(args, model_dir),
    "g": policy_lag_rows,
}


if __name__ == "__main__":
    main()
