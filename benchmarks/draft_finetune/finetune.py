"""Step 2 of the draft fine-tuning experiment: fit the real pair's 0.5B draft to the 1.5B target on the
target's cached greedy responses (make_data.py), over the token map the runtime's draft head scores
(draft:PATH's default vocab=32768), and save it as a Hugging Face directory usable as draft:OUT.

The draft keeps its own frozen head and embeddings; its last --layers decoder layers and final norm
train on forward KL to the target's distribution over that map. Held-out sequences report how often
the draft's greedy token is the target's greedy token, before and after: that rate is what a greedy
draft's acceptance follows."""

import argparse
import json
import os
import time

import torch

from speclm.bench.machine import machine_info
from speclm.distill.data import TargetData, split_sequences
from speclm.distill.objectives import DraftObjective, HeadSpace
from speclm.distill.student import save_draft_model, training_hidden_states
from speclm.distill.trainer import TrainConfig, Trainer
from speclm.models.builder import build_model
from speclm.models.loader import load_checkpoint
from speclm.speculative.factory import added_token_ids, frequent_tokens
from speclm.tokenizer import load_tokenizer


def head_weight(checkpoint) -> torch.Tensor:
    t = checkpoint.tensors
    return t["lm_head.weight"] if "lm_head.weight" in t else t["model.embed_tokens.weight"]


@torch.no_grad()
def agreement(student, student_space: HeadSpace, data: TargetData) -> dict:
    """Over the response positions of `data`: the share where the student's greedy token (inside the
    map) is the target's greedy token, and the mean run of agreeing positions from each position
    capped at 4 (a proxy for tokens accepted per K=4 step, minus the bonus token)."""
    hits, total, runs = 0, 0, 0.0
    for i in range(len(data)):
        tokens, _, prompt_len = data.sequence(i)
        hidden = training_hidden_states(student, tokens)
        rows = torch.arange(prompt_len - 1, tokens.numel() - 1)
        guess = student_space.token_map[student_space.logits(hidden[rows]).argmax(-1)]
        ok = (guess == tokens[rows + 1]).tolist()
        hits, total = hits + sum(ok), total + len(ok)
        for j in range(len(ok)):
            run = 0
            while run < 4 and j + run < len(ok) and ok[j + run]:
                run += 1
            runs += run
    return {"agree": round(hits / max(1, total), 4), "run4": round(runs / max(1, total), 3), "positions": total}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="target_data.safetensors from make_data.py")
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=12, help="trainable decoder layers, counted from the last")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-len", type=int, default=448)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--max-minutes", type=float, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    data = TargetData.load(args.data)
    train_ids, val_ids = split_sequences(len(data), args.val_fraction, 0)
    train, val = data.subset(train_ids), data.subset(val_ids)
    draft_ck = load_checkpoint(args.draft)
    vocab = draft_ck.config.vocab_size
    token_map = frequent_tokens(args.vocab, vocab, draft_ck.config.eos_token_ids + added_token_ids(args.draft))
    target_head = head_weight(load_checkpoint(args.target))
    teacher_space, student_space = HeadSpace(target_head, token_map), HeadSpace(head_weight(draft_ck), token_map)
    del target_head
    student = build_model(draft_ck, weights="fp32")
    n = student.config.num_layers
    for p in student.parameters():
        p.requires_grad_(False)
    for layer in student.layers[n - args.layers :]:
        for p in layer.parameters():
            p.requires_grad_(True)
    for p in student.norm.parameters():
        p.requires_grad_(True)
    before = agreement(student, student_space, val)
    print("held-out before", before, flush=True)
    objective = DraftObjective(
        student, train, teacher_space, batch_size=args.batch_size, max_len=args.max_len, student_space=student_space
    )
    config = TrainConfig(steps=args.steps, lr=args.lr, warmup_steps=5, checkpoint_every=0, max_minutes=args.max_minutes)
    result = Trainer(objective, config, os.path.join(args.out, "train_state")).train()
    after = agreement(student, student_space, val)
    print("held-out after", after, flush=True)
    summary = {
        "machine": machine_info(),
        "data": args.data,
        "train_sequences": len(train),
        "train_tokens": int(train.tokens.numel()),
        "val_sequences": len(val),
        "options": vars(args),
        "steps": result.steps_done,
        "train_s": round(result.seconds, 1),
        "first_loss": sum(result.losses[:5]) / max(1, len(result.losses[:5])),
        "final_loss": sum(result.losses[-5:]) / max(1, len(result.losses[-5:])),
        "held_out_before": before,
        "held_out_after": after,
    }
    save_draft_model(student, load_tokenizer(args.draft), args.out, metadata={"finetune": json.dumps(summary)})
    summary["total_s"] = round(time.perf_counter() - start, 1)
    with open(os.path.join(args.out, "finetune_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
