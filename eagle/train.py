"""Train an EAGLE-3 head for a target, on this machine, from the target's own answers:

    python -m eagle.train --target embedded --out heads/smollm2-135m-eagle3

Read top to bottom: the stages (questions, answers, draft vocabulary, features) each keep their
output in ``--work`` and are skipped when done, so a stopped run resumes; then the training loop
(the training-time test over ``--ttt-steps`` draft steps, soft cross-entropy against the target's
top-32 distribution renormalised over the draft vocabulary, AdamW with warm-up and cosine decay),
checkpointed every ``--checkpoint-minutes``; then the head is saved in the speculators format.
"""
import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Sequence

import torch
from torch.nn import functional as F

from eagle.head import Eagle3Head, HeadConfig


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the head (printed and saved with it)."""

    questions: int = 1000
    answer_tokens: int = 192
    draft_vocab: int = 8192
    ttt_steps: int = 3
    epochs: int = 6
    lr: float = 1e-3
    batch_sequences: int = 8
    top: int = 32
    held_out: float = 0.05
    seed: int = 0
    minutes: float = 150.0  # the training loop stops here (saved), whatever the epochs left


QUICK = dict(questions=400, answer_tokens=160, epochs=5, minutes=12.0)


# ---- the head's start: the target's last layer, its output layer over the draft vocabulary ---------
def initial_head(target, config: HeadConfig, vocabulary: torch.Tensor) -> Eagle3Head:
    """A head whose layer starts as the target's last layer reading the highest fused layer (``fc``
    picks it out), and whose ``lm_head`` and ``norm`` are the target's own rows and final norm."""
    head = Eagle3Head(config, embed_tokens=target.get_input_embeddings())
    head.set_vocabulary(vocabulary)
    h, last = config.hidden_size, target.model.layers[-1]
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, -config.target_hidden_size :] = torch.eye(h)
        attention, mine = last.self_attn, head.layers[0].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(mine, name).weight[:, h:] = getattr(attention, name).weight
            getattr(mine, name).weight[:, :h].normal_(0, 0.02)
        mine.o_proj.weight.copy_(attention.o_proj.weight)
        head.layers[0].mlp.load_state_dict(last.mlp.state_dict())
        head.layers[0].hidden_norm.weight.copy_(last.input_layernorm.weight)
        head.layers[0].post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        head.norm.weight.copy_(target.model.norm.weight)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocabulary])
    return head.float()


