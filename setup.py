"""The package list: everything under heads_jax/, plus the entry points and configs that live at
the top of the repository (mapped in setup.cfg's package_dir). All other metadata: setup.cfg."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["heads_jax", "heads_jax.*"])
      + ["heads_jax.train", "heads_jax.analyze", "heads_jax.configs"])
