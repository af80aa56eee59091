"""What the audio tower itself can tell: a linear probe of sound presence on its frozen features.

The evidence game can add only what the audio roles perceive beyond c0 (``tools/instruct_probe.py``).
This bounds that perception from below on the real-speech world: the audio tower of a ``save_pretrained``
audio LM (the roles' shared Whisper tiny.en encoder) encodes each clip once; the mean and max of its
frames over the clip's duration feed one logistic regression per sound effect, fitted on the train
split and scored on the test split (AUC; the share of present sounds found at the false-alarm rate
given). A sound the probe finds but c0 omits is one the encoder holds and the captioner does not say.

    OMP_NUM_THREADS=2 python tools/encoder_probe.py --model runs/real/audiomap-sft/export/policy \\
        --data data/real_speech --false-alarm 0.01
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FRAMES_PER_SECOND = 50  # Whisper's encoder: 1500 frames for its 30 s window


def clip_features(model, extractor, rows: list[dict]):
    """(clips, 2 * d_model): mean and max of the encoder's frames over each clip (rows of ``read_manifest``)."""
    import torch

    from agentcap.core.manifests import audio_where, load_audio, resolve

    out = []
    with torch.no_grad():
        for row in rows:
            path = resolve(row["audio"], row["_manifest"])
            wave = load_audio(path, extractor.sampling_rate, audio_where(row, "audio", path))
            features = extractor(wave, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
            frames = model.model.audio_tower(features.to(model.dtype)).last_hidden_state[0]
            n = max(1, min(frames.shape[0], math.ceil(row["duration"] * FRAMES_PER_SECOND)))
            out.append(torch.cat([frames[:n].mean(0), frames[:n].max(0).values]).float())
    return torch.stack(out)


def presence(rows: list[dict], names: list[str]):
    import torch

    return torch.tensor([[float(any(e["label"] == n for e in row["events"])) for n in names] for row in rows])


def fit_logistic(x, y, weight_decay: float = 1e-2, steps: int = 200):
    """One L2-regularised logistic regression (full-batch L-BFGS) on standardised features."""
    import torch

    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + weight_decay * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def auc(scores, labels) -> float:
    """Probability that a present clip scores above an absent one (ties count half)."""
    pos = [s for s, t in zip(scores, labels) if t]
    neg = [s for s, t in zip(scores, labels) if not t]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def found_at(scores, labels, false_alarm: float) -> tuple[int, int, int]:
    """(present found, present, false alarms) at the highest threshold whose false-alarm share ≤ ``false_alarm``."""
    neg = sorted((s for s, t in zip(scores, labels) if not t), reverse=True)
    allowed = int(math.floor(false_alarm * len(neg)))
    threshold = neg[allowed] if allowed < len(neg) else -math.inf  # strictly above the (allowed+1)-th absent score
    found = sum(1 for s, t in zip(scores, labels) if t and s > threshold)
    alarms = sum(1 for s, t in zip(scores, labels) if not t and s > threshold)
    return found, sum(1 for t in labels if t), alarms


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a save_pretrained audio LM folder (its processor beside it)")
    p.add_argument("--data", default="data/real_speech", help="the world's folder (train.jsonl, test.jsonl)")
    p.add_argument("--false-alarm", type=float, default=0.01)
    args = p.parse_args(argv)

    import torch
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    from agentcap.core.manifests import read_manifest
    from agentcap_envs.real.speech import EFFECTS

    extractor = AutoProcessor.from_pretrained(args.model).feature_extractor
    model = Qwen2AudioForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).eval()
    names = [e.name for e in EFFECTS]
    splits = {}
    for split in ("train", "test"):
        rows = read_manifest(os.path.join(args.data, f"{split}.jsonl"),
                             required={"id": str, "audio": str, "duration": (int, float), "events": list})
        splits[split] = (clip_features(model, extractor, rows), presence(rows, names))
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-6)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    print(f"| sound | train present | test present | AUC | found at ≤ {args.false_alarm:.0%} false alarms |")
    print("|---|---|---|---|---|")
    totals = [0, 0, 0, 0]
    for k, name in enumerate(names):
        w, b = fit_logistic(x_train, y_train[:, k])
        scores = (x_test @ w + b).tolist()
        labels = [bool(t) for t in y_test[:, k].tolist()]
        found, present, alarms = found_at(scores, labels, args.false_alarm)
        totals = [totals[0] + found, totals[1] + present, totals[2] + alarms, totals[3] + len(labels) - present]
        print(f"| {name} | {int(y_train[:, k].sum())} | {present} | {auc(scores, labels):.3f} | "
              f"{found} of {present} ({alarms} false alarms) |")
    print(f"| all | {int(y_train.sum())} | {totals[1]} | | {totals[0]} of {totals[1]} "
          f"({totals[2]} false alarms of {totals[3]} absent) |")


if __name__ == "__main__":
    main()
