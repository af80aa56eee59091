"""Fine-tune the coherence scorer LLM-AD* of READ (Appendix B.2) on an AD corpus.

READ scores a generated AD by its log-probability under a small causal LM adapted to AD style and
narrative continuity (Eq. 4). This tool makes that LM: given the (up to) three previous ADs as
context, it learns to predict the next AD with a causal LM loss. Defaults are Table 8: lr 1e-4,
batch 8 × gradient accumulation 8, 1 epoch, warmup ratio 0.03 (linear schedule), weight decay 0,
max sequence length 1024.

The loss is on the next-AD tokens (and a closing EOS) only, by default: the scorer is only ever
asked for p(AD | context), so spending capacity on modelling the context adds nothing to Eq. 4;
``--loss-on all`` also trains on the context tokens (the paper does not say which it used).
Sequences are built by :func:`agentcap.judges.coherence.encode_context_response`, the same function
the scorer uses, so training and scoring see identically serialized contexts. Gradient norm is
clipped at 1.0 (the HF ``Trainer`` default; Table 8 does not list it). The steps run under
``L.Trainer`` (``accumulate_grad_batches``, ``gradient_clip_val``), on CPU or one GPU, writing no
Lightning logs or checkpoints: the output folder holds only the saved scorer and its summary.

Corpus: JSONL, one row per AD, ``{"context": [previous ADs, oldest first], "ad": "next AD"}``.

    python tools/train_coherence_scorer.py --corpus data/toy_movie/corpus.jsonl --tiny \
        --out runs/read-demo/scorer --batch-size 16 --grad-accum 1 --lr 3e-3 --max-steps 300
    python tools/train_coherence_scorer.py --corpus audiovault.jsonl --base /models/gpt2 --out runs/llm_ad
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from agentcap.judges.coherence import encode_context_response

IGNORE = -100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="JSONL rows {'context': [ADs], 'ad': str}")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--base", type=Path, help="local HF causal LM folder to fine-tune (GPT-2 in READ)")
    model.add_argument("--tiny", action="store_true",
                       help="build a tiny random GPT-2 (2 layers, 2 heads, width 64) for offline demos/tests")
    parser.add_argument("--tokenizer", type=Path,
                        help="tokenizer folder; with --base it overrides the model's own; with --tiny and no"
                             " --tokenizer, a word-level tokenizer is built from the corpus's words")
    parser.add_argument("--out", type=Path, required=True, help="folder for save_pretrained model + tokenizer")
    parser.add_argument("--epochs", type=int, default=1, help="Table 8: 1")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch (Table 8: 8)")
    parser.add_argument("--grad-accum", type=int, default=8, help="micro-batches per optimiser step (Table 8: 8)")
    parser.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (Table 8: 1e-4)")
    parser.add_argument("--warmup-ratio", type=float, default=0.03, help="share of steps warming up (Table 8)")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (Table 8: 0)")
    parser.add_argument("--max-length", type=int, default=1024, help="longest training sequence (Table 8)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimiser steps")
    parser.add_argument("--context-size", type=int, default=3, help="previous ADs kept as context (B.2: 3)")
    parser.add_argument("--loss-on", choices=("ad", "all"), default="ad",
                        help="'ad': loss on the next AD only (recommended); 'all': context tokens too")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping; 0 disables")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every N optimiser steps")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "grad_accum", "max_length", "context_size", "log_every"):
        if getattr(args, name) < 1 and not (name == "context_size" and getattr(args, name) == 0):
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"--max-steps must be >= 1, got {args.max_steps}")
    if not 0.0 <= args.warmup_ratio < 1.0:
        parser.error(f"--warmup-ratio must be in [0, 1), got {args.warmup_ratio}")
    return args


def read_corpus(path: Path) -> list[tuple[list[str], str]]:
    """(context ADs, next AD) pairs; a malformed row is an error naming its line."""
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {str(path)!r} does not exist (expected JSONL rows {{'context': [...], 'ad': ...}})"
        )
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error})") from error
            if not isinstance(row, dict) or "ad" not in row or "context" not in row:
                raise ValueError(f"{where}: expected an object with 'context' and 'ad', got {line.strip()[:80]!r}")
            context, ad = row["context"], row["ad"]
            if not isinstance(ad, str) or not ad.strip():
                raise ValueError(f"{where}: 'ad' must be a non-empty string, got {ad!r}")
            if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
                raise ValueError(f"{where}: 'context' must be a list of strings, got {context!r}")
            rows.append((context, ad))
    if not rows:
        raise ValueError(f"corpus {str(path)!r} has no rows")
    return rows


def build_examples(
    rows: list[tuple[list[str], str]], tokenizer, max_length: int, context_size: int, loss_on: str
) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per row: ``[bos] context SEP ad [eos]``, labels IGNORE outside the loss."""
    eos = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    examples = []
    for context, ad in rows:
        kept = context[max(0, len(context) - context_size) :] if context_size else []
        prefix, ad_ids, _ = encode_context_response(tokenizer, kept, ad, max_length - len(eos))
        ids = prefix + ad_ids + eos
        if loss_on == "ad":
            labels = [IGNORE] * len(prefix) + ad_ids + eos
        else:
            labels = list(ids)
        examples.append((ids, labels))
    return examples


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` [B, T]."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for b, (ids, target) in enumerate(batch):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        labels[b, : len(target)] = torch.tensor(target)
        attention_mask[b, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def load_model_and_tokenizer(args: argparse.Namespace, rows: list[tuple[list[str], str]]):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

    if args.tokenizer is not None and not args.tokenizer.is_dir():
        raise FileNotFoundError(f"--tokenizer {str(args.tokenizer)!r} is not a folder (save one with save_pretrained)")
    if args.tiny:
        if args.tokenizer is not None:
            tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer), trust_remote_code=False)
        else:  # offline toy scorer: the corpus's own words are the vocabulary
            from agentcap.agents.tokenizer import build_word_tokenizer

            tokenizer = build_word_tokenizer(text for context, ad in rows for text in [*context, ad])
        special = {
            name: getattr(tokenizer, f"{name}_id")
            for name in ("bos_token", "eos_token", "pad_token")
            if getattr(tokenizer, f"{name}_id") is not None
        }
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=args.max_length,
            n_layer=2,
            n_head=2,
            n_embd=64,
            **{f"{name}_id": value for name, value in special.items()},
        )
        model = GPT2LMHeadModel(config)
    else:
        if not (args.base / "config.json").is_file():
            raise FileNotFoundError(
                f"--base {str(args.base)!r} is not a local HF model folder (no config.json); nothing is downloaded"
                " here, so pass a saved GPT-2 folder, or --tiny --tokenizer PATH for an offline toy scorer"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer or args.base), trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(str(args.base), trust_remote_code=False)
    return model, tokenizer


def _model_positions(model) -> int:
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1024


class MicroBatches:
    """The training data in a fixed order: each epoch one ``randperm`` of a generator seeded with
    ``--seed`` (kept apart from the global RNG, which dropout uses), cut into micro-batches. Each
    micro-batch carries ``n_targets``, the target-token count of its whole accumulation window, so the
    loss is a token-weighted mean over the window rather than a mean of per-batch means."""

    def __init__(self, examples, batch_size: int, grad_accum: int, pad_id: int, seed: int):
        self.examples, self.batch_size, self.grad_accum, self.pad_id = examples, batch_size, grad_accum, pad_id
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.examples), generator=self.generator).tolist()
        micro_batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for first in range(0, len(micro_batches), self.grad_accum):
            window = [
                collate([self.examples[i] for i in micro], self.pad_id)
                for micro in micro_batches[first : first + self.grad_accum]
            ]
            n_targets = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in window)
            for batch in window:
                yield {**batch, "n_targets": n_targets}


class ScorerModule(L.LightningModule):
    """Causal-LM fine-tuning of the scorer: AdamW with a linear warmup/decay stepped per optimiser
    step, and the loss printed every ``log_every`` steps."""

    def __init__(self, model, args: argparse.Namespace, warmup_steps: int, total_steps: int, started: float):
        super().__init__()
        self.model, self.args, self.started = model, args, started
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.window_loss, self.window_losses = 0.0, []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        nll = F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(),
            batch["labels"][:, 1:].flatten(),
            ignore_index=IGNORE,
            reduction="sum",
        )
        self.loss = nll / max(batch["n_targets"], 1)
        self.window_loss += float(self.loss.detach())
        return self.loss

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        # Lightning hands over the loss divided by accumulate_grad_batches; ours is already the
        # window's token-weighted mean, so its own graph is back-propagated, unscaled
        self.loss.backward(*args, **kwargs)

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        step = self.trainer.global_step
        if step == len(self.window_losses):  # still accumulating
            return
        self.window_losses.append(self.window_loss)
        self.window_loss = 0.0
        if step % self.args.log_every == 0 or step == self.total_steps:
            recent = self.window_losses[-self.args.log_every :]
            print(
                f"epoch {self.current_epoch} step {step}/{self.total_steps} loss {sum(recent) / len(recent):.4f}"
                f" lr {self.lr_schedulers().get_last_lr()[0]:.2e} ({time.perf_counter() - self.started:.1f}s)",
                flush=True,
            )

    def configure_optimizers(self):
        from transformers import get_linear_schedule_with_warmup

        optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.lr, weight_decay=self.args.weight_decay)
        scheduler = get_linear_schedule_with_warmup(optimizer, self.warmup_steps, self.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@contextlib.contextmanager
def _lightning_quiet():
    """Lightning's "GPU available", tips and "max_steps reached" notes, and its use of a deprecated
    torch API, are noise for this one-purpose tool (the old hand-written loop printed none of them)."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def fit(model, examples, pad_id: int, args: argparse.Namespace, warmup_steps: int, total_steps: int,
        started: float) -> list[float]:
    """Train ``model`` in place under ``L.Trainer``; the loss of each optimiser step's window."""
    device = torch.device(args.device)
    module = ScorerModule(model, args, warmup_steps, total_steps, started)
    with _lightning_quiet():
        trainer = L.Trainer(
            accelerator={"cuda": "gpu"}.get(device.type, device.type),
            devices=[device.index] if device.index is not None else 1,
            max_epochs=args.epochs,
            max_steps=total_steps,
            accumulate_grad_batches=args.grad_accum,
            gradient_clip_val=args.max_grad_norm if args.max_grad_norm > 0 else None,
            gradient_clip_algorithm="norm",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=str(args.out),
        )
        data = MicroBatches(examples, args.batch_size, args.grad_accum, pad_id, args.seed)
        trainer.fit(module, train_dataloaders=data)
    return module.window_losses


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    rows = read_corpus(args.corpus)
    model, tokenizer = load_model_and_tokenizer(args, rows)
    max_length = min(args.max_length, _model_positions(model))
    examples = build_examples(rows, tokenizer, max_length, args.context_size, args.loss_on)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pad_id = int(pad) if pad is not None else 0

    micro_per_epoch = math.ceil(len(examples) / args.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / args.grad_accum)
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    warmup_steps = math.ceil(args.warmup_ratio * total_steps)
    print(
        f"corpus {args.corpus}: {len(examples)} rows; {total_steps} optimiser steps of"
        f" {args.batch_size}x{args.grad_accum} sequences, warmup {warmup_steps}, lr {args.lr}, loss on {args.loss_on}",
        flush=True,
    )

    window_losses = fit(model, examples, pad_id, args, warmup_steps, total_steps, started)
    step = len(window_losses)
    last_loss = window_losses[-1] if window_losses else float("nan")

    args.out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    summary.update(steps=step, final_loss=last_loss, wall_seconds=time.perf_counter() - started)
    (args.out / "train_coherence_scorer.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"saved coherence scorer to {args.out} after {step} steps: final loss {last_loss:.4f},"
          f" wall time {time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
