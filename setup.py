"""Only the package list: every package under offloadlab/ (found, not kept by hand) and the two pyproject.toml
maps from other folders. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["offloadlab", "offloadlab.*"]), "offloadlab.examples", "offloadlab_tui"])
