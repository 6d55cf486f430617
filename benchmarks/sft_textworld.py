"""Does multi-turn SFT on walkthroughs teach the model to win TextWorld games it has never seen?

Greedy success on held-out games (test-split seeds) before and after `MultiTurnSFTTrainer` on the walkthroughs of
training games (train-split seeds), with the offline default model (SmolLM2-135M-Instruct) on CPU:

    python benchmarks/sft_textworld.py          # w1-o2-q2 games (2-step quests), 48 train / 24 held out, ~7 min
    python benchmarks/sft_textworld.py --world-size 2 --nb-objects 3 --quest-length 4 --train-games 128

The evaluation is the same before and after (same games, system prompt, action parser, turn and token caps), so
the difference is what SFT taught. Prints one table; a measurement, not a pass/fail test. With the defaults on 2
shared CPU cores (one torch thread) it measured 0/24 before and 20/24 after SFT (2 epochs over 48 episodes, 248 s).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SYSTEM_PROMPT = ("You are playing a text adventure game. Reply with a single command, such as 'go north', "
                 "'take key' or 'open chest'.")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model path or Hub id (default: the offline SmolLM2-135M)")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--nb-objects", type=int, default=2)
    parser.add_argument("--quest-length", type=int, default=2)
    parser.add_argument("--train-games", type=int, default=48, help="SFT games: the first N train-split seeds")
    parser.add_argument("--test-games", type=int, default=24, help="held-out games: the first N test-split seeds")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4, help="turns per evaluation episode")
    parser.add_argument("--max-reply-tokens", type=int, default=12, help="tokens per evaluation reply")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 is fastest on a CPU shared with other jobs; 0: torch's choice)")
    parser.add_argument("--games-dir", default=None, help="game cache (default: TextWorldEnv's)")
    parser.add_argument("--output-dir", default=None, help="where the SFT checkpoint goes (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    from trl_multiturn import MultiTurnSFTConfig, MultiTurnSFTTrainer
    from trl_multiturn.envs import TextWorldEnv
    from trl_multiturn.envs.textworld.games import CustomGameSpec
    from trl_multiturn.envs.textworld.tasks import textworld_tasks
    from trl_multiturn.evaluation import evaluate
    from trl_multiturn.models import OFFLINE_DEFAULT_MODEL, resolve_model
    from trl_multiturn.rollout.rules import EpisodeRules

    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = resolve_model(args.model or OFFLINE_DEFAULT_MODEL)
    spec = CustomGameSpec(args.world_size, args.nb_objects, args.quest_length)
    env = functools.partial(TextWorldEnv, games_dir=args.games_dir)
    eval_kwargs = dict(rules=EpisodeRules(max_turns=args.max_turns, max_completion_length=args.max_reply_tokens,
                                          max_observation_tokens=None, system_prompt=SYSTEM_PROMPT,
                                          action_parser="first_line"))

    clock = time.perf_counter()
    shape = (args.world_size, args.nb_objects, args.quest_length)
    train_tasks = textworld_tasks(*shape, split="train", num_games=args.train_games, games_dir=args.games_dir)
    test_tasks = textworld_tasks(*shape, split="test", num_games=args.test_games, games_dir=args.games_dir)
    games_s = time.perf_counter() - clock

    clock = time.perf_counter()
    before = evaluate(model_path, env, test_tasks, **eval_kwargs)
    before_s = time.perf_counter() - clock
    print(f"before SFT: {before}  ({before_s:.0f} s)", flush=True)

    output_dir = args.output_dir or tempfile.mkdtemp(prefix="sft_textworld-")
    config = MultiTurnSFTConfig(
        output_dir=output_dir, system_prompt=SYSTEM_PROMPT, action_parser="first_line", max_length=None,
        num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
        lr_scheduler_type="linear", warmup_steps=2, activation_checkpointing=False, use_cpu=True, bf16=False,
        logging_steps=5, save_strategy="no", report_to="none", seed=args.seed,
    )
    clock = time.perf_counter()
    trainer = MultiTurnSFTTrainer(model_path, args=config, environment_factory=env, train_dataset=train_tasks)
    prepare_s = time.perf_counter() - clock
    episodes = trainer.train_dataset
    tokens = sum(len(ids) for ids in episodes["input_ids"])
    trained = sum(sum(label != -100 for label in labels) for labels in episodes["labels"])
    clock = time.perf_counter()
    result = trainer.train()
    train_s = time.perf_counter() - clock
    if args.output_dir:
        trainer.save_model(output_dir)

    clock = time.perf_counter()
    after = evaluate(trainer.model, env, test_tasks, trainer.processing_class, **eval_kwargs)
    after_s = time.perf_counter() - clock
    print(f"after SFT:  {after}  ({after_s:.0f} s)", flush=True)

    train_seeds, test_seeds = train_tasks["seed"], test_tasks["seed"]
    rows = [
        ("game set", f"TextWorld custom {spec.label} (generated, {games_s:.0f} s)"),
        ("train games (SFT)", f"{len(train_tasks)}: train-split seeds {train_seeds[0]}..{train_seeds[-1]}"),
        ("held-out games", f"{len(test_tasks)}: test-split seeds {test_seeds[0]}..{test_seeds[-1]}"),
        ("model", model_path),
        ("SFT examples", f"{len(episodes)} won walkthrough episodes, {sum(episodes['num_turns'])} assistant turns"),
        ("SFT tokens", f"{tokens} in total, {trained} trained (assistant turns incl. end-of-turn)"),
        ("SFT schedule", f"{args.epochs:g} epochs, {trainer.state.global_step} steps of {args.batch_size}, "
                         f"lr {args.learning_rate:g}, final train loss {result.training_loss:.3f}"),
        ("evaluation", f"greedy, max {args.max_turns} turns, {args.max_reply_tokens} tokens per reply, "
                       "first-line action parser, same system prompt as SFT"),
        ("success before SFT", str(before)),
        ("success after SFT", str(after)),
        ("time", f"eval before {before_s:.0f} s, dataset {prepare_s:.0f} s, SFT {train_s:.0f} s "
                 f"({tokens * args.epochs / train_s:.0f} tokens/s), eval after {after_s:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n| " + "quantity".ljust(width) + " | value |\n|" + "-" * (width + 2) + "|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
