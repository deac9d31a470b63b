"""`heads-jax ablate` (heads_jax.pipelines.ablate): end to end on a tiny classifier; its inputs
checked before any work (issue 28, issue 34: the analysis of another model, bad counts, a mode
that would be ignored); on the stage engine (issue 32): a rerun reuses every part, a changed
input reruns the parts reading it, --redo, the lock and the claim."""

import argparse
import json
import socket

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from analyze import ablate as ablate_entry
from heads_jax import contract, runfiles
from heads_jax.data import glue
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.data.vocabulary import DISTANCE_FEATURES
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification
from heads_jax.ablation import tasks as tasks_mod
from heads_jax.ablation.tasks import check_classifier_task, classifier_task
from heads_jax.pipelines.ablate import AblationConfig, check_analysis_model, run_ablation
from tests.helpers import requires_shared


def _save_classifier(path, seed=0):
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  model = BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(seed))
  save_model(model, path, tok, id2label={0: "not_equivalent", 1: "equivalent"})
  return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  return _save_classifier(tmp_path_factory.mktemp("model") / "m")


NAMES = ["vertical", "diagonal", "dense", "vertical", "dense+vertical", "diagonal", "dense", "vertical"]


def _analysis(d, names=NAMES, model=None):
  """An analysis directory with clusters.csv (and, given ``model``, a run file whose model key is
  that model's content identity, as `heads-jax analyze` writes it)."""
  d.mkdir(parents=True, exist_ok=True)
  rows = [{"layer": i // 4, "head": i % 4, **{f: 1 / 21 for f in DISTANCE_FEATURES},
           "cluster": 0, "cluster_name": name, "tsne_x": 0.0, "tsne_y": 0.0}
          for i, name in enumerate(names)]
  pd.DataFrame(rows).to_csv(d / "clusters.csv", index=False)
  if model is not None:
    contract.write_run(d, {"model": str(model)}, [],
                       inputs={"model": runfiles.model_identity(model), "data": []})
  return d


@pytest.fixture(scope="module")
def analysis_dir(tmp_path_factory, tiny_dir):
  return _analysis(tmp_path_factory.mktemp("analysis"), model=tiny_dir)


def _args(**kw):
  p = argparse.ArgumentParser()
  ablate_entry.add_args(p)
  argv = []
  for k, v in kw.items():
    flag = "--" + k.replace("_", "-")
    if v is True:
      argv.append(flag)
    elif isinstance(v, list):
      for x in v:
        argv += [flag, str(x)]
    else:
      argv += [flag, str(v)]
  return ablate_entry.to_config(p.parse_args(argv))


@pytest.mark.slow
def test_ablate_cli_end_to_end(tiny_dir, analysis_dir, tmp_path):
  out = tmp_path / "out"
  lines = []
  res = run_ablation(_args(model=tiny_dir, data="mrpc", max_examples=12, out=out,
                               analysis=analysis_dir, by="cluster", cross="both",
                               cluster=["vertical", "diagonal"], prune=True, prune_step=0.5,
                               paper_tables=True,
                               random_seeds=1, batch_size=8, max_length=64),
                         log=lines.append)
  table = pd.read_csv(out / "ablation.csv")
  assert list(table["group"]) == ["none (unablated)", "dense", "diagonal", "dense+vertical", "vertical"]
  assert list(table["num_heads"]) == [0, 2, 2, 1, 3]
  base = table.iloc[0]
  assert np.allclose(table["accuracy_change"], table["accuracy"] - base["accuracy"])
  seg = pd.read_csv(out / "segment_ablation.csv")
  assert set(seg["ablation"]) == {"none", "intra", "inter"} and set(seg["group"]) == {
      "none (unablated)", "vertical", "diagonal"}
  assert not seg["renormalised"].any()
  curve = pd.read_csv(out / "pruning.csv")
  first = curve[(curve["method"] == "importance") & (curve["num_pruned"] == 0)].iloc[0]
  assert first["accuracy"] == pytest.approx(base["accuracy"])
  assert sorted(curve["share_pruned"].unique()) == [0.0, 0.5, 1.0]
  imp = pd.read_csv(out / "importance.csv")
  assert len(imp) == 8 and np.allclose(imp.groupby("layer")["importance"].apply(
      lambda v: np.sqrt((v ** 2).sum())), 1.0, atol=1e-4)
  html = (out / "report.html").read_text()
  for title in ("Ablation by cluster", "Intra- and inter-sentence attention removed",
                "Head importance", "Pruning curve", "NOT renormalised"):
    assert title in html
  assert "Guan et al. Tables 2 and 3" in html
  assert "types without heads here" not in html   # every type has heads (empty cells read as "")
  assert html.count("data:image/png;base64,") == 4   # the registry's figures, drawn
  assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
      "group_ablation.png", "importance.png", "pruning.png", "segment_ablation.png"]
  summary = json.loads((out / "ablation.json").read_text())
  assert summary["baseline"]["n"] == 12
  assert any("report:" in line for line in lines) and res["report"] == str(out / "report.html")
  assert (out / "figures" / "pruning.png").is_file()


