"""The README's paper run (TPU v3-8 with a bucket, GPU host with local paths): every path a
command reads is what an earlier command of the same block writes (a work directory, its
``checkpoints`` or exported ``model`` / ``best_model``, the corpus, the downloaded Wikipedia) or
data that exists beside the repository; bucket paths stay URLs; the configs load with the
commands' overrides. (That every README command parses is tests/e2e/test_readme.py.)"""

from __future__ import annotations

import os
import re
import shlex

import pytest

from heads_jax import storage
from heads_jax.training import configlib
from heads_jax.training.rundir import RunDir
from tests.helpers import REPO

README = (REPO / "README.md").read_text()
SECTION = README.split("### The paper's run", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```bash\n(.*?)```", SECTION, flags=re.S)


def _lines(block: str) -> list[list[str]]:
  return [shlex.split(line.split("  #")[0]) for line in block.splitlines()
          if line.strip() and not line.lstrip().startswith("#")]


def _opts(argv: list[str]) -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for i, a in enumerate(argv):
    if a.startswith("--"):
      key, eq, value = a.partition("=")
      if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        value = argv[i + 1]
      out.setdefault(key, []).append(value)
  return out


def _resolves(path: str, written: set[str]) -> bool:
  """Written by an earlier command, or existing beside the repository (relative to it)."""
  if path in written:
    return True
  if storage.is_url(path):
    return False
  return (REPO / path).exists()


def test_the_paper_section_has_a_tpu_and_a_gpu_block():
  assert len(BLOCKS) == 3  # corpus preparation, TPU v3-8 (bucket), GPU host (local)
  commands = [c for b in BLOCKS for c in _lines(b)]
  assert sum(c[:2] == ["heads-jax", "pretrain"] for c in commands) == 4
  assert any("gs://" in " ".join(c) for c in _lines(BLOCKS[1]))
  assert not any("gs://" in " ".join(c) for c in _lines(BLOCKS[2]))


@pytest.mark.parametrize("block", [BLOCKS[0] + BLOCKS[1], BLOCKS[2]], ids=["tpu", "gpu"])
def test_every_path_read_is_written_before_or_exists(block):
  if not (REPO.parent / "shared" / "data").exists() and not os.environ.get("CI"):
    pytest.skip("shared data not beside the repository")
  written: set[str] = set()
  for argv in _lines(block):
    opts = _opts(argv)
    if argv[:2] == ["hf", "download"]:
      local = opts["--local-dir"][0]
      include = opts["--include"][0].split("/")[0]
      written.add(f"{local}/{include}")
      continue
    if argv[0] != "heads-jax":
      continue
    command = argv[1]
    for url in [v for vs in opts.values() for v in vs if "gs:" in v]:
      assert url.startswith("gs://") and os.fspath(storage.as_path(url)) == url.rstrip("/"), url
    reads = []
    for key in ("--config.init_checkpoint", "--model", "--config.data.sources", "--wikipedia",
                "--text"):
      reads += opts.get(key, [])
    reads += [d.split(":", 1)[1].rsplit(":", 1)[0] for d in opts.get("--data", [])
              if d.startswith("glue-tsv:")]
    for path in reads:
      assert _resolves(path, written), f"{command} reads {path}, which nothing wrote: {argv}"
    if command in ("pretrain", "finetune"):
      config = configlib.load_config(opts["--config"][0], [
          f"{k[len('--config.'):]}={v}" for k, vs in opts.items() if k.startswith("--config.")
          for v in vs])
      if command == "pretrain" and config.init_checkpoint:
        assert config.init_checkpoint.endswith("/checkpoints")  # an Orbax run: phase 1's params
      if config.preset.startswith("bert_base"):
        assert config.batch_size % 8 == 0 and config.model.size == "base"
      out = opts["--workdir"][0]
      run = RunDir(out)
      assert os.fspath(run.checkpoints) == os.fspath(storage.as_path(out)) + "/checkpoints"
      written |= {out, f"{out}/checkpoints", f"{out}/model", f"{out}/best_model"}
    if command in ("prepare-corpus", "analyze"):
      written.add(opts["--out"][0])


# ------------------------------------------------------------------------------------------------
# README's paper table (section "The paper in one command") and its prose agree


def _paper_table_section() -> str:
  return README.split("## The paper in one command", 1)[1].split("\n## ", 1)[0]


def _table(text: str, header: str) -> list[list[str]]:
  """The cells of the Markdown table whose header row starts with ``header``."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("| "):
      break
    rows.append([c.strip() for c in line.split("|")[1:-1]])
  return rows


def test_readme_dev_scores_beat_the_majority_class():
  """Issue 41: README's paper table comes from a run whose classifiers all beat their majority
  class: the dev table's accuracy is above the majority share for each of the four tasks, and its
  p-value (one-sided exact binomial) is below 0.05, recomputed here from the figures shown."""
  from scipy import stats as sp_stats
  rows = _table(_paper_table_section(), "| task | this run (dev) |")
  assert [r[0].split()[0] for r in rows] == ["MRPC", "QQP", "SST-2", "QNLI"]
  for task, dev, majority, _, _ in rows:
    n = int(re.search(r"\((\d+) ", task).group(1))
    acc = float(re.search(r"accuracy ([\d.]+)%", dev).group(1)) / 100
    share = float(majority.rstrip("%")) / 100
    p = sp_stats.binomtest(round(acc * n), n, share, alternative="greater").pvalue
    assert acc > share and p < 0.05, (task, acc, share, p)


def test_readme_paper_table_and_prose_agree():
  """The table's verdicts are today's (issue 41: Pande's numbers on MiniLM "not comparable (other
  model)"), the prose's counts are the table's, and what the prose says reproduces holds in the
  table, apart from what holds trivially."""
  from heads_jax.hoststats import claims as paper
  text = _paper_table_section()
  rows = _table(text, "| claim |")
  verdicts = [r[-1].strip() for r in rows]
  assert rows and set(verdicts) <= set(paper.VERDICTS) - {paper.NOT_COMPUTABLE}
  claim_of = {c.text: c for c in paper.CLAIMS}
  assert all(r[0].strip() in claim_of for r in rows)        # every row is a claim of today's
  flat = " ".join(text.split())
  m = re.search(r"Of the (\d+) claims, (\d+) hold, (\d+) do not hold, (\d+) (?:is|are) undecided at this "
                r"n(?: \([^)]*\))?, (\d+) are not computable "
                r"here(?: \([^)]*\))?, (\d+) are not comparable \(other model\),? (?:and )?(\d+) are "
                r"not comparable \(other model and data\)(?: and (\d+) awaits? the rerun|; none awaits)",
                flat)
  assert m, "the prose states the verdict counts, the three outcomes of a judged claim first"
  total, holds, fails, undecided, not_computable, other_model, other_data = map(int, m.groups()[:7])
  rerun = int(m.group(8) or 0)
  assert total == len(paper.CLAIMS)
  assert holds == verdicts.count(paper.HOLDS) and fails == verdicts.count(paper.FAILS)
  assert undecided == verdicts.count(paper.UNDECIDED)
  assert other_model == verdicts.count(paper.NOT_COMPARABLE_MODEL)
  assert other_data == verdicts.count(paper.NOT_COMPARABLE)
  assert not_computable == total - len(rows) - rerun
  # on all-MiniLM-L6-v2 (not BERT-base) no number or layer placement of Pande et al. is judged
  for r, v in zip(rows, verdicts):
    c = claim_of[r[0].strip()]
    if c.paper in (paper.PANDE, paper.BLOG) and c.key not in paper.PANDE_METHOD_CLAIMS:
      assert v == paper.NOT_COMPARABLE_MODEL, c.key
  # what the prose says reproduces holds in the table, and what holds trivially is apart
  table = {r[0].strip(): r[-1].strip() for r in rows}
  reproduces = re.search(r"these reproduce \(([^)]*)\)", flat)
  assert reproduces
  keys = re.findall(r"`(\w+)`", reproduces.group(1))
  for key in keys:
    assert table[paper.claim(key).text] == paper.HOLDS, key
  assert "delimiter_intersect" not in keys and "`delimiter_intersect`" in flat
