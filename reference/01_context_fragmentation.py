"""Reference run for chapters 01 and 02: the vanilla Transformer LM on Shakespeare's characters, three seeds.

Chapter 01 compares fixed segments with a sliding window, and chapter 02 attaches memories to the same models; both
need several seeds, more training than a chapter's 90 s. This script trains the three models and writes, next to
this file, `01_context_fragmentation/models.safetensors` (float32 weights, one set per seed) and
`01_context_fragmentation/training_log.json` (configuration, vocabulary, training loss every 50 steps, seconds).
Run from the repository root: `python reference/01_context_fragmentation.py` (or `make reference`); a few minutes on
one quiet core. Fixed seeds: a rerun gives the same models up to the last bits of float arithmetic.
"""
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib.data import corpus_streams
from txl_lib.training import stream_documents, train
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest
from txl_lib.vanilla import VanillaTransformerLM

OUT = Path(__file__).with_suffix("")                 # reference/01_context_fragmentation/
CONFIG = dict(n_layer=2, n_head=4, d_model=64, d_inner=256)
SEEDS, STEPS, TGT_LEN, LR, BATCH = (0, 1, 2), 1500, 32, 3e-3, 16


def main():
    torch.set_num_threads(1)
    vocab, train_data, _ = corpus_streams("shakespeare", batch_size=BATCH)
    weights, log = {}, dict(config=CONFIG, seeds=list(SEEDS), steps=STEPS, tgt_len=TGT_LEN, lr=LR, batch_size=BATCH,
                            torch=torch.__version__, vocab="".join(vocab.itos), runs={})
    for seed in SEEDS:
        start = time.perf_counter()
        seed_everything(seed)
        model = VanillaTransformerLM(len(vocab), **CONFIG)
        losses = train(model, stream_documents(train_data), steps=STEPS, tgt_len=TGT_LEN, lr=LR,
                       desc=f"vanilla, seed {seed}")
        weights.update({f"seed {seed}/{name}": value.detach().contiguous() for name, value in model.state_dict().items()})
        log["runs"][f"seed {seed}"] = dict(seconds=round(time.perf_counter() - start, 1),
                                           loss_per_50_steps=[round(sum(losses[i:i + 50]) / 50, 4)
                                                              for i in range(0, STEPS, 50)])
    OUT.mkdir(exist_ok=True)
    save_file(weights, OUT / "models.safetensors")
    (OUT / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {OUT}: {len(SEEDS)} models, {(OUT / 'models.safetensors').stat().st_size / 2**20:.1f} MiB of weights")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
