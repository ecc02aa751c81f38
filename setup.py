"""Packaging details pyproject.toml cannot say: data that lives outside gpuvm/ in the
checkout but must travel with an installed package (`pip install .`, not editable).

- guest_tools/ (the guest driver's C sources, built with the machine's gcc at first use)
  is installed as gpuvm/guest_tools; gpuvm/vmm/guest_build.py looks there when the
  checkout's copy is absent, and builds into a user cache dir when it is read-only.
- experiments/ (the experiment files, the domain XML they name, and the cost profiles
  `gpuvm run` prices counts with) is installed as gpuvm/experiment/files, so
  `gpuvm experiment NAME` runs them (gpuvm/experiment/catalog.py).
"""

from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

HERE = Path(__file__).parent
GUEST_SOURCES = ["*.c", "*.h", "*.ld", "*.S", "*.md"]

guest_packages = ["gpuvm.guest_tools"] + [
    "gpuvm.guest_tools." + p for p in find_namespace_packages("guest_tools", exclude=["build*"])]

setup(
    packages=find_packages(include=["gpuvm*", "shadow*", "scheduler*"])
    + guest_packages + ["gpuvm.experiment.files"],
    package_dir={"gpuvm.guest_tools": "guest_tools",
                 "gpuvm.experiment.files": "experiments"},
    package_data={**{p: GUEST_SOURCES for p in guest_packages},
                  "gpuvm.experiment.files": ["*.toml", "costs/*.toml", "domains/*.xml"],
                  "gpuvm.device": ["profiles/*.toml"]},
    include_package_data=False,
)
