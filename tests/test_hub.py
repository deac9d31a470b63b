"""Hub ids through the local Hugging Face cache (heads_jax.hub): a cache the test writes in the
hub layout (``models--org--name/refs/main`` + ``snapshots/<commit>/``), HF_HOME pointing at it,
HF_HUB_OFFLINE set (tests/conftest.py); nothing downloads."""

import shutil

import numpy as np
import pytest

pytest.importorskip("torch")

from heads_jax import hub, load_model
from heads_jax.cli import main as cli_main
from heads_jax.errors import UserError
from heads_jax.model.loading import convert_dir
from tests.family_models import save_family_dir

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_cached_model(cache, repo_id, family="roberta", seed=0):
  """Saves a random ``family`` model as the hub cache holds ``repo_id``; returns the snapshot."""
  repo = cache / ("models--" + repo_id.replace("/", "--"))
  snap = repo / "snapshots" / COMMIT
  save_family_dir(family, snap, seed=seed)
  (repo / "refs").mkdir(parents=True)
  (repo / "refs" / "main").write_text(COMMIT)
  return snap


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
  home = tmp_path / "hf_home"
  monkeypatch.setenv("HF_HOME", str(home))
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return home


@pytest.mark.slow
def test_hub_id_resolves_through_hf_home_cache(hf_home, tmp_path, monkeypatch):
  snap = write_cached_model(hf_home / "hub", "org/tiny-roberta")
  assert hub.cache_dir() == hf_home / "hub"
  assert hub.resolve("org/tiny-roberta") == snap
  monkeypatch.chdir(tmp_path)  # no local folder of that name
  model, tok = load_model("org/tiny-roberta")
  assert model.config.family == "roberta" and type(tok).__name__ == "RobertaTokenizer"
  ref, _ = load_model(snap)
  ids = np.array([[0, 7, 8, 9, 2]], np.int32)
  np.testing.assert_array_equal(np.asarray(model(ids)["last_hidden_state"]),
                                np.asarray(ref(ids)["last_hidden_state"]))
  kind, _ = convert_dir("org/tiny-roberta", tmp_path / "converted")
  assert kind == "heads_jax" and (tmp_path / "converted" / "heads_jax.json").is_file()


def test_hf_hub_cache_wins_over_hf_home(hf_home, tmp_path, monkeypatch):
  other = tmp_path / "elsewhere"
  snap = write_cached_model(other, "tiny-albert", family="albert")
  monkeypatch.setenv("HF_HUB_CACHE", str(other))
  assert hub.resolve("tiny-albert") == snap


def test_local_path_wins_over_hub_id(hf_home, tmp_path, monkeypatch):
  write_cached_model(hf_home / "hub", "org/tiny", family="roberta")
  monkeypatch.chdir(tmp_path)
  save_family_dir("electra", tmp_path / "org" / "tiny")
  model, _ = load_model("org/tiny", with_tokenizer=False)
  assert model.config.family == "electra"


def test_missing_id_offline_is_one_line_with_the_fetch_command(hf_home, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError, match=r"does not hold it \(HF_HUB_OFFLINE is set\): fetch it with `hf download org/absent`"):
    load_model("org/absent")
  code = cli_main(["analyze", "--model", "org/absent", "--data", "ud-ewt", "--out", str(tmp_path / "o")])
  err = capsys.readouterr().err.strip()
  assert code == 2 and len(err.splitlines()) == 1 and "hf download org/absent" in err
  # A cached entry without weights is named as such.
  snap = write_cached_model(hf_home / "hub", "org/broken")
  for f in snap.glob("*.safetensors"):
    f.unlink()
  with pytest.raises(UserError, match="without its weights"):
    hub.resolve("org/broken")


def test_what_counts_as_a_repo_id():
  for name in ("roberta-base", "google/electra-small-discriminator", "FacebookAI/xlm-roberta-base"):
    assert hub.looks_like_repo_id(name)
  for name in ("/abs/path", "./model", "a/b/c", "../x", "vocab.txt", ""):
    assert not hub.looks_like_repo_id(name)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hub.model_path("/no/such/dir")


def _refused(status, headers):
  import httpx
  from huggingface_hub.errors import RepositoryNotFoundError
  request = httpx.Request("GET", "https://huggingface.co/api/models/org/absent/revision/main")
  return RepositoryNotFoundError(f"{status} Client Error.", response=httpx.Response(status, headers=headers, request=request))


@pytest.mark.parametrize("error, expected", [
    # no route to the hub at all (DNS, refused connection): huggingface_hub's LocalEntryNotFoundError
    ("connect", "not in the Hugging Face cache"),
    # a proxy's bare 401 (no X-Error-Code): huggingface_hub calls it RepositoryNotFoundError
    ("proxy", "not in the Hugging Face cache"),
    # the hub itself says the repository does not exist
    ("hub", "a typo, a private or gated model?"),
])
def test_an_online_miss_says_no_network_unless_the_hub_answered(hf_home, monkeypatch, error, expected):
  from huggingface_hub.errors import LocalEntryNotFoundError
  monkeypatch.delenv("HF_HUB_OFFLINE")
  errors = {"connect": LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\n"
                                               "An error happened while trying to locate the files on the Hub"),
            "proxy": _refused(401, {}),
            "hub": _refused(401, {"X-Error-Code": "RepoNotFound"})}

  def snapshot(repo_id, revision, cache, local_only, patterns):
    raise LocalEntryNotFoundError("not cached") if local_only else errors[error]
  monkeypatch.setattr(hub, "_snapshot", snapshot)
  with pytest.raises(UserError) as e:
    hub.resolve("org/absent")
  message = str(e.value)
  assert expected in message and len(message.splitlines()) == 1
  if error != "hub":
    assert "no network to fetch it" in message and "typo" not in message
    assert "hf download org/absent" in message


def test_modernbert_hub_id_loads_from_the_cache(hf_home, tmp_path, monkeypatch):
  """A ModernBERT in the hub cache (config.json, model.safetensors, tokenizer.json) loads by its
  id, with its tokenizer's [CLS]/[SEP] template and its local/global layers."""
  write_cached_model(hf_home / "hub", "org/tiny-modernbert", family="modernbert")
  monkeypatch.chdir(tmp_path)
  model, tok = load_model("org/tiny-modernbert")
  assert model.config.family == "modernbert" and model.config.windows == (None, 4, 4, None)
  ids = tok("a b", "c")["input_ids"]
  assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == ["[CLS]", "[SEP]"]
  assert np.isfinite(np.asarray(model(np.array([ids], np.int32))["last_hidden_state"])).all()