def test_ablate_cli_errors(tiny_dir, tmp_path):
  with pytest.raises(UserError, match="nothing to do"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o"))
  with pytest.raises(UserError, match="needs --analysis"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o", by="cluster",
                       max_examples=4, max_length=64))
  with pytest.raises(UserError, match="not GLUE data"):
    run_ablation(_args(model=tiny_dir, data="ud-ewt", out=tmp_path / "o", by="layer", max_length=64))
  assert not (tmp_path / "o").exists()   # refused before anything was written
  with pytest.raises(UserError, match="--max-length 128 exceeds the model's 64 positions"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o", by="layer",
                       max_examples=4))


@pytest.mark.parametrize("flags, message", [
    ({"random_groups": -1}, "--random-groups -1: give a whole number of at least 0 (0: no causal test)"),
    ({"random_seeds": -2}, "--random-seeds -2: give a whole number of at least 0"),
    ({"max_examples": 0}, "--max-examples 0: give a whole number of at least 1"),
    ({"batch_size": 0}, "--batch-size 0: give a whole number of at least 1"),
    ({"prune": True, "prune_step": 0}, "--prune-step 0.0: give a share of the heads"),
    ({"prune": True, "prune_max": 1.5}, "--prune-max 1.5: give a share of the heads"),
    ({"by": None, "cross": "intra", "heads": "0:1", "mode": "mean"},
     "--mode mean applies to the groups of --by; --cross removes"),
    ({"by": None, "importance": True, "mode": "uniform"}, "--mode uniform applies to the groups of --by"),
])
def test_bad_counts_and_ignored_options_are_refused_before_loading(tmp_path, monkeypatch, flags,
                                                                   message):
  # Before (issue 34): --random-groups -1 turned the causal test silently off, and --cross intra
  # --mode mean ignored the mode.
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  kw = {"model": "m", "data": "mrpc", "out": tmp_path / "o", "by": "layer", **flags}
  with pytest.raises(UserError) as e:
    run_ablation(_args(**{k: v for k, v in kw.items() if v is not None}))
  assert message in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "o").exists()


def test_analysis_of_another_model_is_refused(tiny_dir, tmp_path, monkeypatch):
  # Before (issue 34): --analysis DIR of another model of the same shape was ablated and
  # reported as this model's roles.
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  other = _save_classifier(tmp_path / "other", seed=1)
  theirs = _analysis(tmp_path / "theirs", model=other)
  with pytest.raises(UserError, match=f"--analysis {theirs} is an analysis of another model "
                                      f".*than --model {tiny_dir}"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o", by="cluster",
                       analysis=theirs))
  assert not (tmp_path / "o").exists()
  # the same model under another path (a copy) is the same model: content, not the path
  import shutil
  copy = shutil.copytree(tiny_dir, tmp_path / "copy")
  lines = []
  check_analysis_model(_args(model=copy, data="mrpc", out=tmp_path / "o", by="cluster",
                                        analysis=_analysis(tmp_path / "mine", model=tiny_dir)),
                                  log=lines.append)
  assert lines == []
  # an analysis that does not say which model it analysed: one line, not a refusal
  check_analysis_model(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o",
                                        by="cluster", analysis=_analysis(tmp_path / "bare")),
                                  log=lines.append)
  assert len(lines) == 1 and "does not record which model it analysed" in lines[0]


def _stage_states(lines):
  """``{stage: "run" | "reused"}`` from the engine's closing line of each stage."""
  out = {}
  for line in lines:
    if line.startswith("[") and "part(s)" in line:
      name = line.split("] ", 1)[1].split(":", 1)[0]
      out[name] = "reused" if "done earlier, reused" in line else "run"
  return out


