"""What every multi-turn trainer shares: the config fields, and the mixin that builds the step's parts.

The trainers (GRPO, RLOO, PPO) mix `MultiTurnMixin` into their TRL parent. At the end of set-up it builds, once,
the parts of the training step (`step.MultiTurnStep`): the generation backend (`generation_backend.py`: the
episode-history cache, or the parent's own single-turn generation: transformers, vLLM colocate or server), the
episode runner over it, the episode source, the forwards, the trainer's credit (`_credit`), the scorer and the
step's log. TRL's private hooks stay here as one-line delegates to those parts, because TRL calls them on the
trainer.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate.utils import is_peft_model
from transformers import TrainerCallback
from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available
from trl.models.utils import prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import create_model_from_path, disable_dropout_in_model

from ..agents import AgentEnvironment, AgentRunner
from ..config_checks import Range, check_fields, check_value, config_field, field_range, parse_json_dict
from ..credit import get_estimator
from ..credit.rewards import REWARD_MODES
from ..models import resolve_model
from ..progress import TurnProgress
from ..rollout import Episode, EpisodeRunner
from ..rollout.env_pool import check_env_settings
from ..rollout.generation import generation_eos_ids, reply_eos_ids
from ..rollout.ray_pool import RAY_SCHEDULING, RayPlacement, check_ray_placement, parse_ray_resources
from ..rollout.rules import EpisodeRules, rule_fields
from ..rollout.runner import ROLLOUT_SCHEDULES, check_schedule
from ..rollout.training_template import use_training_chat_template_field
from ..run_lifetime import sigterm_stops_the_run
from .batch import RolloutBatch
from .distillation import TEACHER_SIGNALS, Distillation, check_teacher_vocabulary
from .dynamic_sampling import DynamicSampler, TaskShelf
from .episode_source import EpisodeSource
from .forwards import Forwards
from .generation_backend import GenerationBackend, Sampling
from .packing import PACKING_MODES, check_model_packing
from .policy_lag import LaggedRollouts
from .run_files import RunFilesMixin
from .scorer import Scorer
from .step import MultiTurnStep
from .step_log import StepLog
from .trl_compat import capped_replies, check_trl_attributes, check_trl_compat, single_turn_replies
from .vllm_cpu import colocated_vllm_on_cpu

logger = logging.getLogger(__name__)


def mask_truncated_field():
    """`mask_truncated_completions` of the multi-turn configs: TRL's field, with its multi-turn meaning."""
    return field(
        default=False,
        metadata={"help": "Leave truncated episodes out of the loss: those cut by `max_turns` or `max_episode_tokens` "
                          "before the environment ended them (`Episode.truncated`, counted in `episodes/truncated`). "
                          "They still count in the group baselines. A single reply cut at `max_completion_length` "
                          "does not make its episode truncated."},
    )


