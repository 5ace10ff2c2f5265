"""Reference run for chapter 06: the sort task and Shakespeare's characters, three seeds each.

Trains the nine models the chapter evaluates (too much training for its 90 s): the sorting Transformer-XL, and on
Shakespeare the Transformer-XL (segments and memory of 32) and the vanilla model of chapter 01, seeds 0, 1 and 2. Writes,
next to this file, `06_model/models.safetensors` (the weights in float16, about 2 MB) and `06_model/training_log.json`
(configs, vocabulary, training losses, each model's held-out result in float32, seconds).
Run from the repository root: `python reference/06_model.py` (or `make reference`); about half an hour of CPU time on
one core. Fixed seeds: a rerun gives the same models up to the last bits of float arithmetic.
"""
import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib.data import corpus_streams, sort_task
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.training import evaluate, stream_documents, train
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest
from txl_lib.vanilla import VanillaTransformerLM

OUT = Path(__file__).with_suffix("")                 # reference/06_model/
SEEDS = (0, 1, 2)
SORT = dict(n_digits=6, steps=1200, lr=5e-3, batch_size=128, n_examples=20000)
TEXT = dict(steps=1600, tgt_len=32, lr=3e-3, batch_size=16, eval_batch_size=16, valid_fraction=0.01)
VANILLA = dict(n_layer=2, n_head=4, d_model=64, d_inner=256)


def held_out_segments(held_out: torch.Tensor, T: int):
    "Inputs and targets (B, S) of the held-out streams, S a whole number of segments of T."
    S = (held_out.size(1) - 1) // T * T
    return held_out[:, :S], held_out[:, 1:S + 1]


def sort_accuracy(model, n_digits: int) -> float:
    "Digits right when the model generates the sorted half greedily, on 1,000 held-out examples (seed 1)."
    test = sort_task(1000, n_digits, generator=seed_everything(1))
    answer = test.targets[:, n_digits - 1:]
    generated = model.generate(test.inputs[:, :n_digits], n_digits, temperature=0)[:, n_digits:]
    return (generated == answer).float().mean().item()


def record(log: dict, weights: dict, key: str, model, losses: list, start: float, **extra):
    "Add a model's float16 weights under `key/` and its log entry."
    weights.update({f"{key}/{k}": v.detach().half().contiguous() for k, v in model.state_dict().items()})
    log["models"][key] = dict(seconds=round(time.perf_counter() - start, 1),
                              final_loss=round(sum(losses[-50:]) / 50, 4),
                              loss_per_100_steps=[round(sum(losses[i:i + 100]) / 100, 4)
                                                  for i in range(0, len(losses), 100)], **extra)


def train_sorters(log: dict, weights: dict):
    n = SORT["n_digits"]
    config = TXLConfig.tiny(n_token=10, tgt_len=2 * n - 1, mem_len=2 * n)
    log["sort"] = dict(SORT, config=dataclasses.asdict(config))
    data = sort_task(SORT["n_examples"], n, generator=seed_everything(0))
    for seed in SEEDS:
        start = time.perf_counter()
        seed_everything(seed)
        model = TransformerXL(config)
        losses = train(model, data.batches(SORT["batch_size"], seed_everything(seed)), steps=SORT["steps"],
                       tgt_len=2 * n - 1, lr=SORT["lr"], desc=f"sort, seed {seed}")
        record(log, weights, f"sort/seed {seed}", model, losses, start, accuracy=round(sort_accuracy(model, n), 4))


def train_text(log: dict, weights: dict):
    vocab, train_data, held_out = corpus_streams("shakespeare", TEXT["batch_size"], TEXT["valid_fraction"],
                                                 TEXT["eval_batch_size"])
    T = TEXT["tgt_len"]
    xl_config = TXLConfig.tiny(n_token=len(vocab), tgt_len=T, mem_len=T)
    log["shakespeare"] = dict(TEXT, vocab="".join(vocab.itos), xl_config=dataclasses.asdict(xl_config), vanilla=VANILLA)
    for name in ("xl", "vanilla"):
        for seed in SEEDS:
            start = time.perf_counter()
            seed_everything(seed)
            model = TransformerXL(xl_config) if name == "xl" else VanillaTransformerLM(len(vocab), **VANILLA)
            losses = train(model, stream_documents(train_data), steps=TEXT["steps"], tgt_len=T, lr=TEXT["lr"],
                           desc=f"shakespeare {name}, seed {seed}")
            bpc = evaluate(model, *held_out_segments(held_out, T), tgt_len=T).bits_per_token
            record(log, weights, f"shakespeare {name}/seed {seed}", model, losses, start, held_out_bpc=round(bpc, 4))


def main():
    torch.set_num_threads(1)
    log, weights = dict(torch=torch.__version__, seeds=list(SEEDS), models={}), {}
    train_sorters(log, weights)
    train_text(log, weights)
    OUT.mkdir(exist_ok=True)
    save_file(weights, OUT / "models.safetensors")
    (OUT / "training_log.json").write_text(json.dumps(log, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: {len(log['models'])} models, "
          f"{(OUT / 'models.safetensors').stat().st_size / 2**20:.1f} MiB of weights")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
