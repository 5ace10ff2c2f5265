"""Reference run for chapter 10: Transformer-XL and XL + KNN memory on the recall task, three seeds each.

The KNN models learn to retrieve from their store only after a few hundred steps, and six runs of 1,200 steps take
longer than the chapter's 90 s. This script trains the six models with chapter 10's recipe (`recall_config`,
`mixed_recall`) and writes, next to this file, `10_knn_memory/models.safetensors` (float32 weights, one set per model
and seed) and `10_knn_memory/training_log.json` (configurations, recipe, training loss every 50 steps, CPU seconds).
Run from the repository root: `python reference/10_knn_memory.py` (or `make reference`); about six CPU minutes on
one core. Fixed seeds: a rerun gives the same models up to the last bits of float arithmetic.
"""
import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib.knn import RECALL_MODELS, RECALL_RECIPE, KNNTransformerXL, mixed_recall, recall_config
from txl_lib.model import TransformerXL
from txl_lib.training import train
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest

OUT = Path(__file__).with_suffix("")                 # reference/10_knn_memory/
SEEDS = (0, 1, 2)


def main():
    torch.set_num_threads(1)
    r = RECALL_RECIPE
    weights = {}
    log = dict(seeds=list(SEEDS), recipe=r, torch=torch.__version__, runs={},
               configs={name: dataclasses.asdict(recall_config(with_knn)) for name, with_knn in RECALL_MODELS.items()})
    for seed in SEEDS:
        for name, with_knn in RECALL_MODELS.items():
            start = time.process_time()
            seed_everything(seed)
            model = (KNNTransformerXL if with_knn else TransformerXL)(recall_config(with_knn))
            batches = mixed_recall(r["distances"], r["n_examples"], r["batch_size"], seed=r["data_seed"] + seed)
            losses = train(model, batches, steps=r["steps"], tgt_len=r["tgt_len"], lr=r["lr"], desc=f"{name}, seed {seed}")
            key = f"{name}, seed {seed}"
            weights.update({f"{key}/{k}": v.detach().clone() for k, v in model.state_dict().items()})
            log["runs"][key] = dict(cpu_seconds=round(time.process_time() - start, 1),
                                    loss_per_50_steps=[round(sum(losses[i:i + 50]) / 50, 4)
                                                       for i in range(0, r["steps"], 50)])
    OUT.mkdir(exist_ok=True)
    save_file(weights, OUT / "models.safetensors")
    (OUT / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {OUT}: {len(log['runs'])} models, "
          f"{(OUT / 'models.safetensors').stat().st_size / 2**20:.1f} MiB of weights")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
