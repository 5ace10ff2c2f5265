"""Reference run for chapter 08a (RECL): three models, three seeds each, trained on a key-value stream; their
weights and per-token loss tables go to reference/08a_recl/. Run from anywhere: `python reference/08a_recl.py`
(`make reference` runs it); about 7 CPU-minutes on one thread."""
import json, resource
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.recl import key_value_stream, losses_at_contexts
from txl_lib.training import train, stream_documents
from txl_lib.utils import seed_everything
from txl_lib.infrastructure import write_manifest
from txl_lib.vanilla import VanillaTransformerLM

OUT = Path(__file__).resolve().parent / "08a_recl"
DATA = dict(n_keys=6, n_values=16, rebind=0.1)                     # the stream of chapter 08a
RUN = dict(tgt_len=16, mem_len=80, batch_size=32, steps=1200, lr=3e-3, seeds=[0, 1, 2],
           contexts=list(range(8, 97, 8)), n_tokens=2048, held_out_seed=1000)
N_TOKEN = DATA["n_keys"] * (1 + DATA["n_values"])
BODY = dict(n_layer=2, n_head=4, d_model=32, d_inner=128)          # the same body for the three models
XL = asdict(TXLConfig(n_token=N_TOKEN, d_head=8, tgt_len=RUN["tgt_len"], mem_len=RUN["mem_len"], **BODY))
MODELS = {"Transformer-XL": {"txl": XL},
          "XL without recurrence": {"txl": {**XL, "mem_len": 0}},
          "vanilla Transformer": {"vanilla": dict(n_token=N_TOKEN, **BODY)}}
READINGS = {  # a name for each way of reading the held-out stream: (model, memory length used at evaluation)
    "Transformer-XL": ("Transformer-XL", None),
    "XL without recurrence": ("XL without recurrence", None),
    "XL without recurrence, read with M = 80": ("XL without recurrence", RUN["mem_len"]),
    "vanilla Transformer": ("vanilla Transformer", None)}


def build(spec: dict) -> torch.nn.Module:
    "A model from its recorded build spec: {'txl': TXLConfig fields} or {'vanilla': VanillaTransformerLM kwargs}."
    (kind, kwargs), = spec.items()
    return TransformerXL(TXLConfig(**kwargs)) if kind == "txl" else VanillaTransformerLM(**kwargs)


def cpu_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def held_out_stream() -> torch.Tensor:
    "The stream whose tokens are scored: enough pairs for max(contexts) + n_tokens tokens."
    n_pairs = (max(RUN["contexts"]) + RUN["n_tokens"]) // 2 + 1
    return key_value_stream(n_pairs, **DATA, generator=torch.Generator().manual_seed(RUN["held_out_seed"]))


def train_one(name: str, seed: int):
    "Seed, build, train on fresh streams (the same streams for every model of a seed); return model and log entry."
    generator = seed_everything(seed)
    model = build(MODELS[name])
    n_pairs = RUN["steps"] * RUN["tgt_len"] // 2 + 1
    streams = torch.stack([key_value_stream(n_pairs, **DATA, generator=generator) for _ in range(RUN["batch_size"])])
    start = cpu_seconds()
    history = train(model, stream_documents(streams), steps=RUN["steps"], tgt_len=RUN["tgt_len"], lr=RUN["lr"],
                    desc=f"{name}, seed {seed}")
    return model, {"final_training_loss": round(sum(history[-50:]) / 50, 4),
                   "train_cpu_seconds": round(cpu_seconds() - start, 1),
                   "parameters": sum(p.numel() for p in model.parameters())}


def main():
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    held_out, start = held_out_stream(), cpu_seconds()
    log = {"data": DATA, "run": RUN, "models": {name: {"build": spec, "seeds": {}} for name, spec in MODELS.items()},
           "readings": READINGS, "torch": torch.__version__}
    weights, tables = {}, {}
    for seed in RUN["seeds"]:
        for name in MODELS:
            model, entry = train_one(name, seed)
            weights.update({f"{name}/seed {seed}/{k}": v.detach().clone().contiguous()
                            for k, v in model.state_dict().items()})
            for reading, (model_name, mem_len) in READINGS.items():
                if model_name == name:
                    tables[f"{reading}/seed {seed}"] = losses_at_contexts(
                        model, held_out, RUN["contexts"], RUN["tgt_len"], RUN["n_tokens"], mem_len).contiguous()
            log["models"][name]["seeds"][seed] = entry
            print(f"{name}, seed {seed}: final training loss {entry['final_training_loss']:.3f}")
    log["total_cpu_seconds"] = round(cpu_seconds() - start, 1)
    save_file(weights, OUT / "weights.safetensors")
    save_file(tables, OUT / "losses.safetensors")
    (OUT / "log.json").write_text(json.dumps(log, indent=1) + "\n")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