@pytest.mark.slow
def test_rerun_reuses_and_a_changed_input_reruns_its_readers(tiny_dir, tmp_path, monkeypatch):
  model = _save_classifier(tmp_path / "model")
  ana = _analysis(tmp_path / "analysis", model=model)
  out = tmp_path / "out"
  cfg = _args(model=model, data="mrpc", out=out, analysis=ana, by="cluster", random_seeds=0,
              max_examples=6, batch_size=8, max_length=32)

  def run(**kw):
    lines = []
    res = run_ablation(cfg, log=lines.append, **kw)
    return res, _stage_states(lines), lines

  first, states, _ = run()
  assert states == {"baseline": "run", "ablation": "run", "report": "run"}
  table = pd.read_csv(out / "ablation.csv")
  # the same inputs: every part reused, the model not even loaded, the results the same
  real_load = tasks_mod.load_evaluation
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  again, states, lines = run()
  assert set(states.values()) == {"reused"} and again == first
  assert any("unablated accuracy" in line for line in lines)   # the results are still shown
  pd.testing.assert_frame_equal(pd.read_csv(out / "ablation.csv"), table)
  monkeypatch.setattr(tasks_mod, "load_evaluation", real_load)
  # the analysis's cluster types replaced behind the same path: the parts reading them rerun
  _analysis(ana, names=["vertical"] * 2 + ["dense"] * 6, model=model)
  _, states, _ = run()
  assert states == {"baseline": "reused", "ablation": "run", "report": "run"}
  assert list(pd.read_csv(out / "ablation.csv")["num_heads"]) == [0, 6, 2]
  # --redo one stage: it (and what reads it) reruns, the others are reused
  _, states, _ = run(redo="report")
  assert states == {"baseline": "reused", "ablation": "reused", "report": "run"}
  # a deleted output: its unit runs again and says which file (before: "done earlier,
  # reused" over nothing; issue 43 item 6)
  (out / "report.html").unlink()
  _, states, lines = run()
  assert states == {"baseline": "reused", "ablation": "reused", "report": "run"}
  assert any("report.html is missing; running it again" in line for line in lines)
  assert (out / "report.html").is_file()
  (out / "ablation.csv").unlink()
  _, states, _ = run()
  assert states == {"baseline": "reused", "ablation": "run", "report": "run"}
  # the model replaced by another behind the same path (its analysis too): everything reruns
  import shutil
  shutil.rmtree(model)
  _save_classifier(model, seed=3)
  _analysis(ana, names=["vertical"] * 2 + ["dense"] * 6, model=model)
  _, states, _ = run()
  assert set(states.values()) == {"run"}
  assert json.loads((out / runfiles.JOB_FILE).read_text())["kind"] == "ablation"


