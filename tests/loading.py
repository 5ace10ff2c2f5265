"""The tests' shorthand for loading a `save_checkpoint` file: any model `build_model` builds, its
config read by `config_from_dict` (the library's `from_pretrained` takes the same route)."""

from txl_lib.pretrained import build_model, config_from_dict
from txl_lib.serialization import load_checkpoint as load_file


def load_checkpoint(path, expected=None, build=build_model, read_config=config_from_dict):
    "(model in eval mode, step) of a checkpoint file, through the library's one loader."
    return load_file(path, build, read_config, expected)
