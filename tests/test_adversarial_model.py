"""Issue 17, chapter 06: checkpoints that lie, a full disk, generate on hostile models and
arguments, the variants' cache."""

import errno, math

import pytest
import torch

import txl_lib.model as model_module
from txl_lib.model import TXLConfig, TransformerXL
from txl_lib.serialization import save_checkpoint, content_sha256
from loading import load_checkpoint
from txl_lib.variants import VariantConfig
from txl_lib.pretrained import build_model
from txl_lib.cache import InferenceCache
from txl_lib.model import MIN_TEMPERATURE

CONFIG = dict(
    n_token=20, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=4
)


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(**CONFIG)).eval()
    return model, save_checkpoint(tmp_path / "model.pt", model, step=3)


def resave(path, change, consistent: bool = False):
    """The checkpoint at `path` with its payload changed by `change`, written under a new name
    (checksum untouched, or, `consistent`, recomputed over the change)."""
    payload = torch.load(path, weights_only=True)
    change(payload)
    if consistent:  # the checksum of what save_checksummed writes: every key but the checksum
        payload["sha256"] = content_sha256({k: v for k, v in payload.items() if k != "sha256"})
    torch.save(payload, path.with_name("changed.pt"))
    return path.with_name("changed.pt")


def test_flipped_byte_inside_a_tensor_is_refused(saved):
    model, path = saved
    data = bytearray(path.read_bytes())
    raw = model.u.detach().numpy().tobytes()  # find u's bytes in the zip (stored raw)
    at = bytes(data).find(raw)
    assert at > 0
    data[at + 5] ^= 0x01  # one bit of one float of u
    path.write_bytes(bytes(data))
    payload = torch.load(path, weights_only=True)  # torch itself reads it without a word
    assert not torch.equal(payload["model"]["u"], model.u.detach())
    with pytest.raises(ValueError, match="model.pt is corrupt: its sha256 differs"):
        load_checkpoint(path)


def test_checksum_is_sha256_of_names_dtypes_shapes_and_bytes(saved):
    import hashlib

    model, path = saved
    state = model.state_dict()
    digest = hashlib.sha256()  # independent: via numpy, by hand
    for name in sorted(state):
        t = state[name]
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode() + t.numpy().tobytes())
    assert digest.hexdigest() == content_sha256(state)  # the weights' checksum
    payload = torch.load(path, weights_only=True)  # the stored one covers config and step too
    assert payload["format"] == 3 and payload["sha256"] == content_sha256(
        {"config": payload["config"], "model": state, "step": 3, "format": 3}
    )


def test_checkpoint_without_checksum_loads_with_a_warning(saved):
    model, path = saved
    old = resave(path, lambda p: [p.pop("sha256"), p.pop("format")])  # as the first versions wrote
    with pytest.warns(UserWarning, match="of an earlier version"):
        loaded, step = load_checkpoint(old)
    assert step == 3 and all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )


def test_tied_head_that_differs_is_refused(saved):
    _, path = saved

    def untie(p):
        p["model"]["head.weight"] = p["model"]["head.weight"] + 1.0  # only the tie broken

    with pytest.raises(
        ValueError, match=r"changed.pt: the config ties \['word_emb.weight', 'head.weight'\]"
    ):
        load_checkpoint(resave(path, untie, consistent=True))


def test_implausible_config_is_refused_before_allocating(saved, monkeypatch):
    _, path = saved
    allocated = []
    real_build = TransformerXL

    def counting_build(config):
        model = real_build(config)
        allocated.append(next(model.parameters()).device.type)
        return model

    huge = resave(  # 40 TB of weights if built
        path, lambda p: p["config"].update(d_model=1_000_000, d_head=500_000), consistent=True
    )
    with pytest.raises(ValueError, match="changed.pt holds an invalid config: .* more than this"):
        load_checkpoint(huge, build=counting_build)
    assert allocated == []  # refused from the config alone
    plausible = resave(path, lambda p: p["config"].update(d_inner=64), consistent=True)
    with pytest.raises(ValueError, match="changed.pt: the weights do not fit the config"):
        load_checkpoint(plausible, build=counting_build)
    assert allocated == ["meta"]  # only the shape-only skeleton was built


