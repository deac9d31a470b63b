"""Paths of the embedded default data in ``heads_jax/assets`` (see its README.md for provenance).

The files ship inside the package (setup.cfg ``package_data``), so the demo and the tests run
offline: UD English EWT test (gold dependency parses), GLUE SST-2 and MRPC dev, three short
Project Gutenberg books, and the ``bert-base-uncased`` WordPiece vocabulary.
"""

from pathlib import Path

_ASSETS = Path(__file__).resolve().parent.parent / "assets"


def _existing(path: Path) -> Path:
  if not path.exists():
    raise FileNotFoundError(
        f"embedded data file {path} is missing: the heads_jax installation is incomplete "
        f"(package_data must include heads_jax/assets/**); reinstall heads_jax")
  return path


def assets_dir() -> Path:
  """The folder holding all embedded data."""
  return _existing(_ASSETS)


def ud_ewt_test_path() -> Path:
  """UD English EWT v2.16 test split (CoNLL-U, 2,077 sentences)."""
  return _existing(_ASSETS / "ud_ewt" / "en_ewt-ud-test.conllu")


def glue_dir() -> Path:
  """A GLUE-style root folder holding ``SST-2/dev.tsv`` and ``MRPC/dev.tsv``."""
  return _existing(_ASSETS / "glue")


def sst2_dev_path() -> Path:
  """GLUE SST-2 dev TSV (872 sentences, ``sentence label``)."""
  return _existing(_ASSETS / "glue" / "SST-2" / "dev.tsv")


def mrpc_dev_path() -> Path:
  """GLUE MRPC dev TSV (408 pairs, with the UTF-8 byte-order mark)."""
  return _existing(_ASSETS / "glue" / "MRPC" / "dev.tsv")


def gutenberg_paths() -> list[Path]:
  """The embedded Project Gutenberg books (plain text, paragraphs split by blank lines), sorted."""
  paths = sorted(_existing(_ASSETS / "gutenberg").glob("*.txt"))
  if not paths:
    raise FileNotFoundError(f"no books in {_ASSETS / 'gutenberg'}: reinstall heads_jax")
  return paths


def vocab_path() -> Path:
  """The ``bert-base-uncased`` WordPiece vocabulary (30,522 entries)."""
  return _existing(_ASSETS / "vocab" / "vocab.txt")
