"""Reference run for chapter 08b's second half: why Transformer-XL works, measured on Shakespeare with every model
tuned alike.

The question is which half of Transformer-XL does the work, its relative positions or its memory, and whether a
longer memory helps when a model is trained with it. Every model reads the same training works (chapter 11's
`load_splits("shakespeare")`) as 16 streams in segments of 64 characters, carrying its memory (chapter 00b's `train`:
Adam, warm-up then cosine, clip 0.25). The body is the reference run's (`reference/real_text.py`: 4 layers, width 128,
4 heads of 32), but the budget is smaller so that the whole set fits in about an hour and a quarter on 2 cores:
800 steps of 16 x 64 characters (819,200 characters per model, against 6.1M there). Everything is scaled down
together; no row is dropped.

The models (`KINDS`), every one within 2 % of Transformer-XL's parameter count (the position-free bodies get a wider
feed-forward, `matched`):
- `xl`: Transformer-XL (relative positions, memory 64); `xl-memory0`: the same model trained without memory
  (relative positions alone); `xl-memory32`, `-128`, `-256`: trained with memories of 32, 128 and 256;
- `vanilla`: absolute sinusoid positions restarting in every segment (the original's attention type 2), no memory;
  `vanilla-memory`: the same trained with a memory of 64 (the original's way: positions collide, chapter 02);
- `shaw`, `shaw-memory`: learned relative positions (type 1, Shaw et al.), without and with a memory of 64;
- `learned`, `learned-memory`: learned absolute positions added in every layer (type 3), without and with memory;
- `lstm`: chapter 06c's LSTM, 2 layers of 232, tied embedding;
- `vanilla-time`, `lstm-time`: `vanilla` and `lstm` trained for as long as `xl` took: 800 steps times the ratio of
  the final runs' CPU seconds (mean of the seeds, xl's over the kind's), so each trains as long as xl did (the same
  batches, more of them). (An earlier sizing from 20 timed steps gave them 58 % and 51 % of xl's time.)

Tuning, the same budget for every kind: on seed 0, a quarter of the steps (200) at each learning rate of `LRS`, the
LSTM also with each embedding initialisation of `LSTM_INITS`; the setting with the lowest validation bpc is chosen.
Where that is the grid's largest rate, the grid goes on doubling until a rate does worse.
Whether a quarter of the steps picks what the full length would: the runner-up settings of `xl` and `vanilla` are
also trained for the full 800 steps on seed 0, against the chosen ones' final seed-0 runs.
The time-matched and longer-memory rows use their kind's choice (`vanilla`, `lstm`, `xl`). The test works are read
only by the final runs.

Final runs: seeds 0, 1 and 2 of every model, each stored with `save_pretrained` (float16 weights) in
`reference/ablation/<model>-seed<seed>/`, loaded back and scored there: validation and test bpc (the works as 8
streams, segments of 64, the model's own memory), the Transformer-XL family also on the first 65,536 test characters
with its own memory, every longer one of `MEMORIES` and none; every model on the targets of the first 16,384 test
characters that have a full window of 64 before them, in segments (one stream, its own memory), and `vanilla` also
by the paper's sliding window on the same targets.

Speed (the paper's Table 9): the operations per predicted character of the `xl` body at an attention length of 3,800,
counted (`counted_work`, chapter 08b): recomputing the context for each prediction against reading a segment with a
memory, projected again or through the inference cache, stored as `speed` in `results.json`.

Run from the repository root: `python reference/ablation.py` (or `make reference`); two worker processes, one thread
each. Each finished run leaves its record (`record.json`, or `tuning/<setting>.json`); `--resume` keeps every record
that matches the recipe and trains the rest, so the run can be stopped and resumed at any point.
"""
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import torch

from txl_lib import LSTMConfig, TXLConfig, VariantConfig, build_model, evaluate, from_pretrained, train
from txl_lib.corpora import load_splits
from txl_lib.real_text import SPEED_CLAIM, counted_work
from txl_lib.data import batchify
from txl_lib.training import stream_documents
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_atomically, write_manifest
from txl_lib.vanilla import sliding_window_loss

OUT = Path(__file__).with_suffix("")                 # reference/ablation/
ROOT = Path(__file__).resolve().parent.parent
RECIPE = dict(batch_size=16, tgt_len=64, steps=800, tuning_steps=200)
LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
LSTM_INITS = ("uniform", "normal")                   # nn.init.uniform_(-0.1, 0.1) (chapter 06c) or PyTorch's N(0, 1)
SEEDS = (0, 1, 2)
MEMORIES = (0, 32, 64, 128, 256, 512)                # the Transformer-XL family is also scored with the longer ones
HEAD, SLIDING = 65536, 16384                         # the test characters scored by memory; by sliding window
BODY = dict(n_layer=4, n_head=4, d_model=128, d_head=32, tgt_len=RECIPE["tgt_len"])


def xl(mem_len):
    return lambda n_token, d_inner=512: TXLConfig(n_token=n_token, mem_len=mem_len, d_inner=d_inner, **BODY)


