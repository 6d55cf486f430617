"""The model-family conformance matrix: for each family of `model_families.FAMILIES`, each path a step's forwards
and rollout can take, the measured verdict "exact", "refused: <the one-line refusal>" or "not supported: <why>".

    exact          per-token log-probs and entropies equal an independent forward of each row alone, without
                   padding (max abs difference <= `ATOL`), and where rows are packed the gradients of one loss equal
                   the padded rows'; for a template, the turn-by-turn token ids equal the template's rendering of
                   the whole conversation
    refused        the library refused at the start, in one line (`packing="prefix"`: `packing.packing_refusal`;
                   a template: `ChatTemplateError`); `packing="auto"` pads such a model, and is exact then
    not supported  the path does not exist for the family (no tool role in its template, no token-classification
                   head for a critic)

Any other outcome (a number off, a crash) is a failure of the library: `run_family` reports it as "WRONG: ..." and
`tests/trainers/test_model_matrix.py` fails on it. `scripts/model_matrix.py` writes docs/models.md from `run_matrix`;
`scripts/gpu_check.sh` runs the same cells on CUDA in bf16 (`--device cuda --dtype bfloat16`, with a tolerance for
bf16 there).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..model_families import FAMILIES, Family, build_model, build_tokenizer
from ..rollout.chat_tokens import ChatTemplateError, ChatTokenBuilder
from .logprobs import sequence_logps
from .packing import choose_plan, packed_logps_and_entropies, packed_values
from .value_model import PolicyAndValueModel, create_value_model, token_values

ATOL = 1e-4
"""fp32: the largest difference from the rows' own forwards that counts as exact."""
TEMPERATURE = 0.7

COLUMNS = {
    "template": "the family's TRL chat template extended turn by turn (trajectory format): token-exact",
    "tool turns": "tool results as observations (role 'tool'), where the template renders tools",
    "padded": "packing='padded': log-probs and entropies of a GRPO group's rows, left and right padded",
    "auto": "packing='auto' (the default) on the same rows: packed where the model can take it, else padded",
    "prefix": "packing='prefix' on the same rows (a shared prompt forwarded once), gradients included",
    "step-wise": "packing='prefix' on a step-wise episode's rows (each row extends the one before it)",
    "LoRA": "packing='prefix' through a PEFT LoRA adapter on every linear layer",
    "PPO critic": "a critic built from the policy (token classification), its values by packing='prefix' (tree-mask "
                  "packs, or forked layer states for a hybrid model) and their gradients",
}
"""The matrix's paths, in table order, with what each cell checks (the legend of docs/models.md)."""


@dataclass(frozen=True)
class Cell:
    verdict: str
    """"exact", "refused", "not supported" or "WRONG"."""
    detail: str = ""
    """The refusal or the reason; for `packing="auto"`, whether the rows were "packed" or "padded"."""
    error: float | None = None
    """The largest difference measured (machine-dependent, so not in docs/models.md)."""

    def __str__(self) -> str:
        return self.verdict + (f": {self.detail}" if self.detail else "")


def run_matrix(families=FAMILIES, **options) -> dict[str, dict[str, Cell]]:
    """{family name: {column: Cell}} for `families` (`run_family`'s `options`)."""
    return {fam.name: run_family(fam, **options) for fam in families}


def run_family(fam: Family, *, device: str = "cpu", dtype=torch.float32, attn: str | None = None,
               atol: float = ATOL, columns=tuple(COLUMNS)) -> dict[str, Cell]:
    """The cells of `fam` (those of `columns`); a crash in a cell is that cell's "WRONG" verdict, never the run's. A
    family transformers cannot build with `attn` (GPT-OSS has no SDPA path) has every cell "not supported"."""
    tokenizer = build_tokenizer(fam)
    try:
        model = build_model(fam, tokenizer, dtype=dtype, attn=attn).to(device)
    except (ValueError, ImportError) as exc:
        return dict.fromkeys(columns, Cell("not supported", _one_line(str(exc))[:200]))
    checks = {"template": lambda: _template_cell(tokenizer, "user"),
              "tool turns": lambda: _tool_cell(tokenizer),
              "padded": lambda: _forward_cell(model, _group_rows(model), "padded", atol),
              "auto": lambda: _forward_cell(model, _group_rows(model), "auto", atol),
              "prefix": lambda: _forward_cell(model, _group_rows(model), "prefix", atol),
              "step-wise": lambda: _forward_cell(model, _stepwise_rows(model), "prefix", atol),
              "LoRA": lambda: _forward_cell(_with_lora(fam, tokenizer, dtype, attn, device), _group_rows(model),
                                            "prefix", atol),
              "PPO critic": lambda: _critic_cell(model, atol)}
    cells = {}
    for column in columns:
        try:
            cells[column] = checks[column]()
        except Exception as exc:  # noqa: BLE001 (a crash is the cell's verdict: the matrix reports every cell)
            cells[column] = Cell("WRONG", f"{type(exc).__name__}: {_one_line(str(exc))}")
    return cells