@dataclass
@rule_fields
class MultiTurnArguments:
    """Config fields shared by the multi-turn RL trainers (mixed into their TRL configs).

    The rules of play are `trl_multiturn.rollout.rules.EpisodeRules`' fields, added here by `rule_fields` with their
    defaults, help and ranges; `max_completion_length` (one reply's cap) and `chat_template_kwargs` are TRL's fields
    of the same names. Each field's help says more (`trl-multiturn train grpo --help`).

    Parameters:
        > Parameters that control the episode (the rules of play, `EpisodeRules`)

        max_turns (`int`, defaults to `8`):
            The most replies the model makes in one episode.
        max_episode_tokens (`int`, *optional*):
            Cap on a whole episode's tokens; an episode that would exceed it ends as truncated.
        max_observation_tokens (`int`, defaults to `8192`):
            Cap on one observation's tokens; a longer later observation ends its episode as truncated.
        system_prompt (`str`, *optional*):
            System message placed before the first observation.
        action_parser (`str`, defaults to `"first_line"`):
            How an action is read from a reply (a registered parser or a 'module:function' path).
        episode_format (`str`, defaults to `"trajectory"`):
            'trajectory' (one growing sequence per episode) or 'stepwise' (each turn its own sample).
        history (`str`, defaults to `"full"`):
            episode_format='stepwise': what each turn's context holds ('full', 'window:K' or a policy's path).

        > Parameters that control the reward and the credit

        reward_mode (`str`, defaults to `"sparse"`):
            How per-turn rewards are formed: 'sparse', 'dense', 'shaped' or 'dense_scaled'.
        success_reward (`float`, defaults to `1.0`):
            Reward for a won episode in the 'sparse' and 'shaped' reward modes.
        format_penalty (`float`, defaults to `0.0`):
            Subtracted from a turn's reward when the action parser cannot read its reply.
        turn_gamma (`float`, defaults to `1.0`):
            Per-turn discount of future rewards in the returns the estimators use.
        advantage_estimator (`str`, defaults to `"grpo"`):
            Name of the advantage estimator in `trl_multiturn.credit.ESTIMATORS`.
        estimator_kwargs (`dict`, *optional*):
            Extra options of the advantage estimator (a JSON object on the command line).

        > Parameters that control on-policy distillation

        teacher_model_name_or_path (`str`, *optional*):
            A teacher model (path or name) that scores every token the student samples (or the trainer's
            `teacher_model` argument, which also takes a model object).
        teacher_kl_coef (`float`, defaults to `1.0`):
            Weight of the teacher's per-token reward -(log pi - log pi_teacher) on the sampled tokens.
        teacher_signal (`str`, defaults to `"reward"`):
            'reward' (added to the environment's reward through the credit) or 'loss' (the teacher's per-token
            reward alone is the advantage).

        > Parameters that control the environments

        env_mode (`str`, defaults to `"auto"`):
            How environments run: 'auto', 'process', 'thread', 'ray' or 'inline'.
        env_timeout (`float`, *optional*):
            Seconds one environment call may take before its episode fails.
        max_failed_steps (`int`, defaults to `3`):
            Stop training once this many steps in a row had every episode fail.
        env_max_memory_mb (`float`, *optional*):
            Restart an environment worker between episodes once its private memory exceeds this many MiB.
        env_ray_address (`str`, *optional*):
            env_mode='ray': the Ray cluster the environment actors run on.
        env_ray_num_cpus (`float`, defaults to `1.0`):
            env_mode='ray': CPUs Ray reserves for each environment actor.
        env_ray_resources (`dict[str, float]`, *optional*):
            env_mode='ray': custom Ray resources each environment actor needs.
        env_ray_scheduling (`str`, defaults to `"DEFAULT"`):
            env_mode='ray': Ray's scheduling strategy for the environment actors ('DEFAULT' or 'SPREAD').

        > Parameters that control the rollout

        rollout_overlap (`bool`, defaults to `False`):
            Split each rollout's episodes into two halves whose generation and environment steps take turns.
        rollout_schedule (`str`, defaults to `"turn"`):
            'turn' (one generate call per turn for every live episode) or 'episode' (no episode waits for a
            straggler).
        cache_episode_history (`bool`, defaults to `True`):
            Keep the live episodes' key/value cache from one turn to the next (transformers generation).
        max_policy_lag (`int`, defaults to `0`):
            0: on-policy; k >= 1: play the next rollout in the background from weights at most k steps old.
        policy_lag_is_cap (`float`, defaults to `3.0`):
            max_policy_lag >= 1: the cap of the per-token importance weight.

        > Parameters that control the training step

        steps_per_batch (`int`, *optional*):
            episode_format='stepwise': the step samples each process trains on per generation batch.
        count_episodes_once (`bool`, defaults to `True`):
            In a loss that averages each row first, an episode that becomes k rows counts once, not k times.
        packing (`str`, defaults to `"auto"`):
            How a step's forwards lay out their rows: 'prefix', 'padded' or 'auto'.

        > Parameters that control dynamic sampling

        dynamic_sampling (`bool`, defaults to `False`):
            Keep drawing tasks until the step holds as many groups whose returns differ as TRL's rows had.
        dynamic_sampling_max_draws (`int`, defaults to `4`):
            dynamic_sampling: the most rollouts one training step plays, TRL's rows the first.
        dynamic_sampling_set_aside_steps (`int`, defaults to `0`):
            dynamic_sampling: optimizer steps a task that keeps tying is set aside for (0: never).
        dynamic_sampling_set_aside_ties (`int`, defaults to `2`):
            dynamic_sampling_set_aside_steps > 0: the tied plays in a row that set a task aside.

        > Parameters that control the chat template and the saved episodes

        chat_template_path (`str`, *optional*):
            A Jinja chat template file (or a folder holding chat_template.jinja) that replaces the tokenizer's.
        use_training_chat_template (`bool`, defaults to `True`):
            Switch to TRL's training version of a chat template that rewrites earlier turns (e.g. Qwen3's).
        save_episodes (`bool`, defaults to `False`):
            Save every rollout's played episodes as parquet under `output_dir/episodes/`.
    """

    # Parameters that control the episode (the rules of play): `EpisodeRules`' fields, added by `rule_fields`

    # Parameters that control the reward and the credit
    reward_mode: str = config_field(
        "sparse", "How per-turn rewards are formed: 'sparse' (success_reward on the final turn of a won episode), "
                  "'dense' (the environment's per-turn rewards), 'shaped' (dense plus the success reward), "
                  "'dense_scaled' (dense, divided in a won episode by its number m of non-zero rewards (the paper's "
                  "dense-reward scaling) and in a lost one by m + 1, so that a loss returns less than a win).",
        choices=REWARD_MODES)
    success_reward: float = config_field(
        1.0, "Reward for a won episode in the 'sparse' and 'shaped' reward modes.", range=Range())
    format_penalty: float = config_field(
        0.0, "Subtracted from a turn's reward when the action parser cannot read its reply.",
        range=Range(ge=0, text="a number >= 0 (it is subtracted from the reward of a turn whose reply the action "
                               "parser cannot read)"))
    turn_gamma: float = config_field(
        1.0, "Per-turn discount of future rewards in the returns the estimators use.", range=Range(ge=0, le=1))
    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "Name of the advantage estimator in `trl_multiturn.credit.ESTIMATORS` (e.g. 'grpo', "
                          "'rloo', 'turn_grpo', 'gigpo')."},
    )
    estimator_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Extra options of the advantage estimator, e.g. {'step_weight': 0.5} for 'gigpo' (a JSON "
                          "string on the command line)."},
    )

    # Parameters that control on-policy distillation
    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "On-policy distillation: a causal LM (a path or Hub name; in Python the trainer's "
                          "`teacher_model` argument also takes a model object) that scores every token the student "
                          "sampled in its episodes. Each sampled token gets the reward -teacher_kl_coef * "
                          "(log pi(y_t) - log pi_teacher(y_t)), the negative of the per-token reverse KL; "
                          "observation tokens get none. The teacher must share the student's tokenizer (refused at "
                          "start otherwise). Loaded as TRL loads a reference model (`model_init_kwargs`), frozen, "
                          "its forwards packed as the reference's (padded where it cannot take the packed mask). "
                          "None: no teacher."},
    )
    teacher_kl_coef: float = config_field(
        1.0, "With a teacher: the weight of its per-token reward -(log pi(y_t) - log pi_teacher(y_t)) on each sampled "
             "token (logged: `teacher/reverse_kl`, the mean reverse KL per trained token, and `teacher/reward_share`, "
             "the teacher's share of the batch's reward magnitude).",
        range=Range(gt=0, text="a number > 0 (the weight of the teacher's per-token reward; to train without a "
                               "teacher, leave teacher_model_name_or_path unset)"))
    teacher_signal: str = config_field(
        "reward", "With a teacher: 'reward' adds its per-token rewards to the environment's reward through the "
                  "trainer's credit (GRPO and RLOO: each turn's sum joins that turn's reward before the advantage "
                  "estimator; PPO: each token's reward before GAE); 'loss' trains on the teacher alone, each sampled "
                  "token's advantage its own teacher reward (no baseline, no discount: on-policy distillation's "
                  "per-token reverse-KL policy gradient; the environment still plays and is logged). See "
                  "docs/distillation.md.",
        choices=TEACHER_SIGNALS)

    # Parameters that control the environments
    env_mode: str = field(
        default="auto",
        metadata={"help": "How environments run: 'auto' (what the environment class declares in its `execution` "
                          "attribute: worker processes for TextWorld, ALFWorld and user environments, threads for "
                          "SWE-Gym), 'process' (one worker process per episode), 'thread' (one thread per call, in "
                          "this process), 'ray' (one Ray actor per episode, on any node of a Ray cluster: see the "
                          "env_ray_* fields) or 'inline' (in this process, one after another, no timeout: for "
                          "debugging). Every mode but 'inline' steps all live episodes at once."},
    )
    env_timeout: float | None = config_field(
        None, "Seconds one environment call (reset, step, finish) may take before its episode fails (None: no "
              "deadline). Not with env_mode='inline'.",
        range=Range(gt=0, text="a number of seconds > 0, or None for no deadline"))
    max_failed_steps: int = config_field(
        3, "Stop training with the environments' reasons (`EpisodesFailedError`) once this many steps in a row had "
           "every episode fail (a broken environment or task set trains nothing: each such step has no loss).",
        range=Range(ge=1, text="an integer >= 1 (training steps in a row whose every episode failed)"))
    env_max_memory_mb: float | None = config_field(
        None, "Restart an environment worker between episodes once its private memory exceeds this many MiB (for "
              "environments that leak; None: no limit). Needs worker processes.",
        range=Range(gt=0, text="a number of MiB > 0, or None for no limit"))
    env_ray_address: str | None = field(
        default=None,
        metadata={"help": "env_mode='ray': the Ray cluster the environment actors run on ('auto': the one `ray start` "
                          "runs on this machine; 'ray://host:10001': a remote one; 'local': a new local cluster the "
                          "trainer starts and stops; None: RAY_ADDRESS if set, else the latest cluster started on "
                          "this machine, else a new local one)."},
    )
    env_ray_num_cpus: float = config_field(
        1.0, "env_mode='ray': CPUs Ray reserves for each environment actor (a fraction packs several per core; an "
             "actor that finds no free CPU waits for one).",
        range=Range(ge=0, text="a number of CPUs >= 0 per environment actor (e.g. 0.25)"))
    env_ray_resources: dict[str, float] | str | None = field(
        default=None,
        metadata={"help": "env_mode='ray': custom Ray resources each environment actor needs, e.g. "
                          "'{\"env_node\": 0.01}' to keep environments on the nodes started with `ray start "
                          "--resources='{\"env_node\": 1000}'` (a JSON string on the command line)."},
    )
    env_ray_scheduling: str = config_field(
        "DEFAULT", "env_mode='ray': Ray's scheduling strategy for the environment actors: 'DEFAULT' (fill nodes) or "
        "'SPREAD' (across the nodes).", choices=RAY_SCHEDULING)

    # Parameters that control the rollout
    rollout_overlap: bool = field(
        default=False,
        metadata={"help": "Split each rollout's episodes into two halves that take turns: while the model generates "
                          "for one half, the other half's environment steps run. Worth it when a step takes about as "
                          "long as a generate call (sandboxes, remote or slow engines); with fast environments it "
                          "only halves the generation batch. The same number of generate calls on every rank."},
    )
    rollout_schedule: str = config_field(
        "turn",
        "'turn' (lockstep: each turn is one generate call for every live episode, and the next "
        "turn waits for the slowest environment step) or 'episode' (an episode whose environment "
        "has answered goes to the next generate call at once, batched with every other episode "
        "ready by then, while slower steps keep running: no episode waits for a straggler). Under "
        "greedy decoding both play the same episodes. Ranks still make equal numbers of generate "
        "calls (a rank with no episode ready makes a dummy call), so vLLM server mode and ZeRO-3 "
        "work. Not with rollout_overlap.",
        choices=ROLLOUT_SCHEDULES)
    cache_episode_history: bool = field(
        default=True,
        metadata={"help": "On the transformers generation path, keep the live episodes' key/value cache from one "
                          "turn to the next, so that each token of an episode is processed once per rollout "
                          "(`CachedGenerator`). Off: TRL's `generate` re-reads each episode's whole history every "
                          "turn. Applies only to plain sampling (temperature, top_p, top_k) and models whose token "
                          "mixing is attention (not Mamba, Gated DeltaNet or convolution layers); with vLLM, "
                          "continuous batching, min_p, repetition_penalty or generation_kwargs, TRL's own generation "
                          "is used."},
    )
    max_policy_lag: int = config_field(
        0, "0: on-policy (each step's rollout is played by the weights it trains). k >= 1: the rollout for the next "
           "step is played in the background while this step trains, from a snapshot of the weights at most k "
           "optimizer steps old (refreshed only when it would be older), and each sampled token's loss is "
           "multiplied by its truncated importance weight min(pi_current / pi_behaviour, policy_lag_is_cap). The "
           "lag of the samples is logged (`policy_lag/mean`, `policy_lag/max`); a sample older than k is dropped "
           "from the loss (`policy_lag/dropped`). GRPO on one process, transformers generation only; see "
           "docs/policy_lag.md.",
        range=Range(ge=0, text="an integer >= 0 (0: on-policy; k: sample from weights at most k optimizer steps old)"))
    policy_lag_is_cap: float = config_field(
        3.0, "max_policy_lag >= 1: the cap of the per-token importance weight pi_current / pi_behaviour (TRL's "
             "token_truncate; the default is TRL's vllm_importance_sampling_clip_max).",
        range=Range(gt=0, text="a number > 0 (the most one token's importance weight may be)"))

    # Parameters that control the training step
    steps_per_batch: int | None = config_field(
        None, "episode_format='stepwise': the number of step samples each process trains on per generation batch: a "
              "uniformly drawn subset of the steps played when there are more, padded with untrained samples when "
              "fewer. None: every step played, padded up to a multiple of num_generations * steps_per_generation "
              "(one process only). Must be a multiple of steps_per_generation, and (times the number of processes) "
              "of num_generations.",
        range=Range(ge=1, text="a positive number of step samples per process (an integer), or None"))
    count_episodes_once: bool = field(
        default=True,
        metadata={"help": "One episode, one weight. When an episode becomes k training rows (episode_format="
                          "'stepwise', or an agent that rewrote its history) and the loss averages each row over "
                          "its tokens before averaging the rows (GRPO's loss_type 'grpo' or 'sapo', RLOO's "
                          "loss_granularity='episode'), each of its rows' advantages is scaled by R / (E k) (R rows "
                          "and E episodes that train a token, per process), so the episode weighs what its one row "
                          "weighs in the trajectory format. False: every row counts once (TRL's), an episode k "
                          "times. The token-summed losses (dapo, bnpo, dr_grpo, cispo, luspo, PPO's) already weigh "
                          "an episode by its tokens however many rows hold them; the group baselines count each "
                          "episode once either way (docs/stepwise.md, 'One episode, one weight')."},
    )
    packing: str = config_field(
        "auto",
        "How a step's forwards (old, reference and the loss's log-probs; PPO's critic values) lay "
        "out its rows: 'prefix' forwards each shared token prefix once (a group's prompt, a "
        "step-wise episode's earlier turns) with a prefix-tree attention mask, 'padded' forwards "
        "each row whole, 'auto' packs where the model's attention takes the mask and a cost model "
        "says it is cheaper. The log-probs and values are the same either way "
        "(trl_multiturn/trainers/packing.py; benchmarks/packing.py measures the saving). On "
        "several processes each packs its own rows, all running as many forwards.",
        choices=PACKING_MODES)

    # Parameters that control dynamic sampling
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO's dynamic sampling, for GRPO and RLOO: a group whose episodes' returns (under "
                          "reward_mode, reward_funcs not included) all tie trains nothing, so a training step keeps "
                          "drawing tasks from train_dataset (beyond TRL's rows) until it holds as many groups whose "
                          "returns differ as TRL's rows had, or has played dynamic_sampling_max_draws rollouts; if "
                          "too few were found, tied groups fill the batch. Groups played but not trained are dropped "
                          "and counted (`dynamic_sampling/dropped_groups`; never kept for a later step, where they "
                          "would be off-policy), and saved as '...-dropped' with save_episodes. Logged: "
                          "`dynamic_sampling/draws`, `tied_fraction`, `groups_kept`, `tied_groups_trained`. Each "
                          "process's rows must hold whole groups. Off by default: see docs/dynamic_sampling.md."},
    )
    dynamic_sampling_max_draws: int = config_field(
        4, "dynamic_sampling: the most rollouts one training step plays, TRL's rows the first (each further draw "
           "plays as many groups as the tie rate seen so far says the step still needs, at most a batch's).",
        range=Range(ge=1, text="an integer >= 1 (rollouts per training step, the first included)"))
    dynamic_sampling_set_aside_steps: int = config_field(
        0, "dynamic_sampling: curriculum by difficulty. A task whose group tied (all won: too easy, or all lost: too "
           "hard) in dynamic_sampling_set_aside_ties plays in a row is set aside for this many optimizer steps: "
           "draws skip it and, among TRL's rows, it is replaced by a drawn task (logged: "
           "`dynamic_sampling/set_aside_tasks`, `newly_set_aside`, `replaced_tasks`). Each process keeps its own; "
           "a resumed run starts with none set aside. 0: never.",
        range=Range(ge=0, text="an integer >= 0 (optimizer steps; 0 sets no task aside)"))
    dynamic_sampling_set_aside_ties: int = config_field(
        2, "dynamic_sampling_set_aside_steps > 0: how many plays in a row a task's group must tie to be set aside.",
        range=Range(ge=1, text="an integer >= 1 (tied plays in a row)"))

    # Parameters that control the chat template and the saved episodes
    chat_template_path: str | None = field(
        default=None,
        metadata={"help": "A Jinja chat template file (or a folder holding chat_template.jinja) that replaces the "
                          "tokenizer's template, e.g. one of TRL's trl/chat_templates/*_training.jinja. Saved with "
                          "the model's tokenizer."},
    )
    use_training_chat_template: bool = use_training_chat_template_field()
    save_episodes: bool = field(
        default=False,
        metadata={"help": "Save every rollout's played episodes (messages, per-turn rewards, outcome, task, tokens) "
                          "as parquet under `output_dir/episodes/` (`train-step-N-rankR.parquet`, `eval-...`); read "
                          "them back with `trl_multiturn.episode_data.load_episodes`, e.g. to keep the won ones for "
                          "rejection-sampling SFT."},
    )

    def __post_init__(self):
        self.check_multiturn_args()

    def check_multiturn_args(self) -> None:
        """Refuse values that cannot work, naming the field and the fix (values that need the tokenizer or the
        environment are checked by the trainer's constructor)."""
        check_fields(self, inherited=False)  # inherited fields: checked as given, before the parent's __post_init__
        self.estimator_kwargs = parse_estimator_kwargs(self.estimator_kwargs)
        refuse_unused_fields(self, self.unused_fields())
        self.check_advantage_estimator()
        self.episode_rules().episode_format_strategy().check_config(self)
        check_env_settings(self.env_mode, self.env_timeout, self.env_max_memory_mb)
        check_schedule(self.rollout_schedule, self.rollout_overlap)
        self.check_policy_lag()
        self.check_teacher_signal()
        self.check_dynamic_sampling()
        self.env_ray_resources = parse_ray_resources(self.env_ray_resources)
        check_ray_placement(self.env_mode, self.ray_placement())

    def episode_rules(self) -> EpisodeRules:
        """The rules this config's episodes are played by (checked: a bad rule raises naming it)."""
        return EpisodeRules.from_config(self)

    def ray_placement(self) -> RayPlacement:
        """The `env_ray_*` fields, for `EnvPool(mode="ray")`."""
        return RayPlacement(self.env_ray_address, self.env_ray_num_cpus, self.env_ray_resources,
                            self.env_ray_scheduling)

    def unused_fields(self) -> dict[str, str]:
        """The fields of this config that its trainer ignores, each with what to use instead: `check_multiturn_args`
        refuses any of them set to a value other than its default."""
        return {}

    def policy_lag_refusal(self) -> str | None:
        """Why this config's trainer cannot train with `max_policy_lag >= 1`, with what to use; None if it can."""
        return None

    def check_policy_lag(self) -> None:
        """Refuse `max_policy_lag >= 1` with what it does not support: the background rollout samples from a snapshot
        through the episode-history cache, one rollout ahead, on one process."""
        lag = self.max_policy_lag
        if not lag:
            return
        refusal = self.policy_lag_refusal()
        if refusal:
            raise ValueError(f"max_policy_lag={lag} is not supported by {type(self).__name__}: {refusal}")
        given = {
            "use_vllm": (getattr(self, "use_vllm", False), "the snapshot generates on the transformers path: set "
                         "use_vllm=False"),
            "rollout_overlap": (self.rollout_overlap, "set rollout_overlap=False (the next rollout already runs "
                                "while this step trains)"),
            "rollout_schedule": (self.rollout_schedule != "turn", "set rollout_schedule='turn'"),
            "episode_format": (self.episode_format != "trajectory", "set episode_format='trajectory'"),
            "cache_episode_history": (not self.cache_episode_history, "the snapshot samples through the "
                                      "episode-history cache: set cache_episode_history=True"),
            "min_p": (getattr(self, "min_p", None) is not None, "the episode-history cache samples with temperature, "
                      "top_p and top_k only: leave min_p unset"),
            "repetition_penalty": (getattr(self, "repetition_penalty", 1.0) != 1.0, "the episode-history cache "
                                   "has none: leave repetition_penalty at 1.0"),
            "generation_kwargs": (bool(getattr(self, "generation_kwargs", None)), "the episode-history cache takes "
                                  "no generation_kwargs: leave them unset"),
            "use_transformers_continuous_batching": (getattr(self, "use_transformers_continuous_batching", False),
                                                     "set it to False"),
            "loss_type": (getattr(self, "loss_type", None) == "vespo", "VESPO weighs sequences itself: choose "
                          "another loss_type (e.g. 'dapo')"),
        }
        for name, (refused, fix) in given.items():
            if refused:
                raise ValueError(f"max_policy_lag={lag} with {name}={getattr(self, name)!r} is not supported: {fix}")
        span = policy_lag_span(self)
        if span is None or span > lag:
            raise ValueError(f"max_policy_lag={lag}: one generation batch is trained over steps_per_generation * "
                             f"num_iterations / gradient_accumulation_steps = {self.steps_per_generation} * "
                             f"{self.num_iterations} / {self.gradient_accumulation_steps} optimizer steps, which must "
                             f"be a whole number <= max_policy_lag: raise max_policy_lag to it, or set "
                             f"steps_per_generation=gradient_accumulation_steps and num_iterations=1")

    def teacher_loss_refusal(self) -> str | None:
        """Why this config's trainer cannot train with `teacher_signal='loss'`, with what to use; None if it can."""
        return None

    def check_teacher_signal(self) -> None:
        """Refuse `teacher_signal='loss'` where the trainer cannot train on the teacher's per-token advantages."""
        refusal = self.teacher_loss_refusal() if self.teacher_signal == "loss" else None
        if refusal:
            raise ValueError(f"teacher_signal='loss' is not supported by {type(self).__name__}: {refusal}")

    def check_dynamic_sampling(self) -> None:
        """Refuse `dynamic_sampling` where it cannot work: with `max_policy_lag` (whose rollout is played in the
        background on TRL's rows), or when a process's rows do not hold whole groups (each process decides on its own
        groups). TRL's GRPO and RLOO configs refuse groups of one episode (which would always tie) themselves."""
        if not self.dynamic_sampling:
            return
        generations = getattr(self, "num_generations", None) or 1
        if self.max_policy_lag:
            raise ValueError(f"dynamic_sampling=True with max_policy_lag={self.max_policy_lag} is not supported (the "
                             "lagged rollout is played in the background on TRL's rows): set max_policy_lag=0 or "
                             "dynamic_sampling=False")
        rows = getattr(self, "per_device_train_batch_size", 1) * (getattr(self, "steps_per_generation", None) or 1)
        if rows % generations:
            raise ValueError(f"dynamic_sampling=True needs each process's rows to hold whole groups: "
                             f"per_device_train_batch_size * steps_per_generation = {rows} is not a multiple of "
                             f"num_generations={generations}; make per_device_train_batch_size a multiple of it")

    def check_advantage_estimator(self) -> None:
        """Raise if `advantage_estimator` is not registered or `estimator_kwargs` holds options it does not take.
        Trainers whose estimators live in another registry (PPO's value-based ones) override this."""
        check_estimator_kwargs(self.advantage_estimator, get_estimator(self.advantage_estimator),
                               self.estimator_kwargs)


