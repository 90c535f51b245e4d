"""The training loop of an EAGLE-3 head: its start from the target, the training-time test over
``ttt_steps`` draft steps (each step's loss weighted 0.8^i), soft cross-entropy against the target's
top-k distribution renormalised over the draft vocabulary, AdamW with warm-up and cosine decay,
checkpoints, and the held-out figures. One process, or several of a data-parallel run (``World``):
each takes its share of every batch, and the losses are normalised by the whole batch's count and
the gradients summed, so the steps are the one-process steps. Float32 on CPU; bfloat16 autocast on CUDA."""
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import torch
from torch import Tensor
from torch.nn import functional as F

from eagle.features import Batches
from eagle.head import Eagle3Head, HeadConfig
from eagle.parallel import World


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the head (printed and saved with it)."""

    questions: int = 1000
    answer_tokens: int = 192
    draft_vocab: int = 8192
    ttt_steps: int = 3
    epochs: int = 6
    lr: float = 1e-3
    batch_sequences: int = 8  # the global batch, however many processes share it
    top: int = 32
    held_out: float = 0.05
    seed: int = 0
    minutes: float = 150.0  # the training loop stops here (saved), whatever the epochs left


@dataclass(frozen=True)
class Run:
    """How one training run goes beside its recipe: its messages, an early stop (checkpointed, after
    that many steps of this run, as a stop would), and its world of processes."""

    say: Callable[[str], None] = print
    stop_after: Optional[int] = None
    world: World = World()


# ---- the head's start: the target's last layer, its output layer over the draft vocabulary ---------
def initial_head(target, config: HeadConfig, vocabulary: torch.Tensor) -> Eagle3Head:
    """A head whose layer starts as the target's last layer reading the highest fused layer (``fc``
    picks it out), and whose ``lm_head`` and ``norm`` are the target's own rows and final norm. Built
    in float32 on the CPU (the caller moves it), whatever the target's device."""
    head = Eagle3Head(config, embed_tokens=target.get_input_embeddings())
    head.set_vocabulary(vocabulary)
    h, last = config.hidden_size, target.model.layers[-1]
    cpu = lambda t: t.detach().to("cpu")  # noqa: E731
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, -config.target_hidden_size :] = torch.eye(h)
        attention, mine = last.self_attn, head.layers[0].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(mine, name).weight[:, h:] = cpu(getattr(attention, name).weight)
            getattr(mine, name).weight[:, :h].normal_(0, 0.02)
        mine.o_proj.weight.copy_(cpu(attention.o_proj.weight))
        head.layers[0].mlp.load_state_dict({k: cpu(v) for k, v in last.mlp.state_dict().items()})
        head.layers[0].hidden_norm.weight.copy_(cpu(last.input_layernorm.weight))
        head.layers[0].post_attention_layernorm.weight.copy_(cpu(last.post_attention_layernorm.weight))
        head.norm.weight.copy_(cpu(target.model.norm.weight))
        rows = target.get_output_embeddings().weight
        head.lm_head.weight.copy_(cpu(rows[vocabulary.to(rows.device)]))
    return head.float()


# ---- one batch: the training-time test's losses and matches ---------------------------------------
def ttt_terms(head: Eagle3Head, batch, steps: int) -> List[tuple]:
    """Per step ``i``: the soft cross-entropy summed over its labelled rows (a scalar), and for each
    index ``t`` whether its draft equals the target's top token (``[B, T - 1 - i]``) and its validity."""
    features, ids, labels, probs, mask = batch
    out = []
    for i, logits in enumerate(head.ttt(features, ids, steps)):
        m = logits.shape[1]
        rows = slice(1 + i, 1 + i + m)  # the target's row scoring the same token
        valid = mask[:, rows]
        logp = F.log_softmax(logits.float(), dim=-1)
        lab = labels[:, rows]
        picked = logp.gather(-1, lab.clamp(min=0)) * (lab >= 0)
        loss = -(picked * probs[:, rows]).sum(-1)
        top = labels[:, rows, 0]  # the target's top token, as a draft id (-1: outside the draft vocabulary)
        match = (logits.argmax(-1) == top) & (top >= 0)
        out.append(((loss * valid).sum(), match, valid))
    return out


def chain_length(results) -> Tensor:
    """Accepted drafts per index of a chain of ``len(results)`` greedy drafts (``[n]`` over valid indices)."""
    m = results[-1][1].shape[1]
    alive = torch.ones_like(results[0][1][:, :m])
    accepted = torch.zeros(alive.shape, device=alive.device)
    for _, match, _ in results:
        alive = alive & match[:, :m]
        accepted += alive
    return accepted[results[-1][2][:, :m]]