def test_a_second_process_on_the_directory_is_refused(tiny_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  out = tmp_path / "out"
  out.mkdir()
  import subprocess
  import sys
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    (out / runfiles.LOCK_FILE).write_text(json.dumps(
        {"pid": holder.pid, "host": socket.gethostname(), "started": "now", "what": "an ablation",
         "command": "heads-jax ablate", "pid_start": runfiles.process_start(holder.pid)}))
    with pytest.raises(UserError, match="is in use by an ablation"):
      run_ablation(_args(model=tiny_dir, data="mrpc", out=out, by="layer", max_length=32))
  finally:
    holder.kill()
    holder.wait()


def _classifier_dir(path, id2label, manifest="heads_jax.json"):
  path.mkdir(parents=True)
  (path / manifest).write_text(json.dumps({"format": "heads_jax", "id2label": id2label}))
  return path


def test_classifier_of_another_task_is_refused(tmp_path):
  # Before: `ablate` scored an SST-2 classifier on MRPC without a word (both have 2 labels).
  sst2 = _classifier_dir(tmp_path / "sst2", {"0": "negative", "1": "positive"})
  assert classifier_task(sst2) == (None, ("negative", "positive"))
  with pytest.raises(UserError, match="predicts the labels negative, positive, but mrpc's labels "
                                      "are not_equivalent, equivalent"):
    check_classifier_task(sst2, glue.task_info("mrpc"))
  check_classifier_task(sst2, glue.task_info("sst2"))  # its own task
  # a Hugging Face config.json; generic LABEL_i names say nothing
  hf = _classifier_dir(tmp_path / "hf", {"0": "LABEL_0", "1": "LABEL_1"}, "config.json")
  assert classifier_task(hf) == (None, None)
  check_classifier_task(hf, glue.task_info("mrpc"))
  # the fine-tuning run it was exported into says its task (QNLI and RTE share label names)
  run = tmp_path / "run"
  runfiles.claim_dir(run, "finetuning", flag="--workdir", task="qnli")
  best = _classifier_dir(run / "best_model", {"0": "entailment", "1": "not_entailment"})
  assert classifier_task(best) == ("qnli", ("entailment", "not_entailment"))
  with pytest.raises(UserError, match="was fine-tuned on qnli, but the data is rte"):
    check_classifier_task(best, glue.task_info("rte"))


def test_out_of_another_kind_or_a_file_is_refused_before_loading(tmp_path, monkeypatch):
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  analysis = tmp_path / "analysis"
  runfiles.claim_dir(analysis, "analysis")
  cfg = AblationConfig(model="m", data="mrpc", out=str(analysis), by="layer")
  with pytest.raises(UserError, match="is an analysis directory"):
    run_ablation(cfg)
  (tmp_path / "f").write_text("")
  with pytest.raises(UserError, match="is a file; give a directory"):
    run_ablation(AblationConfig(model="m", data="mrpc", out=str(tmp_path / "f"), by="layer"))
  assert not (tmp_path / "new").exists()


def test_cli_says_one_line(capsys, tmp_path):
  from heads_jax import cli
  code = cli.main(["ablate", "--model", str(tmp_path / "m"), "--data", "mrpc", "--out",
                   str(tmp_path / "o"), "--by", "role", "--analysis", str(tmp_path),
                   "--random-groups", "-1"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.splitlines() == [err] and "--random-groups -1" in err
  code = cli.main(["ablate", "--model", str(tmp_path / "m"), "--data", "mrpc", "--out",
                   str(tmp_path / "o"), "--cross", "intra", "--heads", "0:1", "--mode", "mean"])
  err = capsys.readouterr().err.strip()
  assert code == 2 and err.splitlines() == [err] and "--mode mean" in err
  assert not (tmp_path / "o").exists()


@pytest.mark.slow
@requires_shared("squad")
def test_squad_scores_are_shown_in_percent(tmp_path):
  # issue 33 and 43: one unit for accuracy/EM/F1 everywhere a person reads (percent, changes in
  # points, as the paper and Guan's rows print them); the files keep fractions
  from heads_jax.model.heads import BertForQuestionAnswering
  from tests.ablation.test_squad_ablation import SPEC
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  save_model(BertForQuestionAnswering(cfg, rngs=nnx.Rngs(0)), tmp_path / "qa", tok)
  lines = []
  res = run_ablation(AblationConfig(model=str(tmp_path / "qa"), data=SPEC, out=str(tmp_path / "o"),
                                    by="heads", heads="0:*", random_seeds=0, max_length=64,
                                    batch_size=8), log=lines.append)
  base = res["baseline"]
  text = "\n".join(lines)
  assert f"unablated exact_match {100 * base['exact_match']:.2f}%, f1 {100 * base['f1']:.2f}%" in text
  table = pd.read_csv(tmp_path / "o" / "ablation.csv")
  assert table["f1"].max() <= 1   # fractions in the file
  row = table.iloc[1]
  assert (f"exact_match {100 * row['exact_match']:.2f}% ({100 * row['exact_match_change']:+.2f} "
          "pts)") in text
  assert f"{100 * row['f1']:.2f}" in text and "f1 (%)" in text   # the console's table, in percent


def test_out_of_another_models_ablation_is_refused_before_loading(tmp_path, monkeypatch):
  # Before (issue 43 item 6): the first model's importance files stayed beside the second's.
  monkeypatch.setattr(tasks_mod, "load_evaluation", lambda config: pytest.fail("loaded the model"))
  out = tmp_path / "out"
  runfiles.claim_dir(out, "ablation", model=str(tmp_path / "model_a"), data="mrpc")
  cfg = AblationConfig(model=str(tmp_path / "model_b"), data="mrpc", out=str(out), by="layer")
  with pytest.raises(UserError, match="holds the ablation of .*model_a, not of --model"):
    run_ablation(cfg, log=lambda m: None)