def policy_lag_span(config) -> int | None:
    """The optimizer steps between two rollouts: TRL generates every `steps_per_generation * num_iterations` micro
    batches, `gradient_accumulation_steps` to an optimizer step (None when that is not a whole number). 1 outside a
    TRL config."""
    micro = (getattr(config, "steps_per_generation", None) or 1) * getattr(config, "num_iterations", 1)
    accumulation = getattr(config, "gradient_accumulation_steps", 1)
    return micro // accumulation if micro % accumulation == 0 else None


def refuse_unused_fields(config, unused: dict[str, str]) -> None:
    """Raise one ValueError naming every field of `unused` (field -> what to use instead) that `config` sets to a
    value other than the field's default (an empty dict counts as unset)."""
    defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(config)}
    given = [name for name in unused if getattr(config, name) not in (defaults[name], {})]
    if given:
        reasons = "; ".join(f"{name}={getattr(config, name)!r} ({unused[name]})" for name in given)
        raise ValueError(f"{type(config).__name__} does not use these fields, leave them at their defaults: "
                         f"{reasons}")


def parse_estimator_kwargs(value: dict | str | None) -> dict | None:
    """`estimator_kwargs` as a dict: a dict or None as given, a string parsed as a JSON object."""
    return parse_json_dict("estimator_kwargs", value, '{"step_weight": 0.5}')