def test_invalid_stored_config_names_the_file(saved):
    _, path = saved
    with pytest.raises(ValueError, match="changed.pt holds an invalid config: init_std"):
        load_checkpoint(
            resave(path, lambda p: p["config"].update(init_std=float("nan")), consistent=True)
        )


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 64 vs 0"),
    ],
)
def test_disk_full_keeps_the_old_file_and_says_so(saved, monkeypatch, failure):
    model, path = saved
    before = path.read_bytes()

    def full_disk(obj, f):
        f.write(b"partial")
        raise failure

    monkeypatch.setattr(model_module.torch, "save", full_disk)
    with pytest.raises(
        OSError,
        match=r"the disk is full: could not write .*model.pt; the previous .*model.pt is kept",
    ):
        save_checkpoint(path, model, step=4)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [
        "model.pt"
    ]
    with pytest.raises(OSError, match="nothing was written at .*new.pt"):
        save_checkpoint(path.with_name("new.pt"), model)
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt"]


def test_generate_with_a_nan_weight_is_a_clear_error(saved):
    model, _ = saved
    with torch.no_grad():
        model.head.bias[3] = float("nan")
    with pytest.raises(ValueError, match="logits hold NaN or inf"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3)


@pytest.mark.parametrize("temperature", [1e-300, 1e-5, math.inf, math.nan, -1.0])
def test_temperature_out_of_range_is_refused(saved, temperature):
    model, _ = saved
    with pytest.raises(
        ValueError, match="temperature must be 0 .greedy. or a finite number >= 0.0001"
    ):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, temperature=temperature)


def test_smallest_temperature_samples_the_greedy_tokens(saved):
    model, _ = saved
    prompt = torch.randint(20, (3, 4), generator=torch.Generator().manual_seed(1))
    greedy = model.generate(prompt, 6, temperature=0)
    cold = model.generate(
        prompt, 6, temperature=MIN_TEMPERATURE, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(greedy, cold)


def test_meta_model_or_ids_are_a_clear_error(saved):
    model, _ = saved
    with torch.device("meta"):
        skeleton = TransformerXL(TXLConfig(**CONFIG))
    with pytest.raises(ValueError, match="input_ids are on cpu, the model on meta"):
        skeleton.generate(torch.zeros(1, 2, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="input_ids are on meta, the model on cpu"):
        model.generate(torch.zeros(1, 2, dtype=torch.long, device="meta"), 3)


def test_generate_restores_train_mode(saved):
    model, _ = saved
    model.train()
    model.generate(torch.zeros(1, 2, dtype=torch.long), 2)
    assert model.training and all(m.training for m in model.modules())
    with pytest.raises(ValueError):
        model.generate(torch.full((1, 2), 99), 2)
    assert model.training
    model.eval()
    model.generate(torch.zeros(1, 2, dtype=torch.long), 2)
    assert not model.training


@pytest.mark.parametrize("init_std", [float("nan"), float("inf"), 0.0, -0.02, True, "0.02", 1e300])
def test_init_std_must_be_in_0_1(init_std):
    with pytest.raises(ValueError, match=r"init_std must be a number in \(0, 1\]"):
        TXLConfig(**CONFIG, init_std=init_std)


@pytest.mark.parametrize("attn_type", [1, 2, 3])
def test_variants_take_cache_none_and_refuse_a_cache(attn_type):
    torch.manual_seed(0)
    model = build_model(VariantConfig(**CONFIG, attn_type=attn_type)).eval()
    ids = torch.randint(20, (2, 3))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, cache=None).logits, model(ids).logits, rtol=0, atol=0)
        with pytest.raises(TypeError, match="cache must be None, or model.new_cache()"):
            model(ids, cache=InferenceCache(2))


@pytest.mark.parametrize("attn_type", [1, 2, 3])
def test_generate_on_a_variant_matches_greedy_recomputation(attn_type):
    torch.manual_seed(0)
    model = build_model(VariantConfig(**CONFIG, attn_type=attn_type)).eval()
    prompt = torch.randint(20, (2, 3))
    tokens, out = prompt, None  # independent: the same memory loop, written here
    with torch.no_grad():
        out = model(prompt)
        for _ in range(5):
            next_id = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_id], 1)
            out = model(next_id, mems=out.mems)
    assert torch.equal(model.generate(prompt, 5, temperature=0), tokens)


@pytest.mark.parametrize("attn_type", [1, 2, 3])
def test_variant_checkpoint_round_trip(tmp_path, attn_type):
    torch.manual_seed(0)
    model = build_model(VariantConfig(**CONFIG, attn_type=attn_type))
    path = save_checkpoint(tmp_path / "v.pt", model, step=5)
    loaded, step = load_checkpoint(
        path, build=build_model, read_config=lambda stored: VariantConfig(**stored)
    )
    assert step == 5 and type(loaded) is type(model)
    assert model.state_dict().keys() == loaded.state_dict().keys()
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )
