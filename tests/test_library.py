"""Chapter 12: one factory, one save/load in safetensors + config.json, generate for every kind,
the top level."""

import base64, dataclasses, hashlib, importlib.metadata, json, os, re
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import txl_lib
from dataclasses import asdict
from txl_lib import (
    TXLConfig,
    VariantConfig,
    AdaptiveConfig,
    KNNConfig,
    build_model,
    from_pretrained,
    from_hf,
    config_from_dict,
)
from txl_lib.serialization import save_checkpoint
from txl_lib.model import TransformerXL, nucleus
from txl_lib.variants import PositionVariantLM
from txl_lib.adaptive import AdaptiveTransformerXL
from txl_lib.knn import KNNTransformerXL

KINDS = {
    "xl": (TXLConfig, dict(), TransformerXL),
    "type1": (VariantConfig, dict(attn_type=1), PositionVariantLM),
    "type3": (VariantConfig, dict(attn_type=3, clamp_len=6), PositionVariantLM),
    "adaptive": (AdaptiveConfig, dict(cutoffs=(10, 20), div_val=2), AdaptiveTransformerXL),
    "adaptive_untied": (
        AdaptiveConfig,
        dict(cutoffs=(10,), d_embed=32, tie_weight=False),
        AdaptiveTransformerXL,
    ),
    "adaptive_one_cluster": (
        AdaptiveConfig,
        dict(),
        AdaptiveTransformerXL,
    ),  # all of its fields at defaults
    "knn": (KNNConfig, dict(knn_layer=1, knn_capacity=32, knn_top_k=4), KNNTransformerXL),
}


def kind_config(kind):
    config_class, fields, _ = KINDS[kind]
    return config_class.tiny(n_token=30, tgt_len=6, mem_len=6, **fields)


def kind_model(kind, seed=0):
    torch.manual_seed(seed)
    model = build_model(kind_config(kind)).eval()
    with torch.no_grad():  # spread the weights so a misplaced tensor shows in the logits
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kind", KINDS)
def test_build_model_picks_the_class_of_each_extension(kind):
    assert type(kind_model(kind)) is KINDS[kind][2]


@pytest.mark.parametrize(
    "config_class, field",
    [
        (TXLConfig, "attn_type"),
        (TXLConfig, "cutoffs"),
        (TXLConfig, "knn_layer"),
        (VariantConfig, "cutoffs"),
        (AdaptiveConfig, "knn_layer"),
        (KNNConfig, "attn_type"),
    ],
)
def test_each_config_has_only_its_own_chapters_fields(config_class, field):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{field}'"):
        config_class(n_token=30, **{field: 1})


@pytest.mark.parametrize("kind", KINDS)
def test_every_other_model_refuses_the_config(kind):
    for model_class in {k[2] for k in KINDS.values()} - {KINDS[kind][2]}:
        with pytest.raises(
            TypeError,
            match=f"{model_class.__name__} is built from .* got {KINDS[kind][0].__name__}",
        ):
            model_class(kind_config(kind))


def test_build_model_refuses_what_is_not_a_config():
    with pytest.raises(TypeError, match="config must be one of"):
        build_model({"n_token": 30})


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_are_exact_for_every_kind(kind, tmp_path):
    model, x = kind_model(kind), torch.randint(0, 30, (2, 6))
    folder = model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    loaded = from_pretrained(folder)
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    groups = lambda m: sorted(sorted(n) for n in txl_lib.serialization.tied_groups(m))
    assert groups(loaded) == groups(model)  # tied weights tied again, not two copies
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)


def test_config_json_is_plain_json_of_the_config(tmp_path):
    model = kind_model("adaptive")
    stored = json.loads((model.save_pretrained(tmp_path) / "config.json").read_text())
    assert stored.pop("model_type") == "txl_lib" and stored.pop("config_class") == "AdaptiveConfig"
    assert AdaptiveConfig(**stored) == model.config


EARLIER_FIELDS = dict(
    attn_type=0,
    cutoffs=[],
    div_val=1,
    d_embed=None,
    tie_projs=[],
    knn_layer=None,
    knn_capacity=1024,
    knn_top_k=32,
)  # every config an earlier version wrote held these, unused ones at these values


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "adaptive_one_cluster"])
def test_config_dicts_of_earlier_versions_are_read_as_the_config_they_describe(kind):
    config = kind_config(kind)
    earlier = json.loads(json.dumps({**EARLIER_FIELDS, **asdict(config)}))  # as a JSON file held it
    assert len(earlier) == 24 and config_from_dict(earlier) == config