# The ranges of estimator options whose meaning is fixed across estimators (other numbers: any finite value).
ESTIMATOR_OPTION_RANGES = {"gamma": field_range(MultiTurnArguments, "turn_gamma"), "eps": Range(gt=0)}


def check_estimator_kwargs(name: str, estimator, kwargs: dict | None) -> None:
    """Raise if `kwargs` names options that `estimator` does not take, or gives one a value of another type than
    its annotation (or, unannotated, its default) says, or a number outside `ESTIMATOR_OPTION_RANGES`."""
    parameters = inspect.signature(estimator).parameters
    accepted = set(parameters) - {"batch"}
    unknown = sorted(set(kwargs or {}) - accepted)
    if unknown:
        raise ValueError(f"estimator_kwargs {unknown} are not options of advantage_estimator={name!r}; it takes "
                         f"{sorted(accepted)}.")
    try:
        hints = typing.get_type_hints(estimator)
    except (NameError, TypeError):  # an annotation that does not resolve: fall back to the defaults' types
        hints = {}
    for option, value in (kwargs or {}).items():
        default = parameters[option].default
        annotation = hints.get(option, type(default) if default is not inspect.Parameter.empty else typing.Any)
        check_value(f"estimator_kwargs[{option!r}]", value, annotation,
                    ESTIMATOR_OPTION_RANGES.get(option, Range()))