def variant(attn_type, mem_len):
    return lambda n_token, d_inner=512: VariantConfig(n_token=n_token, attn_type=attn_type, mem_len=mem_len,
                                                      d_inner=d_inner, **BODY)


KINDS = {                                            # name -> (config given n_token and d_inner, tuned as)
    "xl": (xl(64), "xl"), "xl-memory0": (xl(0), "xl-memory0"),
    "vanilla": (variant(2, 0), "vanilla"), "vanilla-memory": (variant(2, 64), "vanilla-memory"),
    "shaw": (variant(1, 0), "shaw"), "shaw-memory": (variant(1, 64), "shaw-memory"),
    "learned": (variant(3, 0), "learned"), "learned-memory": (variant(3, 64), "learned-memory"),
    "lstm": (lambda n_token, d_inner=None: LSTMConfig(n_token=n_token, n_layer=2, d_model=232,
                                                      tgt_len=RECIPE["tgt_len"]), "lstm"),
    **{f"xl-memory{M}": (xl(M), "xl") for M in (32, 128, 256)},
}
TIMED = {"vanilla-time": "vanilla", "lstm-time": "lstm"}  # trained for the XL's CPU time
TUNED = [name for name, (_, tuned_as) in KINDS.items() if tuned_as == name]


def n_params(config) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(config).parameters())


def matched(name: str, n_token: int):
    "The config of `name`, its feed-forward widened until its parameter count is nearest Transformer-XL's."
    make, target = KINDS[name][0], n_params(KINDS["xl"][0](n_token))
    if isinstance(make(n_token), LSTMConfig) or name.startswith("xl"):
        return make(n_token)
    per_unit = n_params(make(n_token, 513)) - n_params(make(n_token, 512))
    return make(n_token, 512 + round((target - n_params(make(n_token, 512))) / per_unit))


def bits_on(model, ids: torch.Tensor, mem_len: int | None = None) -> float:
    "Bits per character over `ids` (S,) read as 8 streams in segments of 64, memory `mem_len` (None: its own)."
    data = batchify(ids, 8)
    return evaluate(model, data[:, :-1], data[:, 1:], RECIPE["tgt_len"], mem_len).bits_per_token


def fit(name: str, seed: int, steps: int, lr: float, init: str, corpus) -> tuple:
    "Train model `name` from `seed`: the model, its CPU seconds and its mean loss over the last 50 steps."
    torch.set_num_threads(1)
    seed_everything(seed)
    model = build_model(matched(name, len(corpus.vocab)))
    if init == "normal":
        torch.nn.init.normal_(model.embed.weight)
    start = time.process_time()
    losses = train(model, stream_documents(batchify(corpus.train, RECIPE["batch_size"])), steps=steps,
                   tgt_len=RECIPE["tgt_len"], lr=lr, desc=f"{name}, seed {seed}, lr {lr:g}, {init}")
    return model, time.process_time() - start, sum(losses[-50:]) / len(losses[-50:])


def read_record(path: Path, **expected) -> dict | None:
    "The record at `path` if it exists and matches every `expected` field, else None."
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if all(record.get(k) == v for k, v in expected.items()) else None


def tune(job: tuple[str, float, str, int, bool]) -> dict:
    "One tuning run: `name` at `lr` (and `init`), seed 0, `steps`; scored on the validation works."
    name, lr, init, steps, resume = job
    length = "" if steps == RECIPE["tuning_steps"] else f"-steps{steps}"
    path = OUT / "tuning" / f"{name}-lr{lr:g}-{init}{length}.json"
    if resume and (done := read_record(path, recipe=RECIPE)):
        return done
    corpus = load_splits("shakespeare")
    model, seconds, final = fit(name, 0, steps, lr, init, corpus)
    record = dict(model=name, lr=lr, init=init, steps=steps, recipe=RECIPE,
                  valid_bpc=bits_on(model.eval(), corpus.valid), final_training_loss=final,
                  train_cpu_seconds=round(seconds, 1))
    write_atomically(path, json.dumps(record, indent=1).encode())
    return record


