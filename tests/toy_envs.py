"""Small environments written against the public `Environment` API, for rollout and trainer tests.

They are test doubles of *user* environments (what a user writes in a few lines), not of TextWorld or ALFWorld:
tests of those use the real engines.
"""

import os
import time

from trl_multiturn import Environment, StepResult
from trl_multiturn.envs import TaskError


class CountingEnv(Environment):
    """Turn k (1-based) earns reward k; the episode is won after `task["target"]` turns, lost if the reply says
    "lose"."""

    def reset(self, task):
        target = task.get("target") if isinstance(task, dict) else None
        if not isinstance(target, int) or target < 1:
            raise TaskError(f"task {task!r}: give 'target', the number of turns to win (an int >= 1)")
        self.turn, self.target = 0, target
        return f"Count to {self.target}. Say anything."

    def step(self, action):
        self.turn += 1
        if "lose" in action:
            return StepResult(f"You lost at turn {self.turn}.", reward=0.0, done=True, won=False)
        done = self.turn >= self.target
        return StepResult(f"Observation number {self.turn}.", reward=float(self.turn), done=done, won=done)

    def expert_actions(self, task):
        return ["count"] * task["target"]


class FlakyEnv(CountingEnv):
    """Breaks the way real environments do, chosen by the task: raise, hang, or kill its process."""

    def step(self, action):
        mode = self.task_mode
        if mode == "raise":
            raise RuntimeError("engine crashed")
        if mode == "hang":
            time.sleep(60)
        if mode == "exit":
            os._exit(3)
        return super().step(action)

    def reset(self, task):
        self.task_mode = task.get("mode", "ok")
        return super().reset(task)


class ScoringOnFinishEnv(CountingEnv):
    """Never ends by itself; scores the episode when the rollout cuts it (like SWE-Gym grading the current diff)."""

    def step(self, action):
        self.turn += 1
        return StepResult(f"Step {self.turn}.", reward=0.0)

    def finish(self):
        return StepResult("graded", reward=5.0, done=True, won=True)


class CounterTools:
    """A TRL-style tool environment (what a TRL user writes for `GRPOTrainer(environment_factory=...)`): reach
    `target` by adding to a counter. Reward 0.5 for the first add, 1 more on reaching the target exactly; `done` once
    the counter reaches or passes it. No `won` attribute: wins are read off the reward."""

    def reset(self, target: int = 3, **row):
        self.count, self.target, self.reward, self.done = 0, target, 0.0, False
        return f" The counter is at 0; the target is {target}."

    def add(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add
        """
        if self.done:
            raise ValueError("The game is over.")
        self.count += n
        self.reward = max(self.reward, 0.5) + (1.0 if self.count == self.target else 0.0)
        self.done = self.count >= self.target
        return f"The counter is at {self.count}."

    def peek(self) -> str:
        """Look at the counter."""
        return f"The counter is at {self.count}."


class HugeObservationEnv(CountingEnv):
    """Answers its first step with a 1 MB observation (a whole file listing, say) when the task asks for it."""

    def step(self, action):
        result = super().step(action)
        if self.turn == 1 and isinstance(self.task_huge, int) and not result.done:
            result.observation = "look " * (self.task_huge // 5)
        return result

    def reset(self, task):
        self.task_huge = task.get("huge_bytes")
        return super().reset(task)


class ReplyScoringEnv(Environment):
    """Each turn's reward is a function of the reply's text (its share of distinct characters), so two runs that
    sample different replies earn different returns; the episode ends after `task["turns"]` turns."""

    def reset(self, task):
        self.turn, self.turns = 0, task["turns"]
        return "Write something varied."

    def step(self, action):
        self.turn += 1
        reward = len(set(action)) / max(1, len(action))
        return StepResult(f"Reply {self.turn} scored.", reward=reward, done=self.turn >= self.turns)


class TiesOnRequestEnv(ReplyScoringEnv):
    """`ReplyScoringEnv`, except that a task with `ties` set pays every reply 0.5 (its groups always tie) and is
    never won; another task is won when its last reply has no repeated character."""

    def reset(self, task):
        self.ties = task.get("ties", False)
        return super().reset(task)

    def step(self, action):
        result = super().step(action)
        if self.ties:
            result.reward = 0.5
        result.won = result.done and not self.ties and result.reward == 1.0
        return result


def reply_characters(completions, **kwargs):
    """A trajectory reward that differs between any two episodes whose replies differ: a group of sampled episodes
    then carries signal, so that a training step must change the weights."""
    return [float(sum(len(m["content"]) for m in c if m["role"] == "assistant")) for c in completions]


def openai_loop_agent(task, session):
    """An agent written on the `openai` client, as a user writes one: two calls, its reward a function of its last
    reply's text (for `AgentEnvironment`)."""
    client = session.openai()
    messages = [{"role": "user", "content": task["goal"]}]
    for k in range(2):
        reply = client.chat.completions.create(model=session.model, messages=messages).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": f"Room {k}."}]
    return sum(map(ord, reply.content)) % 11 / 10