@contextmanager
def reference_from_policy(trl_trainer_module, model, needed: bool, peft_config=None):
    """While a TRL trainer's `__init__` runs, build its reference model as a frozen copy of the policy object.

    TRL loads the reference with `create_model_from_path(model.config._name_or_path)`: that fails for a policy built
    in memory, and silently loads other weights for a policy changed after loading (e.g. just fine-tuned). When the
    policy is an object, a reference is `needed` (TRL's condition: `beta != 0`) and there is no PEFT (where TRL
    disables the adapter instead), the loader TRL calls for the reference is swapped, for the duration of the block,
    for one returning a copy of the policy taken before TRL touches it. Everything else TRL does to the reference
    (dropout, fused head, device placement, DeepSpeed/FSDP preparation, `sync_ref_model`) is unchanged.
    """
    if isinstance(model, str) or not needed or peft_config is not None or is_peft_model(model):
        yield
        return
    loader = trl_trainer_module.create_model_from_path
    snapshot = copy.deepcopy(model)

    def load_reference(model_id, **kwargs):
        dtype = kwargs.get("dtype")
        return snapshot.to(dtype) if isinstance(dtype, torch.dtype) else snapshot

    trl_trainer_module.create_model_from_path = load_reference
    try:
        yield
    finally:
        trl_trainer_module.create_model_from_path = loader


