"""Reference run for the real-text evidence: Transformer-XL, a vanilla Transformer, the vanilla Transformer trained
with a memory, and an LSTM, each from three seeds, on the same Shakespeare characters.

Every model reads the training works (chapter 11's `load_splits("shakespeare")`: all plays but four held out whole) as
32 streams, in segments of 64 characters, for 3,000 steps of Adam (1e-3, warm-up then cosine, clip 0.25: chapter 00b's
`train`), 6,144,000 characters each, carrying its memory from segment to segment:

- `xl`: Transformer-XL (chapter 06), 4 layers, width 128, 4 heads of 32, feed-forward 512, memory 64;
- `vanilla`: the original code's absolute-position Transformer (chapter 08's attention type 2, Vaswani et al.'s
  sinusoids restarting in every segment), the same body without u, v and W_r, no memory;
- `vanilla-memory`: the same model trained with a memory of 64: the original's way of giving it one (layer 0's memory
  re-encoded at earlier positions; the upper layers' memories keep the positions they were computed at, which collide
  with the segment's: chapter 02's problem);
- `lstm`: the LSTM of chapter 06c, 2 layers of 232 (tied embedding), the same parameter count;
- `lstm-time`: the same LSTM trained for as long as the Transformer-XL took: its step count is the XL's mean CPU
  seconds over the LSTM's, measured in this run, times 3,000 (same batches, more of them: equal training time).

Each trained model is stored with `save_pretrained` (weights in float16, as the other reference runs store theirs)
in `reference/real_text/<model>-seed<seed>/`, then loaded back with `from_pretrained` and scored on the validation
the test works in segments of 64 with the model's own memory (`evaluate`): `test_bpc` reads the test works as one
stream, `valid_bpc` the validation works as 8 streams; the models with a memory are also scored with memories of 0 to
512 (the test works as 8 streams, `test_bpc_by_memory`), the vanilla ones also by the paper's sliding window on the first
16,384 test characters (against segments on the same targets), and every model on the first 8,192 test characters
(which the chapters re-score live). The numbers in `reference/real_text/results.json` are those of the stored
folders, reproducible by loading them.

For RECL (the paper's Appendix C, chapter 08a), the stored `xl`, `vanilla`, `lstm` and `lstm-time` models score the
same 8,192 test characters (64 stretches of 128, spread over the test works) after exactly c characters of context,
c = 8, 16, ..., 160: `reference/real_text/context_losses.safetensors`, one (20, 8,192) table of losses in nats per
run, named like its folder (about 45 minutes on 2 cores; `--resume` keeps the trained runs and scores them again).

Run from the repository root: `python reference/real_text.py` (or `make reference`); two worker processes, one thread
each. Fixed seeds: a rerun gives the same models up to the last bits of float arithmetic. Each finished run leaves its
record in its folder (`record.json`); `--resume` keeps the runs whose record matches the recipe and trains the rest.
"""
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib import LSTMConfig, TXLConfig, VariantConfig, build_model, evaluate, from_pretrained, train
from txl_lib.corpora import load_splits
from txl_lib.recl import losses_at_contexts
from txl_lib.data import batchify
from txl_lib.infrastructure import write_atomically, write_manifest
from txl_lib.training import stream_documents
from txl_lib.utils import seed_everything
from txl_lib.vanilla import sliding_window_loss

OUT = Path(__file__).with_suffix("")                 # reference/real_text/
ROOT = Path(__file__).resolve().parent.parent
RECIPE = dict(batch_size=32, tgt_len=64, steps=3000, lr=1e-3)
SEEDS = (0, 1, 2)
BODY = dict(n_layer=4, n_head=4, d_model=128, d_head=32, d_inner=512, tgt_len=RECIPE["tgt_len"])
MODELS = {                                           # name -> the config of its model, given the vocabulary size
    "xl": lambda n_token: TXLConfig(n_token=n_token, mem_len=64, **BODY),
    "vanilla-memory": lambda n_token: VariantConfig(n_token=n_token, attn_type=2, mem_len=64, **BODY),
    "vanilla": lambda n_token: VariantConfig(n_token=n_token, attn_type=2, mem_len=0, **BODY),
    "lstm": lambda n_token: LSTMConfig(n_token=n_token, n_layer=2, d_model=232, tgt_len=RECIPE["tgt_len"]),
}
MODELS["lstm-time"] = MODELS["lstm"]                 # trained for the XL's CPU time (main)
CONTEXTS = dict(contexts=list(range(8, 161, 8)), stretches=64, stretch_tokens=128)  # the RECL tables
CONTEXT_MODELS = ("xl", "vanilla", "lstm", "lstm-time")


HEAD, SLIDING = 8192, 16384                          # the test characters chapters re-score live; the sliding slice
LONGER = (0, 64, 128, 256, 512)                      # memories the models with one are also scored with


def bits_on(model, ids: torch.Tensor, mem_len: int | None = None, streams: int = 1) -> float:
    "Bits per character over `ids` (S,) read as `streams` streams in segments of tgt_len, memory `mem_len` (None: its own)."
    data = batchify(ids, streams)
    return evaluate(model, data[:, :-1], data[:, 1:], RECIPE["tgt_len"], mem_len).bits_per_token


def sliding_and_segments(model, ids: torch.Tensor) -> dict:
    "The same targets of `ids` (those with a full window before them) scored by the paper's sliding window and by segments."
    x, y, T = ids[None, :-1], ids[None, 1:], RECIPE["tgt_len"]
    sliding = sliding_window_loss(model, x, y, T).mean().item() / math.log(2)
    segments = evaluate(model, x, y, T).losses[:, T - 1:].mean().item() / math.log(2)
    return dict(chars=len(ids), window=T, sliding_bpc=sliding, segment_bpc=segments)