def test_tied_weights_are_stored_once(tmp_path):
    model = kind_model("xl")
    stored = load_file(model.save_pretrained(tmp_path) / "model.safetensors")
    assert len(stored) == len(model.state_dict()) - 1  # head.weight is word_emb.weight


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_every_kind_equals_decoding_with_the_memory_alone(kind):
    model, prompt = kind_model(kind), torch.randint(0, 30, (2, 5))
    with torch.no_grad():
        out, tokens = model(prompt), [prompt]
        for _ in range(12):
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
            out = model(tokens[-1], mems=out.mems)
    assert torch.equal(model.generate(prompt, 12, temperature=0), torch.cat(tokens, 1))


@pytest.mark.parametrize("kind", ["type1", "knn", "adaptive"])
def test_checkpoints_of_earlier_versions_still_load(kind, tmp_path):
    model = kind_model(kind)
    loaded = from_pretrained(save_checkpoint(tmp_path / "old.pt", model, step=3))
    x = torch.randint(0, 30, (1, 6))
    assert type(loaded) is type(model) and torch.equal(loaded(x).logits, model(x).logits)


def refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_flipped_byte_is_refused(tmp_path):
    folder = kind_model("xl").save_pretrained(tmp_path)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-3] ^= 0x40
    (folder / "model.safetensors").write_bytes(bytes(data))
    refused(lambda: from_pretrained(folder), "is corrupt")