def bf16_only_where_supported(config) -> None:
    """TRL's configs turn bf16 on by default, which `TrainingArguments` then refuses on a machine without bf16
    hardware unless `use_cpu=True` is set. Left unset (None), bf16 here means "where the hardware has it": on such a
    machine it becomes False, so the same config runs on a laptop and on GPUs. An explicit bf16=True is kept."""
    if config.bf16 is None and not config.fp16 and not config.use_cpu:
        if not is_torch_bf16_gpu_available() and not is_torch_xla_available():
            config.bf16 = False


def default_args(config_cls, model):
    """TRL's default when `args` is None: the config with an output folder named after the model and trainer."""
    name = model if isinstance(model, str) else model.name_or_path
    return config_cls(output_dir=f"{str(name).split('/')[-1]}-{config_cls.__name__.removesuffix('Config')}")


def trainer_prologue(trainer_cls: type, config_cls: type, model, args):
    """What every multi-turn trainer's constructor (GRPO, RLOO, PPO, SFT) does first, before its TRL parent's:
    check the installed TRL against what `trainer_cls` relies on, resolve a model name (`offline:...` names too),
    and take `args` as a `config_cls` (TRL's default, `default_args`, when None: the trainer reads the multi-turn
    fields, which TRL's own configs lack). Returns (model, args)."""
    check_trl_compat(trainer_cls)
    model = resolve_model(model) if isinstance(model, str) else model
    if args is None:
        return model, default_args(config_cls, model)
    if not isinstance(args, config_cls):
        raise TypeError(f"args must be a {config_cls.__name__} (the multi-turn fields are read from it), got "
                        f"{type(args).__name__}")
    return model, args


@contextmanager
def trl_constructor(trl_trainer_module, model, args, peft_config):
    """Around a TRL RL trainer's `__init__` (GRPO's, RLOO's): its reference model a frozen copy of a policy object
    (`reference_from_policy`, where `beta != 0`), and a colocated vLLM engine on a CPU machine
    (`vllm_cpu.colocated_vllm_on_cpu`)."""
    with (reference_from_policy(trl_trainer_module, model, args.beta != 0.0, peft_config),
          colocated_vllm_on_cpu(args, model)):
        yield


# Column names a task dataset may not use: the keyword arguments of TRL's reward-function signature, which the step's
# scorer (`scorer.Scorer`) passes itself (`environments` too, which TRL's own reward call passes: a column of the same
# name would be a second value for one of them), and the fields the episode source (`episode_source.EpisodeSource`)
# writes into every row.
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                    "environments", "episode_return", "won", "num_turns")


def check_datasets(train_dataset, eval_dataset) -> None:
    """Refuse a task dataset that is empty or has a column named in `RESERVED_COLUMNS` (`eval_dataset` may be a dict
    of datasets; None is skipped; an iterable dataset's length is not known and not checked)."""
    named = {"train_dataset": train_dataset}
    if isinstance(eval_dataset, dict):
        named.update({f"eval_dataset[{key!r}]": dataset for key, dataset in eval_dataset.items()})
    else:
        named["eval_dataset"] = eval_dataset
    for name, dataset in named.items():
        if dataset is None:
            continue
        reserved = [column for column in getattr(dataset, "column_names", None) or () if column in RESERVED_COLUMNS]
        if reserved:
            raise ValueError(f"{name} has the columns {reserved}, names the trainer gives its reward functions "
                             f"itself; rename them, e.g. dataset.rename_column({reserved[0]!r}, "
                             f"'task_{reserved[0]}')")
        if hasattr(dataset, "__len__") and len(dataset) == 0:
            raise ValueError(f"{name} is empty (0 rows): give it at least one task row")


def environment_return(**kwargs):
    """The environment's return, the first reward source of every multi-turn trainer. TRL's trainers require one
    reward function at construction and name and weigh their sources by position, so it stands first in their
    `reward_funcs`; the step's scorer (`scorer.Scorer`) reads the returns from the played episodes themselves, and
    nothing calls this function."""
    raise RuntimeError("environment_return is scored by the step's Scorer from the played episodes, never called")


POLICY_LAG_FILE = "policy_lag.pt"
"""A checkpoint's file of the off-policy schedule's state (`LaggedRollouts.state`)."""


