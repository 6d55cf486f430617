"""Run under `torchrun --nproc_per_node 2` (with `overlap` after the paths for `rollout_overlap`, `episode` for
`rollout_schedule="episode"`, `stepwise` for `episode_format="stepwise"` with `steps_per_batch=4`, `agent` for a
command-line agent in its own process per episode, `AgentCommand`, whose episodes make `target` model calls): one
training step
where rank 0's episodes end after one turn and rank 1's run three. Each rank writes how many generate calls it made;
they must be equal (DESIGN.md invariant 5: vLLM server mode gathers prompts from every rank per call, so unequal
counts would hang). Step-wise, each rank also writes (rows handed to TRL, rows that are steps rather than padding)."""

import json
import os
import sys
from pathlib import Path

from datasets import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toy_envs import CountingEnv  # noqa: E402

from trl_multiturn import MultiTurnGRPOConfig, MultiTurnGRPOTrainer  # noqa: E402
from trl_multiturn.agents import AgentCommand, AgentEnvironment  # noqa: E402

model, out = sys.argv[1], Path(sys.argv[2])
overlap = sys.argv[3:] == ["overlap"]  # `rollout_overlap`: the two halves of each rank's episodes take turns
schedule = "episode" if sys.argv[3:] == ["episode"] else "turn"
stepwise = dict(episode_format="stepwise", steps_per_batch=4) if sys.argv[3:] == ["stepwise"] else {}
agent = sys.argv[3:] == ["agent"]
args = MultiTurnGRPOConfig(
    output_dir=str(out), max_turns=4, num_generations=2, per_device_train_batch_size=2, max_completion_length=4,
    max_steps=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no", shuffle_dataset=False,
    action_parser="trl_multiturn.rollout.parsing:whole_reply", rollout_overlap=overlap,
    rollout_schedule=schedule, **stepwise, **(dict(reward_mode="dense") if agent else {}),
)
# Global batch of 4 = two groups; without shuffling rank 0 gets the target-1 group, rank 1 the target-3 group.
command = AgentCommand([sys.executable, str(Path(__file__).resolve().parents[1] / "agents" / "command_agent.py")])
trainer = MultiTurnGRPOTrainer(model=model, args=args,
                               environment_factory=AgentEnvironment(command) if agent else CountingEnv,
                               train_dataset=Dataset.from_list([{"target": 1, "turns": 1}, {"target": 3, "turns": 3}]))
calls = []
generate = trainer.episode_runner.generate_fn
trainer.episode_runner.generate_fn = lambda contexts, n: (calls.append(len(contexts)), generate(contexts, n))[1]
trainer.train()
rank = trainer.accelerator.process_index
(out / f"rank{rank}.json").write_text(json.dumps(calls))
if stepwise:
    steps = trainer.last_rollout.steps
    (out / f"rank{rank}_steps.json").write_text(json.dumps([len(steps), sum(s is not None for s in steps)]))
# Leave together, tear the gloo process group down, and skip interpreter finalisation: about one run in a hundred,
# after the results above are written, a rank aborts in torch's exit-time C++ destructors ("terminate called without
# an active exception"), which is not what this test is about.
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
