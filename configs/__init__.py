"""Config files (ml_collections), shipped with the package as ``heads_jax.configs``.

Each file defines ``get_config(arg=None)``; pass one as ``--config configs/FILE.py:PRESET``
(a path that is not a file from the current directory is looked up here, so the same spelling
works from a clone and after ``pip install heads_jax``).
"""
