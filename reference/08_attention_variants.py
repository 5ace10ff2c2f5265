"""Reference run for chapter 08: attention types 0-3, type 0 without recurrence and the vanilla Transformer
(type 2 without memory), three seeds each, on Shakespeare.

Trains the 18 models the chapter evaluates (too many to train inside its 90 s) and writes, next to this file,
`08_attention_variants/models.safetensors` (the weights, in float16: 3.5 MB) and
`08_attention_variants/training_log.json` (configs, vocabulary, training losses, seconds).
Run from the repository root: `python reference/08_attention_variants.py` (or `make reference`): 5 min 37 s
on one core of this project's 2-core machine (18 models of 1,200 steps). Fixed seeds: a rerun gives the same
models up to the last bits of float arithmetic.
"""
import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib.data import corpus_streams
from txl_lib.training import stream_documents, train
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest
from txl_lib.pretrained import build_model
from txl_lib.variants import config_of_type

OUT = Path(__file__).with_suffix("")                 # reference/08_attention_variants/
ROWS = {"type 0": dict(attn_type=0), "type 1": dict(attn_type=1), "type 2": dict(attn_type=2),
        "type 3": dict(attn_type=3), "type 0 without recurrence": dict(attn_type=0, mem_len=0),
        "vanilla": dict(attn_type=2, mem_len=0)}      # the vanilla Transformer: absolute positions, no memory
SEEDS, STEPS, TGT_LEN, LR = (0, 1, 2), 1200, 32, 3e-3


def trained(options: dict, seed: int, vocab, train_data):
    "A tiny model of `options` (segments and memory of 32), initialised from `seed`, trained STEPS steps on Shakespeare."
    seed_everything(seed)
    config = config_of_type(n_token=len(vocab), **{"tgt_len": TGT_LEN, "mem_len": TGT_LEN, **options})
    model = build_model(config)
    losses = train(model, stream_documents(train_data), steps=STEPS, tgt_len=TGT_LEN, lr=LR,
                   desc=f"{options}, seed {seed}")
    return model, config, losses


def main():
    torch.set_num_threads(1)
    vocab, train_data, _ = corpus_streams("shakespeare", batch_size=16)
    weights, log = {}, dict(steps=STEPS, tgt_len=TGT_LEN, lr=LR, batch_size=16, seeds=list(SEEDS),
                            torch=torch.__version__, vocab="".join(vocab.itos), models={})
    for name, options in ROWS.items():
        for seed in SEEDS:
            start = time.perf_counter()
            model, config, losses = trained(options, seed, vocab, train_data)
            key = f"{name}/seed {seed}"
            weights.update({f"{key}/{k}": v.detach().half().contiguous() for k, v in model.state_dict().items()})
            log["models"][key] = dict(row=name, seed=seed, config=dataclasses.asdict(config),
                                      seconds=round(time.perf_counter() - start, 1),
                                      loss_per_50_steps=[round(sum(losses[i:i + 50]) / 50, 4)
                                                         for i in range(0, STEPS, 50)])
    OUT.mkdir(exist_ok=True)
    save_file(weights, OUT / "models.safetensors")
    (OUT / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {OUT}: {len(log['models'])} models, "
          f"{(OUT / 'models.safetensors').stat().st_size / 2**20:.1f} MiB of weights")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
