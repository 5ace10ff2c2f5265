"""Reference run for chapter 07: the one-token step, change by change, on a GPU.

Chapter 07 times the cached one-token step of the benchmark model on the CPU it runs on; this script times the same
table (`step_changes` at L = 1024, batches 1 and 4, five rounds) on a CUDA device, after checking that greedy
generation with the cache gives the tokens of the uncached calls there. It writes, next to this file,
`07_speed_benchmark/gpu_steps.json` (the device, torch's version, the git commit of the code and the records), which
the chapter prints.
Run from the repository root on a machine with a GPU: `python reference/07_speed_benchmark.py` (or `make reference`);
about 15 seconds. Without CUDA it says so and leaves the recorded file as it is.
"""
import json
import subprocess
from pathlib import Path

import torch

from txl_lib.bench import bench_model
from txl_lib.bench_steps import format_step_changes, step_changes
from txl_lib.infrastructure import write_atomically, write_manifest

OUT = Path(__file__).with_suffix("")                 # reference/07_speed_benchmark/


@torch.inference_mode()
def same_tokens(model) -> bool:
    "Greedy generation through the cache against uncached one-token calls, on the model's device."
    prompt = torch.randint(256, (2, 300), generator=torch.Generator().manual_seed(0)).cuda()
    cached = model.generate(prompt, 40, temperature=0)
    out, tokens = model(prompt), [prompt]
    for _ in range(40):
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        out = model(tokens[-1], mems=out.mems)
    return torch.equal(cached, torch.cat(tokens, 1))


def commit() -> str:
    "The git commit the code is at (`+changes` when txl_lib differs from it); 'unknown' outside a clone."
    try:
        git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout
        return git("rev-parse", "HEAD").strip() + ("+changes" if git("status", "--porcelain", "txl_lib") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    if not torch.cuda.is_available():
        print(f"no CUDA device here: {OUT / 'gpu_steps.json'} is left as recorded")
        return
    model = bench_model().cuda()
    if not same_tokens(model):
        raise SystemExit("the cached step gave other tokens than the uncached calls: nothing written")
    records = step_changes(model, L=1024, batches=(1, 4), rounds=5, steps=50)
    print(format_step_changes(records))
    run = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit(), records=records)
    OUT.mkdir(exist_ok=True)
    write_atomically(OUT / "gpu_steps.json", (json.dumps(run, indent=1) + "\n").encode())
    print(f"wrote {OUT / 'gpu_steps.json'} ({run['device']})")
    write_manifest(OUT)  # last: the sha256 of every file the chapters read (the appendix)


if __name__ == "__main__":
    main()