def run(job: tuple[str, int, int, float, str, bool]) -> dict:
    "Train `name` from `seed` for `steps` at (lr, init), store it, and score the stored folder: one record."
    name, seed, steps, lr, init, resume = job
    folder = OUT / f"{name}-seed{seed}"
    if resume and (done := read_record(folder / "record.json", train_steps=steps, lr=lr, init=init,
                                       recipe=RECIPE)):
        return done
    corpus = load_splits("shakespeare")
    model, seconds, final = fit(TIMED.get(name, name), seed, steps, lr, init, corpus)
    (folder / "record.json").unlink(missing_ok=True)                 # the folder changes: its old record goes first
    model.half().save_pretrained(folder)
    stored = from_pretrained(folder)                                  # float16 weights in a float32 model
    own = getattr(stored.config, "mem_len", 0)
    family = isinstance(stored.config, TXLConfig) and not isinstance(stored.config, VariantConfig)
    by_memory = {M: bits_on(stored, corpus.test[:HEAD], M) for M in MEMORIES if M >= own or M == 0} if family else None
    x, y, T = corpus.test[None, :SLIDING - 1], corpus.test[None, 1:SLIDING], RECIPE["tgt_len"]
    segments = evaluate(stored, x, y, T).losses[:, T - 1:].mean().item() / math.log(2)
    sliding = dict(chars=SLIDING, window=T, segment_bpc=segments,   # the targets with a full window before them
                   sliding_bpc=sliding_window_loss(stored, x, y, T).mean().item() / math.log(2)
                   if name == "vanilla" else None)
    record = dict(model=name, seed=seed, lr=lr, init=init, recipe=RECIPE, train_steps=steps,
                  params=sum(p.numel() for p in stored.parameters()), mem_len=own,
                  train_chars=steps * RECIPE["batch_size"] * RECIPE["tgt_len"],
                  folder=str(folder.relative_to(ROOT)), valid_bpc=bits_on(stored, corpus.valid),
                  test_bpc=bits_on(stored, corpus.test), test_bpc_by_memory=by_memory, sliding=sliding,
                  final_training_loss=final, train_cpu_seconds=round(seconds, 1))
    write_atomically(folder / "record.json", json.dumps(record, indent=1).encode())
    return record


def main(workers: int = 2, resume: bool = False, kinds: tuple = tuple(KINDS)):
    (OUT / "tuning").mkdir(parents=True, exist_ok=True)
    start = time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        settings = [(name, lr, init, RECIPE["tuning_steps"], resume) for name in TUNED for lr in LRS
                    for init in (LSTM_INITS if name == "lstm" else ("uniform",))]
        tuning = pool.map(tune, settings, chunksize=1)
        while top := [ranked[0] for name in TUNED if (ranked := sorted(
                (t for t in tuning if t["model"] == name), key=lambda t: t["valid_bpc"]))[0]["lr"]
                == max(t["lr"] for t in tuning if t["model"] == name)]:  # best at the grid's top: go on
            tuning += pool.map(tune, [(t["model"], 2 * t["lr"], t["init"], RECIPE["tuning_steps"], resume)
                                      for t in top], chunksize=1)
        ranked = {name: sorted((t for t in tuning if t["model"] == name), key=lambda t: t["valid_bpc"])
                  for name in TUNED}
        chosen = {name: ranked[name][0] for name in TUNED}
        setting = {name: (chosen[tuned_as]["lr"], chosen[tuned_as]["init"]) for name, (_, tuned_as) in KINDS.items()}
        jobs = [(name, seed, RECIPE["steps"], *setting[name], resume) for name in kinds for seed in SEEDS]
        longest_first = sorted(jobs, key=lambda job: -getattr(KINDS[job[0]][0](84), "mem_len", 0))
        runs = pool.map(run, longest_first, chunksize=1)
        # as many steps as make the CPU seconds equal xl's, from the final runs' own seconds (mean of the seeds)
        cpu = {name: sum(r["train_cpu_seconds"] for r in runs if r["model"] == name) / len(SEEDS)
               for name in ("xl", *TIMED.values())}
        timed_steps = {name: round(RECIPE["steps"] * cpu["xl"] / cpu[of]) for name, of in TIMED.items()}
        runs += pool.map(run, [(name, seed, timed_steps[name], *setting[of], resume)
                               for name, of in TIMED.items() for seed in SEEDS], chunksize=1)
        # does the choice hold at full length? the runner-up of the headline pair, trained as long as the finals
        full_length = [(name, ranked[name][1]["lr"], ranked[name][1]["init"], RECIPE["steps"], resume)
                       for name in ("xl", "vanilla")]
        tuning += pool.map(tune, full_length, chunksize=1)
    # Table 9's claim, counted on the xl body: the work of recomputing L characters per prediction against a segment
    L = SPEED_CLAIM[1]
    speed = dict(L=L, model="xl", **counted_work(KINDS["xl"][0](len(load_splits("shakespeare").vocab)), L))
    results = dict(recipe=RECIPE, seeds=list(SEEDS), corpus="shakespeare (chapter 11)", lrs=list(LRS), speed=speed,
                   lstm_inits=list(LSTM_INITS), tuning=tuning,
                   chosen={name: dict(lr=c["lr"], init=c["init"]) for name, c in chosen.items()},
                   final_cpu_seconds=cpu, timed_steps=timed_steps, wall_seconds=round(time.time() - start), workers=workers,
                   device="cpu", torch=torch.__version__, resumed=resume, runs=runs)
    write_atomically(OUT / "results.json", json.dumps(results, indent=1).encode())
    for r in runs:
        print(f"{r['model']:15s} seed {r['seed']}: {r['params']:,} parameters, lr {r['lr']:g}, "
              f"valid {r['valid_bpc']:.3f}, test {r['test_bpc']:.3f} bpc, {r['train_cpu_seconds']:.0f} CPU s")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":  # --resume; --kinds a,b,c trains only those kinds (and the time-matched rows)
    only = [a.removeprefix("--kinds=") for a in sys.argv[1:] if a.startswith("--kinds=")]
    main(resume="--resume" in sys.argv[1:], kinds=tuple(only[0].split(",")) if only else tuple(KINDS))