# ---- one batch: the training-time test's losses and matches ---------------------------------------
def batch_tensors(items: Sequence[dict], draft_index: torch.Tensor):
    """Pad a batch: features ``[B, T, F]``, ids ``[B, T]``, soft labels over draft ids ``[B, T, K]``
    (index -1 where the token is outside the draft vocabulary), and the answer mask ``[B, T]``
    (rows whose distribution is a label: from the last prompt position to the one before the end)."""
    t = max(len(i["ids"]) for i in items)
    b = len(items)
    width, k = items[0]["features"].shape[1], items[0]["top_ids"].shape[1]
    features = torch.zeros((b, t, width))
    ids = torch.zeros((b, t), dtype=torch.long)
    labels = torch.full((b, t, k), -1, dtype=torch.long)
    probs = torch.zeros((b, t, k))
    mask = torch.zeros((b, t), dtype=torch.bool)
    for j, item in enumerate(items):
        n = len(item["ids"])
        features[j, :n] = item["features"].float()
        ids[j, :n] = item["ids"].long()
        labels[j, :n] = draft_index[item["top_ids"].long()]
        probs[j, :n] = item["top_probs"].float()
        mask[j, item["prompt_length"] - 1 : n - 1] = True
    probs = probs * (labels >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    return features, ids, labels, probs, mask


def ttt_losses(head: Eagle3Head, batch, steps: int):
    """Per step ``i``: the soft cross-entropy over its labelled rows, and for each index ``t`` whether
    its draft equals the target's top token (``[B, T - 1 - i]``, with its validity)."""
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
        loss = (loss * valid).sum() / valid.sum().clamp(min=1)
        top = labels[:, rows, 0]  # the target's top token, as a draft id (-1: outside the draft vocabulary)
        match = (logits.argmax(-1) == top) & (top >= 0)
        out.append((loss, match, valid))
    return out


def chain_length(results) -> torch.Tensor:
    """Accepted drafts per index of a chain of ``len(results)`` greedy drafts (``[n]`` over valid indices)."""
    m = results[-1][1].shape[1]
    alive = torch.ones_like(results[0][1][:, :m])
    accepted = torch.zeros(alive.shape)
    for _, match, _ in results:
        alive = alive & match[:, :m]
        accepted += alive
    return accepted[results[-1][2][:, :m]]


# ---- the loop --------------------------------------------------------------------------------------
@torch.enable_grad()  # whatever the caller set (the app's set-up turns gradients off for the whole process)
def train(head: Eagle3Head, train_items: List[dict], held_out: List[dict], draft_index: torch.Tensor,
          recipe: Recipe, checkpoint: Path, say=print, stop_after: int | None = None) -> dict:
    """Train ``head`` in place, resuming from ``checkpoint`` when it exists; returns the held-out
    figures. ``stop_after``: stop (checkpointed) after that many steps of this call, as a stop would."""
    from tqdm import tqdm

    rng = random.Random(recipe.seed)
    order = sorted(range(len(train_items)), key=lambda i: len(train_items[i]["ids"]))
    batches = [order[i : i + recipe.batch_sequences] for i in range(0, len(order), recipe.batch_sequences)]
    total = recipe.epochs * len(batches)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=0.0)
    warmup = min(100, total // 10 + 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))))
    step, spent = 0, 0.0
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, spent = state["step"], state["seconds"]
        say(f"resuming from step {step} of {total} ({spent / 60:.1f} min trained)")
    figures = {}
    bar = tqdm(total=total, initial=step, desc="training", unit="batch", dynamic_ncols=True)
    saved, begun = time.monotonic(), time.monotonic() - spent
    last = total if stop_after is None else min(total, step + stop_after)
    while step < last and (time.monotonic() - begun) < recipe.minutes * 60:
        epoch, index = divmod(step, len(batches))
        shuffled = list(batches)
        random.Random(recipe.seed * 1000 + epoch).shuffle(shuffled)
        results = ttt_losses(head, batch_tensors([train_items[i] for i in shuffled[index]], draft_index), recipe.ttt_steps)
        loss = sum(0.8 ** i * r[0] for i, r in enumerate(results))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", **({"held_out": f"{figures['tokens_per_pass']:.2f}"} if figures else {}))
        if step % len(batches) == 0 or step == total:
            figures = evaluate(head, held_out, draft_index, recipe)
            say(f"epoch {step // len(batches)}: held-out depth-1 accuracy {figures['accuracy'][0]:.3f}, "
                f"{figures['tokens_per_pass']:.2f} tokens per pass (chain of {recipe.ttt_steps})")
        if time.monotonic() - saved > 120 or step == total:
            _save_checkpoint(checkpoint, head, optimizer, schedule, step, time.monotonic() - begun)
            saved = time.monotonic()
    bar.close()
    _save_checkpoint(checkpoint, head, optimizer, schedule, step, time.monotonic() - begun)
    figures = evaluate(head, held_out, draft_index, recipe)
    figures.update(steps=step, of_steps=total, minutes=round((time.monotonic() - begun) / 60, 1))
    return figures


def _save_checkpoint(path: Path, head, optimizer, schedule, step: int, seconds: float) -> None:
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                "step": step, "seconds": seconds}, temporary)
    os.replace(temporary, path)


@torch.no_grad()
def evaluate(head: Eagle3Head, items: List[dict], draft_index: torch.Tensor, recipe: Recipe) -> dict:
    """Held-out figures: greedy accuracy per draft step, and tokens per target pass of a chain of
    ``ttt_steps`` drafts (1 + accepted drafts; exact for greedy, the answers being the target's own)."""
    correct = [0.0] * recipe.ttt_steps
    counted = [0] * recipe.ttt_steps
    accepted = []
    for i in range(0, len(items), recipe.batch_sequences):
        results = ttt_losses(head, batch_tensors(items[i : i + recipe.batch_sequences], draft_index), recipe.ttt_steps)
        for s, (_, match, valid) in enumerate(results):
            correct[s] += float(match[valid].sum())
            counted[s] += int(valid.sum())
        accepted.append(chain_length(results))
    accepted = torch.cat(accepted) if accepted else torch.zeros(1)
    return {"accuracy": [round(c / max(1, n), 4) for c, n in zip(correct, counted)],
            "tokens_per_pass": round(1 + float(accepted.mean()), 3), "positions": counted[0]}