def _autocast(batches: Batches):
    """bfloat16 autocast on CUDA; nothing on CPU (float32)."""
    device = torch.device(batches.device)
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def _step_loss(head: Eagle3Head, batch, recipe: Recipe, world: World, device) -> tuple:
    """``(loss to differentiate, the whole batch's loss as a number)``: each step's summed loss over
    the whole batch's labelled rows (counted over every process), weighted 0.8^i."""
    steps = recipe.ttt_steps
    results = ttt_terms(head, batch, steps) if batch is not None else []
    local = torch.zeros(2 * steps, device=device)
    for i, (total, _, valid) in enumerate(results):
        local[i], local[steps + i] = total.detach().float(), valid.sum()
    whole = world.sum(local)
    counts = whole[steps:].clamp(min=1)
    loss = sum(0.8 ** i * r[0] / counts[i] for i, r in enumerate(results))
    return loss, float(sum(0.8 ** i * whole[i] / counts[i] for i in range(steps)))


# ---- the loop --------------------------------------------------------------------------------------
@torch.enable_grad()  # whatever the caller set (the app's set-up turns gradients off for the whole process)
def train(head: Eagle3Head, batches: Batches, held_out: Batches, recipe: Recipe, checkpoint: Path, run: Run = Run()) -> dict:
    """Train ``head`` in place on ``batches`` (this process's share of each), resuming from
    ``checkpoint`` when it exists (only the main process writes it); returns the held-out figures."""
    from tqdm import tqdm

    world, device = run.world, batches.device
    total = recipe.epochs * len(batches)
    parameters = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=recipe.lr, weight_decay=0.0)
    warmup = min(100, total // 10 + 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))))
    step, spent = 0, 0.0
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, spent = state["step"], state["seconds"]
        run.say(f"resuming from step {step} of {total} ({spent / 60:.1f} min trained)")
    figures = {}
    bar = tqdm(total=total, initial=step, desc="training", unit="batch", dynamic_ncols=True, disable=not world.main)
    saved, begun = time.monotonic(), time.monotonic() - spent
    last = total if run.stop_after is None else min(total, step + run.stop_after)
    order, shuffled = list(range(len(batches))), None
    while step < last and not world.any(time.monotonic() - begun >= recipe.minutes * 60, device):
        epoch, index = divmod(step, len(batches))
        if shuffled != epoch:  # each epoch's order of batches, from its own seed
            order, shuffled = list(range(len(batches))), epoch
            random.Random(recipe.seed * 1000 + epoch).shuffle(order)
        with _autocast(batches):
            loss, shown = _step_loss(head, batches[order[index]], recipe, world, device)
        optimizer.zero_grad(set_to_none=True)
        if torch.is_tensor(loss):
            loss.backward()
        world.sum_gradients(parameters)
        torch.nn.utils.clip_grad_norm_(parameters, 0.5)
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{shown:.3f}", **({"held_out": f"{figures['tokens_per_pass']:.2f}"} if figures else {}))
        if step % len(batches) == 0 or step == total:
            figures = evaluate(head, held_out, recipe, world)
            run.say(f"epoch {step // len(batches)}: held-out depth-1 accuracy {figures['accuracy'][0]:.3f}, "
                    f"{figures['tokens_per_pass']:.2f} tokens per pass (chain of {recipe.ttt_steps})")
        if world.main and (time.monotonic() - saved > 120 or step == total):
            _save_checkpoint(checkpoint, head, optimizer, schedule, step, time.monotonic() - begun)
            saved = time.monotonic()
    bar.close()
    if world.main:
        _save_checkpoint(checkpoint, head, optimizer, schedule, step, time.monotonic() - begun)
    figures = evaluate(head, held_out, recipe, world)
    figures.update(steps=step, of_steps=total, minutes=round((time.monotonic() - begun) / 60, 1))
    return figures


def _save_checkpoint(path: Path, head, optimizer, schedule, step: int, seconds: float) -> None:
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                "step": step, "seconds": seconds}, temporary)
    os.replace(temporary, path)


@torch.no_grad()
def evaluate(head: Eagle3Head, batches: Batches, recipe: Recipe, world: World = World()) -> dict:
    """Held-out figures over every process's share: greedy accuracy per draft step, and tokens per
    target pass of a chain of ``ttt_steps`` drafts (1 + accepted drafts; exact for greedy, the answers
    being the target's own)."""
    steps = recipe.ttt_steps
    sums = torch.zeros(2 * steps + 2, dtype=torch.float64, device=batches.device)  # correct, counted, accepted, indices
    for b in range(len(batches)):
        batch = batches[b]
        if batch is None:
            continue
        with _autocast(batches):
            results = ttt_terms(head, batch, steps)
        for s, (_, match, valid) in enumerate(results):
            sums[s] += match[valid].sum()
            sums[steps + s] += valid.sum()
        accepted = chain_length(results)
        sums[-2:] += torch.stack([accepted.sum().double(), torch.tensor(float(accepted.numel()), device=sums.device)])
    sums = world.sum(sums).tolist()
    return {"accuracy": [round(sums[s] / max(1.0, sums[steps + s]), 4) for s in range(steps)],
            "tokens_per_pass": round(1 + sums[-2] / max(1.0, sums[-1]), 3), "positions": int(sums[steps])}
