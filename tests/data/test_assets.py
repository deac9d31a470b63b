"""Embedded default data: present, unchanged (SHA256SUMS), attributed."""
import hashlib

from heads_jax.data import assets


def test_paths_exist_and_checksums_match():
  root = assets.assets_dir()
  sums = {}
  for line in (root / "SHA256SUMS").read_text().splitlines():
    digest, name = line.split(maxsplit=1)
    sums[(root / name).resolve()] = digest
  paths = [assets.ud_ewt_test_path(), assets.sst2_dev_path(), assets.mrpc_dev_path(),
           assets.vocab_path(), *assets.gutenberg_paths()]
  assert len(assets.gutenberg_paths()) == 3
  assert set(sums) == {p.resolve() for p in paths}
  for p in paths:
    assert hashlib.sha256(p.read_bytes()).hexdigest() == sums[p.resolve()], p
  total = sum(p.stat().st_size for p in paths)
  assert total < 3_500_000


def test_vocab_and_readme():
  lines = assets.vocab_path().read_text(encoding="utf-8").splitlines()
  assert len(lines) == 30522 and lines[0] == "[PAD]" and lines[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  readme = (assets.assets_dir() / "README.md").read_text()
  for needle in ("CC BY-SA 4.0", "Apache-2.0", "public domain", "Microsoft Research", "SST-2"):
    assert needle in readme
  assert assets.mrpc_dev_path().read_bytes().startswith(b"\xef\xbb\xbf")
