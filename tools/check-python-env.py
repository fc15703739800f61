"""Exits 0 when .venv/ holds the pinned PyTorch and every oracle of tools/python-requirements.txt."""
import importlib.metadata as md
import pathlib
import sys

torch_pin = sys.argv[1]
import torch  # noqa: E402
import numpy  # noqa: E402,F401
import safetensors  # noqa: E402,F401

if torch.__version__.split("+")[0] != torch_pin:
    sys.exit(1)
requirements = pathlib.Path(__file__).with_name("python-requirements.txt").read_text().splitlines()
for line in requirements:
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    name, version = line.split("==")
    if md.version(name) != version:
        sys.exit(1)
