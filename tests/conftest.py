"""Shared fixtures: offline settings and tiny models built in-process (no network)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import signal  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from trl_multiturn.testing import build_tiny_model  # noqa: E402

# Property-based tests: no per-example deadline (a shared CI core is slow), no example database written into the
# checkout, and the blob to replay a failure printed with it. Each test bounds its own `max_examples`.
settings.register_profile("trl_multiturn", deadline=None, database=None, print_blob=True)
settings.load_profile("trl_multiturn")


@pytest.fixture(scope="session")
def tiny_chatml_model(tmp_path_factory):
    """Path to a tiny random Llama-style model with Qwen2.5's ChatML template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chatml"), template="chatml")


@pytest.fixture(scope="session")
def tiny_llama3_model(tmp_path_factory):
    """Path to a tiny random model with the Llama-3 chat template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama3"), template="llama3")


@pytest.fixture(params=["chatml", "llama3"])
def tiny_model(request, tiny_chatml_model, tiny_llama3_model):
    """Both chat-template families, for tests that must hold on each."""
    return {"chatml": tiny_chatml_model, "llama3": tiny_llama3_model}[request.param]


@pytest.fixture(scope="session")
def textworld_games_dir(tmp_path_factory):
    """The session's TextWorld game cache: each game is generated once for all test files."""
    return tmp_path_factory.getbasetemp() / "textworld_games"


@pytest.fixture(scope="session")
def textworld_train_tasks(textworld_games_dir):
    """Two generated w2-o3-q4 games from the train split, as a task `Dataset` (rows carry `game_file`)."""
    from trl_multiturn.envs.textworld.tasks import textworld_tasks

    return textworld_tasks(2, 3, 4, split="train", num_games=2, games_dir=str(textworld_games_dir))


@pytest.fixture(scope="session")
def swegym_cache_dir(tmp_path_factory):
    """Every shipped SWE-Gym repository (and the sandboxes' task Python), built once for the session."""
    from trl_multiturn.envs.swegym import task_rows
    from trl_multiturn.envs.swegym.tasks import shipped_repo

    root = tmp_path_factory.mktemp("swegym-repos")
    for row in task_rows():
        shipped_repo(row["repo"], row["base_commit"], root)
    return str(root)


def tiny_rl_args(config_cls, output_dir, **overrides):
    """CPU-sized RL trainer arguments shared by the trainer tests."""
    args = dict(
        output_dir=str(output_dir), max_turns=3, num_generations=2, per_device_train_batch_size=4,
        max_completion_length=8, max_steps=2, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none",
        logging_steps=1, save_strategy="no", seed=0,
    )
    args.update(overrides)
    return config_cls(**args)


def record_sampled(trainer) -> dict[tuple, list[list[int]]]:
    """Wrap `trainer`'s generate function to record every reply sampled, by the context it was sampled from."""
    sampled, generate = {}, trainer.episode_runner.generate_fn

    def recorded(contexts, max_new_tokens):
        completions, logprobs = generate(contexts, max_new_tokens)
        for context, done in zip(contexts, completions):
            sampled.setdefault(tuple(context), []).append(list(done))
        return completions, logprobs

    trainer.episode_runner.generate_fn = recorded
    return sampled


def assert_trained_ids_are_sampled(inputs: dict, batch, sampled: dict) -> None:
    """TRL's rows (`inputs` of `_generate_and_score_completions` for rollout `batch`) hold the ids sampled (as
    `record_sampled` recorded them), from the context they were sampled from."""
    rows = batch.steps if batch.steps is not None else batch.episodes
    for row, sample in enumerate(rows):
        if sample is None:
            continue
        prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
        completion = inputs["completion_ids"][row].tolist()
        n = len(sample.completion_ids)
        assert prompt == sample.prompt_ids and completion[:n] == sample.completion_ids
        spans = [(0, n)] if batch.steps is not None else sample.turn_spans
        for start, end in spans:
            assert completion[start:end] in sampled[tuple(prompt + completion[:start])]


def follow_the_expert(env, limit: int):
    """Play `env`'s `expert_action` from its current state until it has none (or `limit` actions): (the actions, the
    last step's result)."""
    actions, result = [], None
    while (action := env.expert_action()) is not None and len(actions) < limit:
        actions.append(action)
        result = env.step(action)
    return actions, result


@pytest.fixture
def ctrl_c_raises():
    """Python's own Ctrl-C handler, as in a terminal: a background job of a non-interactive shell (CI's, often)
    starts with SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
