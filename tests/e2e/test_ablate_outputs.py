"""`heads-jax ablate` reuses a part only over intact outputs (issue 43 item 6): a reused part whose
file was deleted, damaged or truncated (any file it wrote, not only its first table) runs again
and says so in one line naming the file; `--redo report` with a part's file missing reruns that
part instead of dropping its section from the report."""

from __future__ import annotations

import pandas as pd

from heads_jax.pipelines.ablate import AblationConfig, _damaged, run_ablation
from tests.pipelines.test_ablate import _save_classifier, _stage_states


def test_a_missing_or_damaged_output_reruns_its_part_and_says_which(tmp_path):
  model = _save_classifier(tmp_path / "model")
  out = tmp_path / "out"
  ana = tmp_path / "analysis"   # two roles: tests.csv as `heads-jax analyze` writes it
  ana.mkdir()
  pd.DataFrame([(l, h, role, 1.0, 10, 1.0, 0.5, 0.5, (l, h, role) in {(0, 1, "delimiter"),
                                                                      (1, 2, "local")})
                for l in range(2) for h in range(4) for role in ("local", "delimiter")],
               columns=["layer", "head", "role", "mean", "n", "statistic", "p_value",
                        "p_adjusted", "assigned"]).to_csv(ana / "tests.csv", index=False)
  cfg = AblationConfig(model=str(model), data="mrpc", out=str(out), analysis=str(ana), by="role",
                       random_groups=2, random_seeds=1, max_examples=6, batch_size=8,
                       max_length=32)

  def run(**kw):
    lines = []
    run_ablation(cfg, log=lines.append, **kw)
    return _stage_states(lines), lines

  states, _ = run()
  assert set(states.values()) == {"run"}
  # the report's page and ablation.json: only the report reruns (the model is not loaded)
  (out / "ablation.json").unlink()
  states, lines = run()
  assert states == {"baseline": "reused", "ablation": "reused", "report": "run"}
  assert f"  report: {out / 'ablation.json'} is missing; running it again" in lines
  # the part's second file (the causal test) deleted: before, only a part's first table was
  # checked, so it was reused and the report dropped the causal section without a word
  (out / "causal.csv").unlink()
  states, lines = run(redo="report")
  assert states == {"baseline": "reused", "ablation": "run", "report": "run"}
  assert [x for x in lines if x.endswith("; running it again")] == [
      f"  ablation: {out / 'causal.csv'} is missing; running it again"]
  html = (out / "report.html").read_text()
  assert "Ablation by role" in html and "Causal test of the roles" in html


def test_a_file_that_is_no_table_or_not_as_written_is_damaged(tmp_path):
  # what a part's `intact` reads: bytes that are no CSV, an empty file, bad JSON, a table cut
  # short (its finish marker records the rows and columns written)
  (tmp_path / "t.csv").write_bytes(b"\xff\xfe\x00\x81 not a table")
  (tmp_path / "e.csv").write_text("")
  (tmp_path / "ok.csv").write_text("a,b\n1,2\n")
  (tmp_path / "bad.json").write_text("{")
  assert _damaged(tmp_path, {"t.csv": None}) == f"{tmp_path / 't.csv'} cannot be read (UnicodeDecodeError)"
  assert _damaged(tmp_path, {"e.csv": None}) == f"{tmp_path / 'e.csv'} cannot be read (EmptyDataError)"
  assert _damaged(tmp_path, {"bad.json": None}) == f"{tmp_path / 'bad.json'} cannot be read (JSONDecodeError)"
  assert _damaged(tmp_path, {"ok.csv": [1, ["a", "b"]]}) is None
  assert _damaged(tmp_path, {"ok.csv": [2, ["a", "b"]]}).endswith("does not hold what was written "
                                                                  "(damaged or edited)")