def context_losses(model, ids: torch.Tensor, memory: int | None) -> torch.Tensor:
    "Loss (C, n) of the RECL tokens of `ids` (the test works), each after exactly c characters, c in CONTEXTS."
    c, n = CONTEXTS["contexts"], CONTEXTS["stretch_tokens"]
    starts = torch.linspace(0, len(ids) - max(c) - n, CONTEXTS["stretches"]).long().tolist()
    return torch.cat([losses_at_contexts(model, ids[s:s + max(c) + n], c, RECIPE["tgt_len"], n, memory)
                      for s in starts], dim=1)


def finished(name: str, seed: int, steps: int) -> dict | None:
    "The record of a finished run of this recipe, or None."
    record = OUT / f"{name}-seed{seed}" / "record.json"
    if not record.exists():
        return None
    run = json.loads(record.read_text())
    return run if run["train_chars"] == steps * RECIPE["batch_size"] * RECIPE["tgt_len"] else None


def run(job: tuple[str, int, int, bool]) -> dict:
    "Train model `name` from `seed` for `steps`, store it, and score the stored folder: one record of results.json."
    name, seed, steps, resume = job
    if resume and (done := finished(name, seed, steps)):
        return done
    torch.set_num_threads(1)
    corpus = load_splits("shakespeare")
    seed_everything(seed)
    model = build_model(MODELS[name](len(corpus.vocab)))
    start = time.process_time()
    losses = train(model, stream_documents(batchify(corpus.train, RECIPE["batch_size"])), steps=steps,
                   tgt_len=RECIPE["tgt_len"], lr=RECIPE["lr"], desc=f"{name}, seed {seed}")
    seconds = time.process_time() - start
    folder = OUT / f"{name}-seed{seed}"
    (folder / "record.json").unlink(missing_ok=True)                 # the folder changes: its old record goes first
    model.half().save_pretrained(folder)
    stored = from_pretrained(folder)                                  # float16 weights in a float32 model
    memory = getattr(stored.config, "mem_len", 0) > 0
    record = dict(model=name, seed=seed, params=sum(p.numel() for p in stored.parameters()),
                train_chars=steps * RECIPE["batch_size"] * RECIPE["tgt_len"], tgt_len=RECIPE["tgt_len"],
                mem_len=getattr(stored.config, "mem_len", None), folder=str(folder.relative_to(ROOT)),
                valid_bpc=bits_on(stored, corpus.valid, streams=8), test_bpc=bits_on(stored, corpus.test),
                test_head_bpc=bits_on(stored, corpus.test[:HEAD]),
                test_bpc_by_memory={M: bits_on(stored, corpus.test, M, streams=8) for M in LONGER} if memory else None,
                sliding=sliding_and_segments(stored, corpus.test[:SLIDING]) if name.startswith("vanilla") else None,
                final_training_loss=sum(losses[-50:]) / len(losses[-50:]), train_cpu_seconds=round(seconds, 1))
    write_atomically(folder / "record.json", json.dumps(record, indent=1).encode())
    return record


def score_contexts(job: tuple[str, int]) -> torch.Tensor:
    "The RECL table of the stored run `name`-seed`seed`: XL reads all c with its memory; the others as trained."
    (name, seed), memory = job, max(CONTEXTS["contexts"]) if job[0] == "xl" else None
    torch.set_num_threads(1)
    return context_losses(from_pretrained(OUT / f"{name}-seed{seed}"), load_splits("shakespeare").test, memory)


def main(workers: int = 2, resume: bool = False):
    OUT.mkdir(exist_ok=True)
    start = time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        jobs = [(name, seed, RECIPE["steps"], resume) for name in MODELS if name != "lstm-time" for seed in SEEDS]
        runs = pool.map(run, jobs, chunksize=1)                      # the slowest models first
        cpu = {name: sum(r["train_cpu_seconds"] for r in runs if r["model"] == name) for name in ("xl", "lstm")}
        equal_time_steps = round(RECIPE["steps"] * cpu["xl"] / cpu["lstm"])
        runs += pool.map(run, [("lstm-time", seed, equal_time_steps, resume) for seed in SEEDS], chunksize=1)
        names = [f"{name}-seed{seed}" for name in CONTEXT_MODELS for seed in SEEDS]
        tables = pool.map(score_contexts, [(name, seed) for name in CONTEXT_MODELS for seed in SEEDS], chunksize=1)
    tmp = OUT / "context_losses.safetensors.tmp"
    save_file(dict(zip(names, tables)), tmp, metadata={"contexts": json.dumps(CONTEXTS)})
    tmp.replace(OUT / "context_losses.safetensors")
    results = dict(recipe=RECIPE, seeds=list(SEEDS), corpus="shakespeare (chapter 11)", contexts=CONTEXTS,
                   equal_time_steps=equal_time_steps, wall_seconds=round(time.time() - start), resumed=resume,
                   workers=workers, runs=runs)
    write_atomically(OUT / "results.json", json.dumps(results, indent=1).encode())
    for r in runs:
        print(f"{r['model']:15s} seed {r['seed']}: {r['params']:,} parameters, valid {r['valid_bpc']:.3f}, "
              f"test {r['test_bpc']:.3f} bpc, {r['train_cpu_seconds']:.0f} CPU s")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main(workers=2, resume="--resume" in sys.argv[1:])