# -- rows ---------------------------------------------------------------------------------------------------------

def _tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab // 4, vocab) for _ in range(n)]


def _group_rows(model, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """A GRPO group: four replies (3-8 tokens, two sharing their first tokens) to one 24-token prompt."""
    rng, vocab = random.Random(seed), model.config.get_text_config().vocab_size
    prompt = _tokens(rng, vocab, 24)
    replies = [_tokens(rng, vocab, n) for n in (3, 8, 5, 8)]
    replies[3] = replies[1][:3] + replies[3][3:]
    return [(prompt, reply) for reply in replies]


def _stepwise_rows(model, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    """A step-wise episode of three turns with the full history: each row's context is the row before it, its reply
    and the observation after it."""
    rng, vocab = random.Random(seed), model.config.get_text_config().vocab_size
    context, rows = _tokens(rng, vocab, 12), []
    for _ in range(3):
        reply = _tokens(rng, vocab, 4)
        rows.append((list(context), reply))
        context += reply + _tokens(rng, vocab, 3)
    return rows


def _batch(rows, device):
    """(input_ids, attention_mask, logits_to_keep) of (prompt, completion) rows as the trainers pad them: prompts on
    the left, completions on the right; on `device`."""
    width_p = max(len(p) for p, _ in rows)
    width_c = max(len(c) for _, c in rows)
    ids = torch.zeros(len(rows), width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, completion) in enumerate(rows):
        ids[b, width_p - len(prompt):width_p + len(completion)] = torch.tensor(prompt + completion)
        mask[b, width_p - len(prompt):width_p + len(completion)] = 1
    return ids.to(device), mask.to(device), width_c


# -- cells --------------------------------------------------------------------------------------------------------

def _alone(model, rows, device):
    """Each row's log-probs and entropies from a forward of that row alone (no padding), laid out as the padded
    path lays them out: (B, K), 0 past a completion's end."""
    width_c = max(len(c) for _, c in rows)
    logps = torch.zeros(len(rows), width_c, device=device)
    entropies = torch.zeros_like(logps)
    for b, (prompt, completion) in enumerate(rows):
        ids = torch.tensor([prompt + completion], device=device)
        lp, ent, _ = sequence_logps(model, ids, torch.ones_like(ids), len(completion), temperature=TEMPERATURE,
                                    compute_entropy=True)
        logps[b, :len(completion)], entropies[b, :len(completion)] = lp[0], ent[0]
    return logps, entropies


def _loss_grads(model, logps, entropies):
    weights = torch.linspace(-1, 1, logps.numel(), device=logps.device).view_as(logps)
    model.zero_grad()
    ((logps * weights).sum() + 0.1 * entropies.sum()).backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _grads_differ(grads, reference, atol: float) -> bool:
    """Whether two models' gradients differ beyond `atol` relative to each reference gradient's scale (sums over
    every row's tokens, accumulated in another order)."""
    return any(not torch.allclose(a, b, atol=atol * max(1.0, b.abs().max().item()), rtol=1e-3)
               for a, b in zip(grads, reference, strict=True))


def _forward_cell(model, rows, packing: str, atol: float) -> Cell:
    device = next(model.parameters()).device
    ids, mask, keep = _batch(rows, device)
    with torch.no_grad():
        ref_logps, ref_entropies = _alone(model, rows, device)
    try:
        logps, entropies = packed_logps_and_entropies(model, ids, mask, keep, compute_entropy=True,
                                                      temperature=TEMPERATURE, packing=packing)
    except ValueError as exc:
        if packing == "prefix" and str(exc).startswith("packing='prefix': "):
            return Cell("refused", _one_line(str(exc).removeprefix("packing='prefix': ")))
        raise
    real = mask[:, -keep:].bool()
    error = max((logps - ref_logps)[real].abs().max().item(), (entropies - ref_entropies)[real].abs().max().item())
    if error > atol:
        return Cell("WRONG", f"max abs error {error:.1e} against the rows alone")
    packed = choose_plan((model,), ids, mask, keep, packing=packing) is not None
    if not packed:
        return Cell("exact", "padded" if packing == "auto" else "", error)
    grads = _loss_grads(model, logps, entropies)
    padded = sequence_logps(model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True)
    padded_grads = _loss_grads(model, padded[0], padded[1])
    if _grads_differ(grads, padded_grads, atol):
        return Cell("WRONG", "gradients differ from the padded rows'")
    model.zero_grad()
    return Cell("exact", "packed" if packing == "auto" else "", error)


def _with_lora(fam: Family, tokenizer, dtype, attn, device):
    from peft import LoraConfig, get_peft_model

    model = build_model(fam, tokenizer, dtype=dtype, attn=attn).to(device)
    # PEFT refuses an adapter on a Mamba mixer's out_proj: every other linear layer
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", exclude_modules=["out_proj"],
                        init_lora_weights=False)
    return get_peft_model(model, config)


def _critic_cell(policy, atol: float) -> Cell:
    try:
        critic = create_value_model(policy)
    except ValueError:
        return Cell("not supported", f"transformers has no token-classification model for {type(policy).__name__}, "
                                     "the critic built from the policy: pass `value_model=` a critic module")
    critic.eval()  # its head's dropout off, as the policy's
    torch.nn.init.normal_(critic.score.weight)  # a new head starts at 0: give its values something to compare
    model = PolicyAndValueModel(policy, critic)
    rows = _group_rows(policy)
    device = next(policy.parameters()).device
    ids, mask, keep = _batch(rows, device)
    try:
        plan = choose_plan((policy, critic), ids, mask, keep, packing="prefix")
    except ValueError as exc:
        return Cell("refused", _one_line(str(exc).removeprefix("packing='prefix': ")))
    with torch.no_grad():
        alone = torch.zeros(len(rows), keep, device=device)
        for b, (prompt, completion) in enumerate(rows):
            row = torch.tensor([prompt + completion], device=device)
            alone[b, :len(completion)] = token_values(critic, row, torch.ones_like(row), len(completion))[0]
    values = packed_values(model, plan)
    real = mask[:, -keep:].bool()
    error = (values - alone).masked_fill(~real, 0).abs().max().item()
    if error > atol:
        return Cell("WRONG", f"values off the rows alone by {error:.1e}")
    grads = []
    for packed in (True, False):
        critic.zero_grad()
        out = packed_values(model, plan) if packed else token_values(critic, ids, mask, keep)
        out.masked_fill(~real, 0).sum().backward()
        grads.append([p.grad.detach().clone() for p in critic.parameters() if p.grad is not None])
    if _grads_differ(*grads, atol):
        return Cell("WRONG", "the critic's gradients differ packed and padded")
    return Cell("exact", "", error)


_CONVERSATION = [("Go north.", "You are in a hall. Exits: south, east."), ("go east", "A locked chest is here."),
                 ("open the chest", "It is locked.")]


def _template_cell(tokenizer, role: str) -> Cell:
    """A three-turn conversation built turn by turn (`ChatTokenBuilder`, as the rollout builds it) equals the
    template's rendering of the whole conversation, or the builder refuses the template in one line."""
    try:
        builder = ChatTokenBuilder(tokenizer)
        if role != "user":
            builder.check_observation_role(role)
    except ChatTemplateError as exc:
        return Cell("refused", _one_line(str(exc)))
    messages = [{"role": "system", "content": "You play a text game."}, {"role": "user", "content": "Start."}]
    ids = builder.prompt_ids(messages)
    for reply, observation in _CONVERSATION:
        reply_ids = builder.assistant_content_ids(reply)
        ids += reply_ids + builder.close_ids(reply_ids) + builder.observation_ids(observation, role)
        messages += [{"role": "assistant", "content": reply}, {"role": role, "content": observation}]
    rendered = builder.render(messages, add_generation_prompt=True)
    if ids != rendered:
        return Cell("WRONG", "turn-by-turn ids differ from the template's rendering")
    return Cell("exact")


def _tool_cell(tokenizer) -> Cell:
    if "tool" not in tokenizer.chat_template:
        return Cell("not supported", "the template renders no tool messages")
    return _template_cell(tokenizer, "tool")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def markdown(results: dict[str, dict[str, Cell]], families=FAMILIES, numbers=()) -> str:
    """docs/models.md's table of `results` (`run_matrix`): a row per family with its template, a cell per path;
    refusals and reasons are numbered notes under the table (one note per distinct text). In the columns named in
    `numbers`, a forward's cell shows the largest difference measured instead of its verdict (machine-dependent: the
    GPU table's bf16 columns, never docs/models.md)."""
    columns = list(next(iter(results.values())))
    by_name = {fam.name: fam for fam in families}
    notes: dict[str, int] = {}

    def cell_text(column: str, cell: Cell) -> str:
        if cell.verdict == "exact" and column in numbers and cell.error is not None:
            return f"diff {cell.error:.0e}" + (f" ({cell.detail})" if cell.detail else "")
        if cell.verdict == "exact":
            return f"exact ({cell.detail})" if cell.detail else "exact"
        number = notes.setdefault(cell.detail, len(notes) + 1)
        return f"{cell.verdict} [{number}]"

    lines = ["| family | chat template | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 2)]
    for name, cells in results.items():
        fam = by_name[name]
        template = f"`{fam.template}`" + (f" ({fam.note})" if fam.note else "")
        lines.append(f"| {name} | {template} | " + " | ".join(cell_text(c, cells[c]) for c in columns) + " |")
    lines += ["", *(f"{number}. {text}" for text, number in notes.items())]
    return "\n".join(lines)