class SavePolicyLagState(TrainerCallback):
    """Writes `LaggedRollouts.state` into each checkpoint folder as it is saved, so that a resumed run trains on the
    rollout the interrupted one had in flight."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir, f"checkpoint-{state.global_step}")
        torch.save(self.trainer._lagged_rollouts.state(state.global_step), folder / POLICY_LAG_FILE)


class MultiTurnMixin(RunFilesMixin):
    """Mixed into a TRL trainer before the TRL class. Call `_init_multiturn` at the end of `__init__`. Saving writes
    the run's files (`RunFilesMixin`)."""

    environment_reward_name = environment_return.__name__

    # -- set-up -------------------------------------------------------------------------------------------------------

    @staticmethod
    def _with_environment_reward(reward_funcs, args, reward_processing_classes):
        """Put the environment's return first among the reward sources, so no dummy reward is ever needed.
        `reward_weights` then holds the environment's weight first: given one weight per user reward function, the
        environment's weight is 1."""
        if args.remove_unused_columns:
            raise ValueError("remove_unused_columns=True would strip the task columns that environments read. "
                             "Set remove_unused_columns=False.")
        user_funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, list) else [
            reward_funcs]
        if args.reward_weights is not None and len(args.reward_weights) == len(user_funcs):
            args.reward_weights = [1.0, *args.reward_weights]
        if reward_processing_classes is not None:
            if not isinstance(reward_processing_classes, list):
                reward_processing_classes = [reward_processing_classes]
            reward_processing_classes = [None, *reward_processing_classes]
        models = [type(f).__name__ for f in user_funcs if isinstance(f, torch.nn.Module)]
        if models:
            raise ValueError(f"reward_funcs holds models ({models}): multi-turn episodes are scored by functions with "
                             "TRL's signature; wrap the model in a function `(prompts, completions, **kwargs) -> "
                             "list[float]` that tokenizes each episode's messages and returns its score")
        return [environment_return, *user_funcs], reward_processing_classes

    @property
    def text_tokenizer(self):
        """The tokenizer of `processing_class`: itself, or a processor's `tokenizer`."""
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _init_multiturn(self, environment_factory, teacher_model=None) -> None:
        if environment_factory is None:
            raise ValueError("environment_factory is required: pass a callable that returns a fresh Environment "
                             "(e.g. `TextWorldEnv` or `lambda: MyEnv(...)`).")
        self.args.check_multiturn_args()
        check_datasets(self.train_dataset, self.eval_dataset)
        check_trl_attributes(self)
        self.environment_factory = environment_factory
        self.stop_token_ids = reply_eos_ids(self.text_tokenizer,
                                            generation_eos_ids(self.accelerator.unwrap_model(self.model)))
        self.args.episode_rules().episode_format_strategy().prepare_trainer(self)
        self.generation = self._generation_backend()
        self.episode_runner = self._episode_runner(self.generation, self.text_tokenizer)
        if isinstance(self.episode_runner, EpisodeRunner) and not self.args.disable_tqdm:
            # a bar under the training bar that moves within a step, as the rollout's episodes end turn by turn
            self.episode_runner.on_progress = TurnProgress("rollout")
        self.step_log = StepLog(self._metrics, self._logs, self.accelerator, lambda: self.state,
                                self.reward_func_names)
        teacher = self._teacher(teacher_model)
        self.forwards = Forwards(lambda: self.model, lambda: self.ref_model, self.accelerator, self.args,
                                 temperature=self.temperature, pad_token_id=self.text_tokenizer.pad_token_id,
                                 teacher=teacher)
        for model in (self.model, *([teacher] if teacher is not None else [])):
            check_model_packing(self.accelerator.unwrap_model(model), self.args.packing)
        self._lagged_rollouts = self._make_lagged_rollouts() if self.args.max_policy_lag else None
        episodes = EpisodeSource(
            self.episode_runner, self.args, self.accelerator, generation=self.generation,
            lagged=self._lagged_rollouts,
            training=lambda: self.model.training, state=lambda: self.state, reward_weights=self.reward_weights,
            num_generations=self.num_generations, num_generations_eval=self.num_generations_eval, log=self.step_log,
            dynamic=self._dynamic_sampler() if self.args.dynamic_sampling else None)
        scorer = Scorer(self.reward_funcs, self.reward_func_names, self.accelerator, lambda: self.state,
                        self.step_log, episodes.episode_return)
        distillation = None if teacher is None else Distillation(
            self.forwards, self.step_log, self.accelerator, coef=self.args.teacher_kl_coef,
            signal=self.args.teacher_signal)
        self.step = MultiTurnStep(episodes, self.forwards, self._credit(), scorer, self.step_log, args=self.args,
                                  accelerator=self.accelerator, pad_token_id=self.text_tokenizer.pad_token_id,
                                  eos_token_id=self.stop_token_ids[0], use_vllm=self.use_vllm,
                                  distillation=distillation)

    def _generation_backend(self) -> GenerationBackend:
        """The policy's generation backend over the TRL parent's own single-turn generation and sampling settings."""
        return GenerationBackend(
            self.accelerator, self.args, policy=self.accelerator.unwrap_model(self.model),
            wrapped_model=lambda: self.model_wrapped, tokenizer=self.text_tokenizer,
            stop_token_ids=self.stop_token_ids,
            sampling=Sampling(self.temperature, self.top_p, self.top_k or 0, self.min_p, self.repetition_penalty,
                              getattr(self.args, "generation_kwargs", None)),
            sample_replies=functools.partial(single_turn_replies, self),
            reply_cap=functools.partial(capped_replies, self),
            use_vllm=self.use_vllm,
            trl_generation_only=getattr(self, "use_transformers_continuous_batching", False))

    def _teacher(self, teacher_model) -> torch.nn.Module | None:
        """The teacher of on-policy distillation, or None: the trainer's `teacher_model` argument (a path, a name or
        a model object) or the config's `teacher_model_name_or_path`, loaded as TRL loads a reference model, refused
        unless it shares the student's vocabulary (`distillation.check_teacher_vocabulary`), then frozen and prepared
        for the backend (`_frozen_model`)."""
        named = self.args.teacher_model_name_or_path
        if teacher_model is not None and named is not None:
            raise ValueError(f"teacher_model and teacher_model_name_or_path={named!r} are both given: pass one")
        given = teacher_model if teacher_model is not None else named
        if given is None:
            if self.args.teacher_signal == "loss":
                raise ValueError("teacher_signal='loss' trains on a teacher's signal alone, and no teacher is given: "
                                 "set teacher_model_name_or_path (or pass teacher_model), or teacher_signal='reward'")
            return None
        if isinstance(given, str):
            given = resolve_model(given)
            teacher = create_model_from_path(given, **(self.args.model_init_kwargs or {}))
        elif given is self.accelerator.unwrap_model(self.model) or given is self.model:
            raise ValueError("teacher_model is the model being trained (freezing it would stop its training): pass "
                             "a frozen copy, copy.deepcopy(model), or the path it was loaded from")
        else:
            teacher = given
        check_teacher_vocabulary(self.text_tokenizer, teacher, given)
        return self._frozen_model(teacher)

    def _frozen_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` without gradients or dropout, in eval mode, prepared for the backend as TRL prepares its reference
        model (DeepSpeed, FSDP, or the accelerator's device)."""
        model.requires_grad_(False).eval()
        disable_dropout_in_model(model)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(model, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(model, self.accelerator)
        return self.accelerator.prepare_model(model, evaluation_mode=True)

    @property
    def last_rollout(self) -> RolloutBatch | None:
        """The last step's batch, for inspection only."""
        return self.step.last_batch

    def _episode_runner(self, generate_fn, tokenizer) -> EpisodeRunner | AgentRunner:
        """An `EpisodeRunner` of this config's rules over `generate_fn`, executed as the config says (an
        `AgentRunner` when an agent function plays each episode)."""
        args = self.args
        if isinstance(self.environment_factory, AgentEnvironment):
            return self.environment_factory.runner(
                tokenizer, generate_fn, args, reward_funcs=self.reward_funcs[1:], eos_token_ids=self.stop_token_ids,
                chat_template_kwargs=self.chat_template_kwargs,
                any_live=self.generation.any_live if self.accelerator.num_processes > 1 else None)
        return EpisodeRunner(self.environment_factory, tokenizer, generate_fn, args.episode_rules(),
                             eos_token_ids=self.stop_token_ids, env_mode=args.env_mode, env_timeout=args.env_timeout,
                             env_max_memory_mb=args.env_max_memory_mb, env_ray=args.ray_placement(),
                             any_live=self.generation.any_live, overlap=args.rollout_overlap,
                             schedule=args.rollout_schedule)

    def _dynamic_sampler(self) -> DynamicSampler:
        """The training rollouts' dynamic sampling, drawing further tasks from `train_dataset` by index."""
        args, dataset = self.args, self.train_dataset
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ValueError(f"dynamic_sampling=True draws tasks from train_dataset by index, which a "
                             f"{type(dataset).__name__} has not: pass a datasets.Dataset (or a list of rows), or set "
                             "dynamic_sampling=False")
        if isinstance(self.episode_runner, AgentRunner) and args.episode_format == "trajectory":
            raise ValueError("dynamic_sampling=True with an agent and episode_format='trajectory': a draw comes back "
                             "step-wise when an agent rewrote its history, so one step's draws could come in two "
                             "formats: set episode_format='stepwise' (an agent's trajectory is trained step-wise "
                             "there) or dynamic_sampling=False")
        shelf = (TaskShelf(args.dynamic_sampling_set_aside_steps, args.dynamic_sampling_set_aside_ties)
                 if args.dynamic_sampling_set_aside_steps else None)
        return DynamicSampler(dataset, self.num_generations, args.dynamic_sampling_max_draws, shelf, args.seed,
                              self.accelerator.process_index, lambda flag: self.generation.any_live(int(flag)))

    def _make_lagged_rollouts(self) -> LaggedRollouts:
        """The off-policy schedule of `max_policy_lag`: a second runner (its own environments and tokenizer copy)
        whose episode-history cache samples from the policy snapshot with a generator seeded per step."""
        lag, processes = self.args.max_policy_lag, self.accelerator.num_processes
        if is_peft_model(self.model):
            raise ValueError(f"max_policy_lag={lag} with a PEFT model is not supported yet (the snapshot copies the "
                             "whole model): train without peft_config or set max_policy_lag=0")
        if processes > 1:
            raise ValueError(f"max_policy_lag={lag} on {processes} processes is not supported yet (the snapshot's "
                             "rollout would need the ranks' generate calls kept in step): run on one process or set "
                             "max_policy_lag=0")
        generator = torch.Generator(device=self.accelerator.device)
        cache = self.generation.new_history_cache(generator)
        runner = self._episode_runner(cache, copy.deepcopy(self.text_tokenizer))
        self._lagged_runner = runner

        def play(snapshot, seed: int, inputs: list[dict]) -> list[Episode]:
            generator.manual_seed(seed)
            cache.model = snapshot
            cache.reset()
            try:
                episodes = runner(inputs)
            finally:
                cache.reset()
            return self.forwards.behaviour_logps(snapshot, episodes)

        self.add_callback(SavePolicyLagState(self))
        return LaggedRollouts(lambda: self.accelerator.unwrap_model(self.model), play, lag,
                              policy_lag_span(self.args), self.args.seed)

    # -- environments' lifetime ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every environment and stop their worker processes. The trainer stays usable: the next rollout (a
        second `train()`, `evaluate()`) starts what it needs again. `train()` calls it when it ends, and the trainer
        is a context manager (`with MultiTurnGRPOTrainer(...) as trainer:`) that calls it on exit."""
        self.episode_runner.close()
        if self._lagged_rollouts is not None:
            self._lagged_rollouts.close()
            self._lagged_runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def train(self, *args, **kwargs):
        """TRL's `train()`; the environments are released when it returns or raises (Ctrl-C and SIGTERM included)."""
        if self._lagged_rollouts is not None:
            self._restore_policy_lag(kwargs.get("resume_from_checkpoint", args[0] if args else None))
        with sigterm_stops_the_run():
            try:
                return super().train(*args, **kwargs)
            finally:
                self.close()

    def _restore_policy_lag(self, resume_from_checkpoint: str | bool | None) -> None:
        """Resuming with `max_policy_lag`: the rollout in flight and the snapshot the checkpoint saved
        (`SavePolicyLagState`; a checkpoint without them resumes with an on-policy rollout)."""
        if not resume_from_checkpoint:
            return
        folder = resume_from_checkpoint
        if folder is True:
            folders = Path(self.args.output_dir).glob("checkpoint-*")
            folder = max(folders, key=lambda f: int(f.name.rpartition("-")[2]), default=None)
        path = Path(folder, POLICY_LAG_FILE) if folder else None
        if path is not None and path.is_file():
            self._lagged_rollouts.load_state(torch.load(path, weights_only=False))

    # -- the step and its forwards (TRL's two private methods a step is made of) ----------------------------------

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        """TRL's request for a generation batch, answered by the multi-turn step (`trainers/step.py`)."""
        return self.step(inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """Every log-prob of a step, TRL's loss's included: `forwards.Forwards.logps`."""
        return self.forwards.logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                                   compute_aux_loss, **multimodal)