# ---- the command -----------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
EVALUATION_SETS = [ROOT.parent / "shared" / "specbench" / "question.jsonl", ROOT / "bench_prompts.jsonl",
                   *sorted((ROOT / "prompts").glob("*.jsonl"))]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eagle.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="embedded", help="'embedded', a model folder or a .gguf file")
    p.add_argument("--out", required=True, help="folder for the head (speculators format)")
    p.add_argument("--work", help="folder for the data and checkpoints (default: the cache folder)")
    p.add_argument("--quick", action="store_true", help=f"the quick recipe: {QUICK}")
    for name, value in asdict(Recipe()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=None, help=f"default {value}")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data-dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="the dtype the target writes questions and answers in (features are always float32); auto: "
                   "bfloat16 where its batched matmul measures clearly faster on this CPU (AVX-512 BF16, AMX), else float32")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    from tqdm import tqdm

    from eagle.data import Overlap, draft_vocabulary, evaluation_texts, read_jsonl, write_answers, write_questions
    from eagle.features import read_shards, write_features
    from utils.models import cache_dir, end_tokens, load_model

    values = {**asdict(Recipe()), **(QUICK if args.quick else {})}
    values.update({k: v for k, v in vars(args).items() if k in values and v is not None})
    recipe = Recipe(**values)
    torch.set_num_threads(args.threads)
    torch.manual_seed(recipe.seed)
    target, tokenizer, label = load_model(None if args.target == "embedded" else args.target, dtype="float32", say=print)
    name = "SmolLM2-135M-Instruct" if args.target == "embedded" else Path(args.target).name
    work = Path(args.work) if args.work else cache_dir() / "eagle" / f"{name}-seed{recipe.seed}"
    work.mkdir(parents=True, exist_ok=True)
    data_recipe = {k: values[k] for k in ("questions", "answer_tokens", "seed")}
    recorded = work / "data.json"
    if recorded.is_file() and json.loads(recorded.read_text()) != data_recipe:
        print(f"error: {work} holds data made with {recorded.read_text().strip()}; give another --work", file=sys.stderr)
        return 2
    recorded.write_text(json.dumps(data_recipe))
    print(f"recipe: {recipe}\nwork folder: {work}")
    stop = end_tokens(target, tokenizer)
    dtype = args.data_dtype
    if dtype == "auto":
        from measure.dtype import choose_cpu_dtype

        dtype, reason = choose_cpu_dtype(target.config.hidden_size, target.config.intermediate_size, rows=16)
        print(f"data dtype: {reason}")
    writer = target if dtype == "float32" else _copy_in(target, getattr(torch, dtype))
    clock = time.monotonic()
    overlap = Overlap(evaluation_texts(EVALUATION_SETS))
    with tqdm(total=recipe.questions, initial=len(read_jsonl(work / "questions.jsonl")), desc="questions", unit="q") as bar:
        dropped = write_questions(writer, tokenizer, work / "questions.jsonl", recipe.questions, overlap, stop, recipe.seed, progress=bar)
    with tqdm(desc="answers", unit="tok") as bar:
        write_answers(writer, tokenizer, work / "questions.jsonl", work / "answers.jsonl", recipe.answer_tokens, stop, progress=bar)
    del writer
    rows = read_jsonl(work / "answers.jsonl")
    vocab_size = target.get_output_embeddings().weight.shape[0]
    vocabulary = draft_vocabulary(rows, recipe.draft_vocab, stop, vocab_size)
    config = HeadConfig.for_target(target, draft_vocab_size=len(vocabulary))
    with tqdm(total=sum(len(r["ids"]) for r in rows), desc="features", unit="tok") as bar:
        write_features(target, rows, work / f"features-top{recipe.top}", config.aux_layers, recipe.top, progress=bar)
    data_minutes = (time.monotonic() - clock) / 60
    items = list(read_shards(work / f"features-top{recipe.top}"))
    cut = len(items) - max(1, int(len(items) * recipe.held_out))
    draft_index = torch.full((vocab_size,), -1, dtype=torch.long)
    draft_index[vocabulary] = torch.arange(len(vocabulary))
    head = initial_head(target, config, vocabulary)
    figures = train(head, items[:cut], items[cut:], draft_index, recipe, work / f"checkpoint-{_key(recipe)}.pt")
    answer_tokens = sum(len(r["ids"]) - r["prompt_length"] for r in rows)
    coverage = sum(int(draft_index[torch.tensor(r["ids"][r["prompt_length"]:])].ge(0).sum()) for r in rows) / max(1, answer_tokens)
    extra = {"command": "python -m eagle.train " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
             "recipe": asdict(recipe), "held_out": figures,
             "data": {"questions": len(rows), "answer_tokens": answer_tokens, "dropped_for_overlap": dropped,
                      "source": f"questions written by {name} itself from its chat template's user turn, begun with "
                                "one of eagle.data.OPENERS; its own greedy answers", "draft_vocab_coverage": round(coverage, 4), "written_in": dtype,
                      "minutes_this_run_outside_training": round(data_minutes, 1)}}
    from eagle.format import save_head

    digest = save_head(head, args.out, target_name=label, extra=extra)
    print(f"saved {args.out} (sha256 {digest}): held-out {figures['tokens_per_pass']} tokens per pass, "
          f"accuracy by step {figures['accuracy']}")
    return 0


def _copy_in(model, dtype: torch.dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


def _key(recipe: Recipe) -> str:
    """The checkpoint's name: what the trained weights depend on (not the time budget)."""
    return "-".join(f"{k}={v}" for k, v in asdict(recipe).items() if k != "minutes")


if __name__ == "__main__":
    sys.exit(main())
