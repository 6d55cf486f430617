"""Running a study: each run's SFT and RL stages, cached by the digest of their inputs and shared by every study
(`<output_dir>/sft-<key>`, `<output_dir>/<algorithm>-<key>`, with `stage.json`), a lock file so that two studies on
one machine never train the same stage, and the held-out evaluations (`<output_dir>/evals/<key>.json`)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from pathlib import Path

from ... import evaluation
from ...envs.suites import SUITES
from ...models import resolve_model
from ...trainers.sft import MultiTurnSFTTrainer
from ..train import evaluation_options, trainer_class
from .report import write_report
from .results import Results, write_json
from .spec import Study, StudyRun, build_configs, digest


def _has_checkpoint(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


STAGE_RECORD = "stage.json"  # a finished stage's record, saved beside its checkpoint for other studies to reuse


def _finished_stage(recorded: dict | None, path: Path) -> dict | None:
    """The record of a finished SFT or RL stage whose checkpoint is at `path`: the study's own record, else the one
    another study saved beside the checkpoint (equal keys mean equal inputs); None when it must be trained."""
    if recorded is not None and _has_checkpoint(recorded["path"]):
        return recorded
    if _has_checkpoint(path) and (path / STAGE_RECORD).is_file():
        return json.loads((path / STAGE_RECORD).read_text())
    return None


def _stage(what: str, recorded: dict | None, path: Path, inputs: dict, log, train) -> dict:
    """The record of the SFT or RL stage saved at `path`: reused when finished (`_finished_stage`), else trained by
    `train()` and saved with its `inputs` beside the checkpoint. A study waits while another study on this machine
    trains the same stage (a lock file beside it; not taken under `accelerate launch`, where every rank must train
    together), then reuses it."""
    with _stage_lock(path, lambda: log(f"{what}: waiting for the other study training {path}")):
        done = _finished_stage(recorded, path)
        if done is not None:
            log(f"{what}: checkpoint {done['path']} reused")
            return done
        log(f"{what} -> {path}")
        record = {**train(), "inputs": inputs}
        write_json(Path(record["path"], STAGE_RECORD), record)
        return record


@contextlib.contextmanager
def _stage_lock(path: Path, on_wait):
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing


def _jsonable_log(log: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if isinstance(v, (int, float, str, bool)) or v is None} for entry in log]


def train_sft(config, model: str, tasks, environment_factory) -> dict:
    clock = time.perf_counter()
    trainer = MultiTurnSFTTrainer(model, args=config, environment_factory=environment_factory, train_dataset=tasks)
    result = trainer.train()
    trainer.save_model(config.output_dir)
    return {"path": config.output_dir, "seconds": time.perf_counter() - clock, "steps": trainer.state.global_step,
            "examples": len(tasks), "train_loss": result.training_loss,
            "log": _jsonable_log(trainer.state.log_history)}


def train_rl(algorithm: str, config, model: str, tasks, environment_factory) -> dict:
    clock = time.perf_counter()
    trainer_cls = trainer_class(algorithm)
    trainer = trainer_cls(model=model, args=config, environment_factory=environment_factory, train_dataset=tasks)
    trainer.train()
    if trainer.state.global_step == 0:
        raise RuntimeError(f"{algorithm} trained no step on {len(tasks)} games: one step needs more games than that "
                           "(per_device_train_batch_size / num_generations per process); raise data.num_train_games "
                           "or lower rl.per_device_train_batch_size")
    trainer.save_model(config.output_dir)
    # Each generated batch is trained on `num_iterations` times (TRL's GRPO machinery; PPO's epochs).
    episodes = (trainer.state.global_step * config.per_device_train_batch_size * config.gradient_accumulation_steps
                * trainer.accelerator.num_processes // getattr(config, "num_iterations", 1))
    return {"path": config.output_dir, "seconds": time.perf_counter() - clock, "steps": trainer.state.global_step,
            "episodes": episodes, "log": _jsonable_log(trainer.state.log_history)}


def evaluate_run(run: StudyRun, model: str, tasks, environment_factory, episode) -> dict:
    clock = time.perf_counter()
    result = evaluation.evaluate(model, environment_factory, tasks, temperature=run.eval.temperature,
                                 batch_size=run.eval.batch_size, **evaluation_options(episode, run.eval.max_turns))
    suite = SUITES[run.data.env]
    outcomes = {suite.key(ep.task): bool(ep.won) for ep in result.episodes if not ep.failed}
    return {"model": model, "successes": result.successes, "n": result.n, "failed": result.failed,
            "ci_low": result.ci_low, "ci_high": result.ci_high, "mean_turns": result.mean_turns,
            "seconds": time.perf_counter() - clock, "outcomes": outcomes}


def evaluation_key(run: StudyRun, policy: str, tasks, episode) -> str:
    """Digest of what a held-out result depends on: the policy's name, the eval settings, the episode settings and
    the held-out games."""
    options = evaluation_options(episode, run.eval.max_turns)["rules"].to_dict()
    settings = {k: v for k, v in dataclasses.asdict(run.eval).items() if k != "start"}
    return digest({"policy": policy, "eval": settings, "episode": options, "env": run.data.env,
                    "tasks": [SUITES[run.data.env].key(task) for task in tasks]})[:12]


def _evaluation(study: Study, run: StudyRun, policy: str, model: str, tasks, environment_factory, episode,
                log) -> dict:
    """The held-out result of `model` (named `policy`: a stage folder's name, or the model id without SFT or RL),
    played once for every run of any study that evaluates that policy on the same held-out episodes: saved as
    `<output_dir>/evals/<key>.json`, the key a digest of the policy, the eval settings, the episode settings and the
    held-out games (`tasks`). The record carries its `key`."""
    key = evaluation_key(run, policy, tasks, episode)
    path = study.output_dir / "evals" / f"{key}.json"
    what = f"[{study.name}] {run.name}: {policy} on {len(tasks)} held-out games"
    with _stage_lock(path, lambda: log(f"{what}: waiting for the other study playing them")):
        if path.is_file():
            log(f"{what}: result {path} reused")
            return json.loads(path.read_text())
        log(f"{what}: playing")
        result = {**evaluate_run(run, model, tasks, environment_factory, episode), "key": key}
        write_json(path, result)
        return result


def run_study(study: Study, only: list[str] | None = None, log=print) -> Results:
    """Run the study's runs in order (or those named in `only`), skipping what the results JSON records."""
    results = Results(study.results.with_suffix(".json"), study.name)
    for run in study.runs:
        if only and run.name not in only:
            continue
        record = results.data["runs"].get(run.name)
        if record is not None and record.get("fingerprint") != run.fingerprint():
            log(f"[{study.name}] {run.name}: settings changed since it was recorded; running it again")
            record = None
        if record is not None and "eval" in record:
            log(f"[{study.name}] {run.name}: done, skipped")
            continue
        record = record or {"fingerprint": run.fingerprint(), "settings": run.settings(), "changed": run.changed,
                            "expected": run.expected}
        results.data["runs"][run.name] = record
        _run_one(study, run, record, results, log)
    write_report(study, results)
    return results


def _run_one(study: Study, run: StudyRun, record: dict, results: Results, log) -> None:
    environment_factory = run.data.environment_factory()
    model = resolve_model(run.model)
    key = run.sft_key()
    sft_config, rl_config, episode = build_configs(run, study.output_dir)
    where = f"[{study.name}] {run.name}"
    if sft_config is not None:
        done = _stage(f"{where}: SFT on {run.data.num_sft_games} games", results.data["sft"].get(key),
                      Path(sft_config.output_dir), run.sft_inputs(), log,
                      lambda: train_sft(sft_config, model, run.data.tasks("sft"), environment_factory))
        results.data["sft"][key] = done
        results.save()
        record["sft"] = key
        model = done["path"]
    start_model = model
    if rl_config is not None:
        done = _stage(f"{where}: {run.algorithm.upper()} on {run.data.num_train_games} games", record.get("rl"),
                      Path(rl_config.output_dir), run.rl_inputs(), log,
                      lambda: train_rl(run.algorithm, rl_config, model, run.data.tasks("train"), environment_factory))
        record["rl"] = done
        results.save()
        model = done["path"]
    # The policies by the names of their stages (digests of their inputs), whatever folder holds them.
    start_policy, policy = (stage.name if stage else None for stage in run.stage_dirs(Path()))
    start_policy = start_policy or run.model
    eval_tasks = run.data.tasks("eval")  # the same games for the start and the trained policy
    if run.eval.start and rl_config is not None:
        start = _evaluation(study, run, start_policy, start_model, eval_tasks, environment_factory, episode, log)
        results.data.setdefault("start", {})[start["key"]] = start
        record["start"] = start["key"]
        results.save()
    record["eval"] = _evaluation(study, run, policy or start_policy, model, eval_tasks, environment_factory, episode,
                                 log)
    results.save()
    ev = record["eval"]
    log(f"[{study.name}] {run.name}: {ev['successes']}/{ev['n']} held-out games won")