def test_a_truncated_weights_file_is_refused_naming_it(tmp_path):
    folder = kind_model("xl").save_pretrained(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    refused(
        lambda: from_pretrained(folder),
        "model.safetensors is corrupt or truncated, or not a safetensors file",
    )


@pytest.mark.parametrize(
    "text, match",
    [
        ("[1, 2]", "holds a JSON list"),
        ("{not json", "is not valid JSON"),
        (
            '{"model_type": "txl_lib", "n_token": 31}',
            "differs from the config.json model.safetensors was saved with",
        ),
    ],
)
def test_a_bad_or_mismatched_config_json_is_refused(tmp_path, text, match):
    folder = kind_model("xl").save_pretrained(tmp_path)
    (folder / "config.json").write_text(text)
    refused(lambda: from_pretrained(folder), match)


def test_an_implausible_stored_config_allocates_nothing(tmp_path):
    folder = kind_model("xl").save_pretrained(tmp_path)
    weights = load_file(folder / "model.safetensors")
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        metadata = f.metadata()
    config = json.loads(metadata["config"])
    config["d_model"] = 1_000_000
    config["d_inner"] = 40_000_000
    metadata["config"] = json.dumps(config)  # a consistent file: the manifest says the same
    digest = hashlib.sha256(metadata["config"].encode()).hexdigest()
    metadata["files"] = json.dumps({"config.json": digest})
    save_file(weights, folder / "model.safetensors", metadata=metadata)
    (folder / "config.json").write_text(metadata["config"])
    refused(  # a real build would need some 640 TB
        lambda: from_pretrained(folder), "holds an invalid config: .* more than this machine"
    )


def test_a_crash_while_saving_leaves_the_old_files_and_no_temporary(tmp_path, monkeypatch):
    folder = kind_model("xl", seed=0).save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def crash(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(txl_lib.infrastructure.os, "replace", crash)  # the one writer's rename
    with pytest.raises(OSError, match="the disk is full"):
        kind_model("xl", seed=1).save_pretrained(folder)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_save_pretrained_refuses_a_vocabulary_of_another_size(tmp_path):
    with pytest.raises(ValueError, match="vocab must be None or 30 strings"):
        kind_model("xl").save_pretrained(tmp_path, vocab=["a", "b"])
    assert not any(tmp_path.iterdir())


def test_from_hf_accepts_an_adaptive_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.TransfoXLLMHeadModel(
        transformers.TransfoXLConfig(
            vocab_size=40,
            cutoffs=[10, 25],
            d_model=16,
            d_embed=24,
            n_head=2,
            d_head=8,
            d_inner=32,
            n_layer=2,
            mem_len=6,
            div_val=2,
            dropout=0.0,
            dropatt=0.0,
        )
    ).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn_like(p))
        ids = torch.randint(0, 40, (2, 7))
        theirs = hf(ids, mems=[torch.empty(0, 2, 16)] * 2).prediction_scores
        ours = from_hf(hf)
        assert isinstance(ours, AdaptiveTransformerXL)
        torch.testing.assert_close(
            ours(ids).logits, theirs, atol=1e-5, rtol=0
        )  # the bound; 1.9e-6 here


def test_the_top_level_exports_what_a_user_needs():
    for name in (
        "TXLConfig TransformerXL build_model from_pretrained CharVocab train evaluate LMOutput"
    ).split():
        assert name in txl_lib.__all__ and hasattr(txl_lib, name)
    for method in ("save_pretrained", "from_pretrained", "generate"):  # as in HuggingFace
        assert all(callable(getattr(c, method)) for c in (txl_lib.TransformerXL, txl_lib.LSTMLM))
    # the version pip recorded from pyproject.toml (tomllib, which would read it, is Python 3.11+)
    assert txl_lib.__version__ == importlib.metadata.version("txl-lib")
    assert (Path(txl_lib.__file__).parent / "py.typed").is_file()


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## Using the library") :]
    section = section[: section.index("\n## ", 3)]
    first = python_blocks(section)[0]
    reference = (Path(__file__).parents[1] / "docs" / "reference.md").read_text()
    others = python_blocks(reference[reference.index("## The library in full") :])[:1]
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(first, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.replace("\r", "\n").splitlines()
    bits = next(float(line) for line in printed if re.fullmatch(r"\d+\.\d+", line.strip()))
    assert bits < 4.0  # trained: a uniform guess over Shakespeare's 84 symbols is 6.4
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [
        "config.json",
        "model.safetensors",
        "vocab.json",
    ]
    assert type(namespace["model"]) is TransformerXL
    kinds = {}
    for code in others:  # the configs of the extensions, one per line
        for line in code.splitlines():
            kinds[line] = (
                type(eval(line.split("#")[0], vars(txl_lib)))
                if line.startswith("build_model")
                else None
            )
    built = [kind.__name__ for kind in kinds.values() if kind]
    assert built == [
        "TransformerXL",
        "PositionVariantLM",
        "AdaptiveTransformerXL",
        "KNNTransformerXL",
    ]


def test_no_import_circle_between_the_modules():
    """Every `from .x import` / `from txl_lib.x import` (also inside functions): the graph of
    modules has no cycle."""
    import ast

    graph = {}
    for path in Path(txl_lib.__file__).parent.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported.add(node.module or "__init__")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("txl_lib"):
                imported.add(node.module.partition(".")[2] or "__init__")
        graph[path.stem] = imported

    def reaches(start, target, seen=()):
        return any(
            d == target or (d not in seen and reaches(d, target, (*seen, d)))
            for d in graph.get(start, ())
        )

    assert [name for name in graph if reaches(name, name)] == []


def test_chapter_06a_reads_a_type_0_config_and_sends_an_adaptive_one_to_chapter_09():
    from txl_lib.convert import config_from_hf

    hf = dict(
        vocab_size=40,
        n_layer=2,
        n_head=2,
        d_model=16,
        d_head=8,
        d_inner=32,
        dropout=0.0,
        dropatt=0.0,
        mem_len=6,
        clamp_len=-1,
        same_length=False,
        pre_lnorm=False,
        untie_r=True,
        cutoffs=[],
        div_val=1,
        d_embed=16,
    )
    assert type(config_from_hf(hf)) is TXLConfig
    with pytest.raises(ValueError, match="adaptive softmax .*adaptive_config_from_hf"):
        config_from_hf({**hf, "cutoffs": [10]})


def test_every_name_the_reference_scripts_import_exists():
    """`make reference` runs for hours: a name it imports that a chapter moved must fail here, in
    seconds."""
    import ast, importlib

    for script in sorted((Path(__file__).parents[1] / "reference").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "txl_lib":
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, (
                    f"{script.name} imports {missing} from {node.module}, which has no such name"
                )


def test_save_pretrained_is_byte_reproducible(tmp_path):
    """Issue 31: the safetensors header's key order varied between saves; the same model now saves
    to the same bytes."""
    model = kind_model("xl", seed=0)
    saved = {
        model.save_pretrained(tmp_path / str(i)).joinpath("model.safetensors").read_bytes()
        for i in range(6)
    }
    assert len(saved) == 1
    assert from_pretrained(tmp_path / "0").state_dict().keys() == model.state_dict().keys()


def test_a_folder_being_saved_over_is_read_whole_or_not_at_all(tmp_path):
    """Issue 31: reading while another process saved gave 'corrupt sha256' (18 of 600 reads):
    tensors came from two files."""
    import subprocess
    import sys

    writer = (
        "import sys, torch\nfrom txl_lib import TransformerXL, TXLConfig\n"
        "model = TransformerXL(TXLConfig.tiny(n_token=20))\n"
        "while True:\n    model.u.data.add_(1.0)\n    model.save_pretrained(sys.argv[1])\n"
    )
    folder = tmp_path / "busy"
    TransformerXL(TXLConfig.tiny(n_token=20)).save_pretrained(folder)
    saving = subprocess.Popen([sys.executable, "-c", writer, str(folder)])
    try:
        for _ in range(300):
            assert from_pretrained(folder).config.n_token == 20  # never an error, never a mix
    finally:
        saving.kill()
        saving.wait()


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def documented_snippets() -> list[tuple[str, str]]:
    """(where, code) of every python block a reader is shown: the README's (but the first, which
    the test above runs and checks), the reference page's, and those of every chapter's prose."""
    root = Path(__file__).parents[1]
    snippets = [("README.md", b) for b in python_blocks((root / "README.md").read_text())[1:]]
    snippets += [("PACKAGE.md", b) for b in python_blocks((root / "PACKAGE.md").read_text())]
    reference = (root / "docs" / "reference.md").read_text()
    snippets += [("docs/reference.md", b) for b in python_blocks(reference)]
    for notebook in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                blocks = python_blocks("".join(cell["source"]))
                snippets += [(f"{notebook.name}, cell {cell['id']}", b) for b in blocks]
    return snippets


@pytest.mark.parametrize("where, code", documented_snippets(), ids=lambda x: str(x)[:40])
def test_every_python_block_shown_to_readers_runs_as_shown(where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a fresh namespace, in an empty folder: nothing defined beforehand
    exec(compile(code, where, "exec"), {})


def test_the_readme_figure_is_the_one_chapter_08b_stored():
    root = Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    assert "](docs/figures/loss_by_position.png)" in readme
    cells = json.loads((root / "notebooks" / "08b_real_text.ipynb").read_text())["cells"]
    stored = [
        base64.b64decode(out["data"]["image/png"])
        for cell in cells
        if cell.get("id") == "r021"
        for out in cell["outputs"]
        if "image/png" in out.get("data", {})
    ]
    assert stored == [(root / "docs" / "figures" / "loss_by_position.png").read_bytes()]


def test_seed_everything_changes_the_process_only_when_asked():
    "Seeding leaves torch's deterministic-algorithms switch alone unless `deterministic=True`."
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        first = torch.rand(3, generator=txl_lib.seed_everything(3))
        assert not torch.are_deterministic_algorithms_enabled()
        again = torch.rand(3, generator=txl_lib.seed_everything(3, deterministic=True))
        assert torch.are_deterministic_algorithms_enabled() and torch.equal(first, again)
        with pytest.raises(TypeError, match="deterministic must be True or False, got 'yes'"):
            txl_lib.seed_everything(0, deterministic="yes")
    finally:
        torch.use_deterministic_algorithms(before)


def test_the_source_distribution_holds_the_library_and_its_notices_not_the_tests(tmp_path):
    "The tests need the notebooks and the reference runs, which an sdist does not carry."
    import tarfile

    from setuptools import build_meta

    root = Path(__file__).parents[1]
    cwd = Path.cwd()
    try:
        os.chdir(root)
        archive = tmp_path / build_meta.build_sdist(str(tmp_path))
    finally:
        os.chdir(cwd)
    with tarfile.open(archive) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
        metadata = sdist.extractfile(f"{archive.name.removesuffix('.tar.gz')}/PKG-INFO").read()
    assert {"txl_lib/model.py", "LICENSE", "NOTICE", "CHANGELOG.md", "CITATION.cff"} <= names
    assert not any(name.startswith("tests") for name in names)
    # the package index shows PACKAGE.md, whose every link is absolute (the README's are relative)
    page = (root / "PACKAGE.md").read_text()
    assert page.strip() in metadata.decode()
    links = re.findall(r"\]\(([^)]*)\)", page)
    assert links and all(link.startswith("https://") for link in links), links


def test_the_version_lives_in_pyproject_and_names_the_changelogs_newest_release():
    "One place for the version: pyproject.toml; the changelog's newest release is that version."
    root = Path(__file__).parents[1]
    version = re.search(r'^version = "(.+)"$', (root / "pyproject.toml").read_text(), re.M)[1]
    releases = re.findall(r"^## \[(\d[^\]]*)\]", (root / "CHANGELOG.md").read_text(), re.M)
    assert releases[0] == version == txl_lib.__version__, (releases, version)


def test_the_release_files_agree_with_pyproject_and_the_makefile():
    "CITATION.cff: pyproject's version, the changelog's date; environment.yml: make's torch, nodejs"
    root = Path(__file__).parents[1]
    version = re.search(r'^version = "(.+)"$', (root / "pyproject.toml").read_text(), re.M)[1]
    dated = re.search(
        rf"^## \[{re.escape(version)}\] - (\S+)$", (root / "CHANGELOG.md").read_text(), re.M
    )
    citation = (root / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(version)}$", citation, re.M)
    assert dated and re.search(rf"^date-released: {dated[1]}$", citation, re.M)
    assert re.search(r"^Copyright \d{4} ", (root / "NOTICE").read_text(), re.M)
    torch_pin = re.search(r"^TORCH \?= torch==(\S+)$", (root / "Makefile").read_text(), re.M)[1]
    conda = (root / "environment.yml").read_text()
    assert f"  - pytorch={torch_pin}\n" in conda and "  - nodejs\n" in conda


CLASS_CONFIGS = {  # one small config per model class of the series
    "txl": TXLConfig.tiny(n_token=30),
    "variant": VariantConfig.tiny(n_token=30, attn_type=1),
    "adaptive": AdaptiveConfig.tiny(n_token=30, cutoffs=(10,), div_val=2),
    "knn": KNNConfig.tiny(n_token=30, knn_layer=1),
    "lstm": txl_lib.LSTMConfig(n_token=30),
}


@pytest.mark.parametrize("kind", CLASS_CONFIGS)
def test_every_model_class_has_save_pretrained_and_generate_methods(kind, tmp_path):
    "model.generate(...) is model.generate(...); model.save_pretrained(folder) reloads equal."
    model = build_model(CLASS_CONFIGS[kind])
    prompt = torch.randint(30, (2, 5), generator=torch.Generator().manual_seed(0))
    by_method = model.generate(prompt, 4, top_k=5, generator=torch.Generator().manual_seed(1))
    by_function = model.generate(prompt, 4, top_k=5, generator=torch.Generator().manual_seed(1))
    assert by_method.shape == (2, 9) and torch.equal(by_method, by_function)
    loaded = from_pretrained(model.save_pretrained(tmp_path / kind))
    assert type(loaded) is type(model)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )


@pytest.mark.parametrize("kind", CLASS_CONFIGS)
def test_every_model_class_reads_its_own_folders_with_from_pretrained(kind, tmp_path):
    """Model.from_pretrained(folder): the same weights as the free function reads, in eval mode;
    a folder of another class is refused, naming both."""
    model = build_model(CLASS_CONFIGS[kind])
    folder = model.save_pretrained(tmp_path / kind)
    loaded = type(model).from_pretrained(folder)
    assert type(loaded) is type(model) and not loaded.training
    expected = from_pretrained(folder).state_dict()  # chapter 10a's reader, independently
    assert expected.keys() == loaded.state_dict().keys()
    assert all(torch.equal(expected[k], v) for k, v in loaded.state_dict().items())
    other = "lstm" if kind != "lstm" else "txl"
    with pytest.raises(ValueError, match=f"a {type(CLASS_CONFIGS[kind]).__name__} model, not a"):
        type(build_model(CLASS_CONFIGS[other])).from_pretrained(folder)
    with pytest.raises(
        ValueError, match=f"holds a {type(CLASS_CONFIGS[kind]).__name__}, expected a"
    ):
        type(model).from_pretrained(folder, config=CLASS_CONFIGS[other])


@pytest.mark.parametrize("kind", CLASS_CONFIGS)
def test_outputs_read_by_key_and_position_as_huggingface_model_outputs(kind):
    "LMOutput's keys, to_tuple, out[key] and out[i] are those of transformers' ModelOutput."
    from transformers.utils import ModelOutput

    @dataclasses.dataclass
    class Reference(ModelOutput):  # the same fields, in the same order, HuggingFace's behaviour
        logits: torch.Tensor | None = None
        losses: torch.Tensor | None = None
        mems: list | None = None
        hiddens: list | None = None
        loss: torch.Tensor | None = None

    model = build_model(CLASS_CONFIGS[kind])
    ids = torch.randint(30, (2, 6), generator=torch.Generator().manual_seed(0))
    for out in (model(ids), model(ids, targets=ids)):
        expected = Reference(**{f.name: getattr(out, f.name) for f in dataclasses.fields(out)})
        assert out.keys() == list(expected.keys())
        assert [id(v) for v in out.to_tuple()] == [id(v) for v in expected.to_tuple()]
        assert all(out[k] is expected[k] for k in expected.keys())
        assert all(out[i] is expected[i] for i in range(-len(expected), len(expected)))
    with pytest.raises(KeyError, match="'loss' is not set in this output"):
        model(ids)["loss"]


@pytest.mark.parametrize("kind", CLASS_CONFIGS)
def test_configs_to_dict_is_config_json_and_from_dict_reads_it_back(kind, tmp_path):
    config = CLASS_CONFIGS[kind]
    folder = build_model(config).save_pretrained(tmp_path / kind)
    stored = json.loads((folder / "config.json").read_text())
    assert json.loads(json.dumps(config.to_dict())) == stored  # JSON has lists, not tuples
    assert type(config).from_dict(stored) == config == type(config).from_dict(config.to_dict())
    with pytest.raises(ValueError, match=r"does not have: \['colour'\]"):
        type(config).from_dict({**config.to_dict(), "colour": 1})


@pytest.mark.parametrize("kind", CLASS_CONFIGS)
def test_from_pretrained_moves_the_model_to_the_dtype_and_device_asked(kind, tmp_path):
    model = build_model(CLASS_CONFIGS[kind])
    folder = model.save_pretrained(tmp_path / kind)
    for load in (from_pretrained, type(model).from_pretrained):
        double = load(folder, device="cpu", dtype=torch.float64)
        assert {(p.dtype, p.device.type) for p in double.parameters()} == {(torch.float64, "cpu")}
        expected = model.double().state_dict()  # the saved weights, converted here
        assert all(torch.equal(expected[k], v) for k, v in double.state_dict().items())
        model.float()
    with pytest.raises(TypeError, match="dtype must be None or a torch.dtype"):
        from_pretrained(folder, dtype="float64")


def test_generate_is_greedy_without_do_sample_and_cuts_to_top_p():
    "do_sample=False equals temperature 0; a top_p cut never draws a token outside the nucleus."
    model = build_model(CLASS_CONFIGS["txl"])
    prompt = torch.randint(30, (3, 4), generator=torch.Generator().manual_seed(0))
    greedy = model.generate(prompt, 6, do_sample=False, temperature=0.7, top_p=0.3)
    assert torch.equal(greedy, model.generate(prompt, 6, temperature=0))
    drawn = model.generate(prompt, 1, top_p=1e-6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(drawn, model.generate(prompt, 1, temperature=0))  # only the likeliest left


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12, unique=True), st.floats(0.01, 1.0))
def test_nucleus_keeps_what_huggingfaces_top_p_keeps(scores, top_p):
    "The tokens `nucleus` keeps are those transformers' TopPLogitsWarper leaves finite."
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.tensor([scores], dtype=torch.float64)
    ranked = logits.softmax(-1).sort(descending=True).values
    assume(bool((ranked.cumsum(-1) - top_p).abs().min() > 1e-9))  # not a rounding from the cut
    assume(bool((ranked[:, :-1] - ranked[:, 1:]).min() > 1e-9))  # no tie: either could be kept
    kept = nucleus(logits.softmax(-1), top_p) > 0
    reference = TopPLogitsWarper(top_p, min_tokens_to_keep=1)(None, logits).isfinite()
    assert torch.equal(kept, reference)


def test_a_folder_saved_with_its_vocabulary_samples_text_from_the_command_line(tmp_path):
    "save_pretrained(folder, vocab=...) is all `generate --checkpoint folder` needs; without: told."
    from txl_lib.generate_cli import load_run

    vocab = txl_lib.CharVocab("abcdefgh ")
    model = build_model(TXLConfig.tiny(n_token=len(vocab.itos)))
    loaded_vocab, loaded = load_run(str(model.save_pretrained(tmp_path / "with", vocab.itos)))
    assert loaded_vocab.itos == vocab.itos and type(loaded) is TransformerXL
    with pytest.raises(FileNotFoundError, match=r"save_pretrained\(folder, vocab=vocab.itos\)"):
        load_run(str(model.save_pretrained(tmp_path / "without")))
