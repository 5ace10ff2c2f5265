"""Chapter 09 under hostile input (issue 17): a folder whose config.json or weights file is
another model's, broken or truncated; a state dict of the wrong kind; ids outside the
vocabulary. Each gets one error that names what was wrong (and the file), and changes nothing:
no file, no parameter, not the caller's random numbers."""

import json
import warnings

import pytest
import torch

from txl_lib.pretrained import from_pretrained
from txl_lib.adaptive import AdaptiveConfig, AdaptiveTransformerXL
from txl_lib.adaptive import (
    AdaptiveEmbedding,
    ProjectedAdaptiveLogSoftmax,
    WordVocab,
    from_state_dict,
)
from txl_lib.adaptive import (
    adaptive_config_from_hf as config_from_hf,
)  # the ports here are adaptive
from txl_lib.model import TXLConfig

warnings.filterwarnings("ignore", message="IProgress not found")
from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: E402

V = 40

GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "activation_function": "gelu_new",
}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A small HuggingFace TransfoXL folder (adaptive softmax, 2 tail clusters) saved by
    save_pretrained."""
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=V,
        cutoffs=[10, 25],
        div_val=2,
        d_model=16,
        d_embed=16,
        n_head=2,
        d_head=8,
        d_inner=32,
        n_layer=2,
        mem_len=4,
        clamp_len=-1,
        dropout=0.0,
        dropatt=0.0,
    )
    folder = tmp_path_factory.mktemp("hf")
    TransfoXLLMHeadModel(config).save_pretrained(folder)
    return folder


def copy_of(folder, tmp_path, **replace):
    "A copy of `folder` in tmp_path with some files' bytes replaced."
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    for name, data in {**files, **replace}.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def refused(call, error, *fragments):
    """`call` raises `error` whose message holds every fragment; the caller's random numbers are
    left as they were."""
    before = torch.random.get_rng_state()
    with pytest.raises(error) as caught:
        call()
    for fragment in fragments:
        assert fragment in str(caught.value), f"{fragment!r} not in: {caught.value}"
    assert torch.equal(torch.random.get_rng_state(), before), (
        "a failed call drew from the global random generator"
    )
    return str(caught.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        (json.dumps(GPT2_CONFIG), "model_type 'transfo-xl'"),
        ('{"model_type": "transfo-xl", "vocab_size": 40', "not valid JSON"),
        ("[1, 2, 3]", "holds a JSON list, expected an object"),
        ("\udcff".encode("utf-8", "surrogateescape"), "not valid JSON"),
    ],
)
def test_a_config_json_of_another_model_or_broken_is_one_error_naming_the_file(
    hf_folder, tmp_path, text, expected
):
    data = text if isinstance(text, bytes) else text.encode()
    folder = copy_of(hf_folder, tmp_path, **{"config.json": data})
    refused(lambda: from_pretrained(folder), ValueError, str(folder / "config.json"), expected)


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda c: c.pop("n_layer"), "lacks the keys ['n_layer']"),
        (lambda c: (c.pop("cutoffs"), c.pop("div_val")), "lacks the keys ['cutoffs', 'div_val']"),
        (lambda c: c.update(n_layer="two"), "n_layer"),
        (lambda c: c.update(cutoffs=None), "cutoffs"),
        (lambda c: c.update(cutoffs=[25, 10]), "cutoffs"),
        (
            lambda c: c.update(vocab_size=10**13),
            "n_token must be an int in [1, 2,147,483,647]",
        ),  # refused by the config's bound (issue 31), before 10^13 rows are allocated
    ],
)
def test_a_transfo_xl_config_json_with_missing_or_wrong_fields_is_one_error_naming_the_file(
    hf_folder, tmp_path, change, expected
):
    config = json.loads((hf_folder / "config.json").read_text())
    change(config)
    folder = copy_of(hf_folder, tmp_path, **{"config.json": json.dumps(config).encode()})
    message = refused(lambda: from_pretrained(folder), ValueError, expected)
    assert str(folder) in message


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_or_truncated_weights_file_is_one_error_naming_it(
    hf_folder, tmp_path, name, damage
):
    from safetensors.torch import load_file

    torch.save(load_file(hf_folder / "model.safetensors"), tmp_path / "pytorch_model.bin")
    good = (hf_folder / name if name == "model.safetensors" else tmp_path / name).read_bytes()
    data = {"truncated": good[: len(good) // 2], "garbage": bytes(range(256)) * 4, "empty": b""}[
        damage
    ]
    (tmp_path / "folder").mkdir()
    folder = copy_of(hf_folder, tmp_path / "folder", **{name: data})
    if name == "pytorch_model.bin":  # read only when there is no model.safetensors
        (folder / "model.safetensors").unlink()
    refused(lambda: from_pretrained(folder), ValueError, str(folder / name), "corrupt or truncated")


def test_weights_of_another_model_name_the_file(hf_folder, tmp_path):
    from safetensors.torch import save_file

    save_file(
        {"wte.weight": torch.zeros(4, 3), "h.0.attn.c_attn.weight": torch.zeros(3, 9)},
        tmp_path / "gpt2.st",
    )
    (tmp_path / "folder").mkdir()
    folder = copy_of(
        hf_folder, tmp_path / "folder", **{"model.safetensors": (tmp_path / "gpt2.st").read_bytes()}
    )
    refused(
        lambda: from_pretrained(folder), ValueError, str(folder / "model.safetensors"), "wte.weight"
    )


def test_a_failed_load_changes_no_file_and_no_random_state_and_a_good_one_draws_no_random_numbers(
    hf_folder, tmp_path
):
    config = json.loads((hf_folder / "config.json").read_text())
    folder = copy_of(
        hf_folder, tmp_path, **{"config.json": json.dumps({**config, "d_inner": 48}).encode()}
    )
    before = {p: p.read_bytes() for p in folder.iterdir()}
    refused(
        lambda: from_pretrained(folder),
        ValueError,
        str(folder / "model.safetensors"),
        "do not fit the config",
    )
    assert {p: p.read_bytes() for p in folder.iterdir()} == before
    state = torch.random.get_rng_state()
    from_pretrained(hf_folder)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_bare_state_dict_file_of_the_wrong_kind_names_the_file(hf_folder, tmp_path):
    config = config_from_hf(json.loads((hf_folder / "config.json").read_text()))
    torch.save({"word_emb.emb_layers.0.weight": [1.0, 2.0]}, tmp_path / "lists.pt")
    refused(
        lambda: from_pretrained(tmp_path / "lists.pt", config=config),
        ValueError,
        str(tmp_path / "lists.pt"),
        "tensor",
    )
    torch.save({"word_emb.emb_layers.0.weight": torch.zeros(3)}, tmp_path / "partial.pt")
    refused(
        lambda: from_pretrained(tmp_path / "partial.pt", config=config),
        ValueError,
        str(tmp_path / "partial.pt"),
        "missing",
    )
    good = (tmp_path / "partial.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    refused(
        lambda: from_pretrained(tmp_path / "cut.pt", config=config),
        ValueError,
        str(tmp_path / "cut.pt"),
        "corrupt or truncated",
    )


@pytest.mark.parametrize(
    "call, error, expected",
    [
        (
            lambda f: from_pretrained(f, config={"n_layer": 2}),
            TypeError,
            "config must be None or a TXLConfig",
        ),
        (lambda f: from_pretrained(None), TypeError, "path must be"),
        (
            lambda f: from_state_dict([("a", torch.zeros(1))], TXLConfig(n_token=V)),
            TypeError,
            "state_dict must be a dict",
        ),
        (lambda f: from_state_dict({}, {"n_token": V}), TypeError, "config must be a TXLConfig"),
        (lambda f: from_state_dict({"a": 1.0}, TXLConfig(n_token=V)), TypeError, "tensor"),
        (
            lambda f: from_state_dict({}, TXLConfig(n_token=V), source="tf"),
            ValueError,
            "source must be",
        ),  # not adaptive
    ],
)
def test_arguments_of_the_wrong_kind_are_one_clear_error(hf_folder, call, error, expected):
    refused(lambda: call(hf_folder), error, expected)


def test_word_vocab_refuses_what_is_not_text_and_ids_outside_it():
    vocab = WordVocab("b a b c b a .")
    refused(lambda: WordVocab(b"a b"), TypeError, "text must be a str")
    refused(lambda: vocab.encode(None), TypeError, "text must be a str")
    refused(
        lambda: vocab.decode([0, -1]), ValueError, "outside the vocabulary [0, 4)"
    )  # itos[-1] would be 'c'
    refused(lambda: vocab.decode(torch.tensor([0, -100])), ValueError, "outside the vocabulary")
    refused(lambda: vocab.decode([0, 4]), ValueError, "outside the vocabulary")
    refused(lambda: vocab.decode(torch.tensor([[0, 1]])), ValueError, "1-D")
    refused(lambda: vocab.decode(torch.tensor([0.0, 1.0])), ValueError, "outside the vocabulary")
    assert vocab.decode(torch.tensor([0, 1, 2])) == "b a ."


def test_the_adaptive_modules_refuse_ids_outside_the_vocabulary_instead_of_returning_garbage():
    embedding = AdaptiveEmbedding(V, 8, 8, cutoffs=(10, 25), div_val=2)
    for ids in (torch.tensor([[0, V]]), torch.tensor([[-1, 3]])):
        refused(
            lambda: embedding(ids), ValueError, "outside the vocabulary [0, 40)"
        )  # rows were left uninitialised
    # the softmax sits inside the model and trusts its caller: the model's door checks targets
    model = AdaptiveTransformerXL(AdaptiveConfig.tiny(n_token=V, cutoffs=(10, 25), div_val=2))
    ids = torch.zeros(1, 2, dtype=torch.long)
    for targets in (torch.tensor([[0, V]]), torch.tensor([[0, -5]])):  # would score 0, as ignored
        refused(lambda: model(ids, targets=targets), ValueError, "outside the vocabulary [0, 40)")
    refused(lambda: model(ids, targets=torch.zeros(1, 3, dtype=torch.long)), ValueError, "shape")
    softmax = ProjectedAdaptiveLogSoftmax(V, 8, 8, cutoffs=(10, 25), div_val=2)
    assert softmax(torch.randn(2, 8), torch.tensor([3, -100]))[1] == 0  # IGNORE scores 0
