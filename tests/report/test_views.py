"""The interactive head view: choosing the example sequences (by hand), their maps (against
transformers' attention on the same sequences), the report section, and the page in a headless
Chromium (clicking a head shows its view, no console errors; skipped without a Chromium)."""

import json
import re

import numpy as np
import pytest

from heads_jax import contract
from heads_jax.report import views
from heads_jax.stats.examples import (DEFAULT_MAX_TOKENS, QUANTIZATION, HeadExamples, choose_examples, decode_map,
                                      encode_map, example_maps, examples_document,
                                      sequences_needed)
from tests.browser import Browser, find_chromium
from tests.helpers import REPO
from tests.report.test_report import make_clusters_df, make_scores, make_tests_df

NAN = np.nan


def test_choose_examples_by_hand():
  roles = ("local", "cls", "block")
  # 5 sequences, 1 layer, 2 heads
  bias = np.full((5, 1, 2, 3), NAN)
  bias[:, 0, 0, 0] = [4.0, 9.0, 1.0, 9.0, 5.0]   # local: 1 and 3 tie at 9 -> 1 first
  bias[:, 0, 0, 1] = [8.0, 7.0, 6.0, NAN, 2.0]   # cls: 0, 1 (taken), 2
  bias[:, 0, 1, 2] = [NAN, 3.0, NAN, 5.0, 4.0]   # head 1: no role; strongest is block
  assigned = np.zeros((1, 2, 3), bool)
  assigned[0, 0, :2] = True
  stat = np.array([[[1.0, 2.0, 0.5], [0.1, -2.0, 7.0]]])
  lengths = np.array([10, 10, 10, 10, 10])
  got = choose_examples(bias, roles, assigned, stat, lengths, per_head=4)
  assert got[0] == HeadExamples(0, 0, ("local", "cls"), True,
                                ((1, "local", 9.0), (0, "cls", 8.0), (3, "local", 9.0), (2, "cls", 6.0)))
  assert got[1] == HeadExamples(0, 1, ("block",), False,
                                ((3, "block", 5.0), (4, "block", 4.0), (1, "block", 3.0)))
  # Long sequences give way to short ones while any short one has a score.
  short = choose_examples(bias, roles, assigned, stat, np.array([10, 99, 10, 99, 10]), per_head=2,
                          max_tokens=64)
  assert [p[0] for p in short[0].picks] == [4, 0] and [p[0] for p in short[1].picks] == [4]
  assert sequences_needed(got) == {0: [(0, 0)], 1: [(0, 0), (0, 1)], 2: [(0, 0)], 3: [(0, 0), (0, 1)],
                                   4: [(0, 1)]}


def test_map_round_trip_within_half_a_step():
  a = np.random.default_rng(0).dirichlet(np.ones(7), size=7)
  back = decode_map(encode_map(a), 7)
  assert np.abs(back - a).max() <= 0.5 / QUANTIZATION + 1e-7
  with pytest.raises(ValueError, match="not 6 x 6"):
    decode_map(encode_map(a), 6)


def _document(layers=3, heads=4, n=6, seed=0):
  """examples.json of a synthetic run (random maps over random-length token lists)."""
  s = make_scores(n=n, layers=layers, heads=heads, seed=seed)
  tests = make_tests_df(s["sieve_bias"], s["roles"])
  index = {r: i for i, r in enumerate(s["roles"])}
  assigned = np.zeros((layers, heads, len(index)), bool)
  stat = np.zeros(assigned.shape)
  for row in tests.itertuples():
    assigned[row.layer, row.head, index[row.role]] = row.assigned
    stat[row.layer, row.head, index[row.role]] = row.statistic
  ex = choose_examples(s["sieve_bias"], s["roles"], assigned, stat, s["lengths"])
  rng = np.random.default_rng(seed)
  seqs = {}
  for seq, need in sequences_needed(ex).items():
    k = int(s["lengths"][seq])
    tokens = ["[CLS]"] + [f"w{i}</script>" if i == 1 else f"w{i}" for i in range(1, k - 1)] + ["[SEP]"]
    seqs[seq] = {"tokens": tokens, "segments": [0] * k,
                 "maps": {lh: rng.dirichlet(np.ones(k), size=k) for lh in need}}
  return examples_document(ex, seqs, per_head=3, max_tokens=DEFAULT_MAX_TOKENS, rule="calibrated"), s, tests


def test_section_embeds_the_document_safely(tmp_path):
  doc, s, tests = _document()
  section = views.head_view_section(doc, tests, make_clusters_df())
  html = section["html"]
  assert html.count('data-head="') == 2 * 3 * 4  # role grid + t-SNE
  payload = re.search(r'<script type="application/json" id="hv-data">(.*?)</script>', html, re.S).group(1)
  assert json.loads(payload) == json.loads(json.dumps(doc))
  assert "</script" not in payload and "w1</script>" in json.loads(payload)["sequences"][0]["tokens"][1]
  assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing loaded from elsewhere
  contract.write_examples(doc, tmp_path)
  assert contract.read_examples(tmp_path) == json.loads(json.dumps(doc))
  with pytest.raises(ValueError, match="not an examples document"):
    contract.write_examples({"heads": []}, tmp_path)


def test_example_maps_are_transformers_attention(tmp_path):
  """The second pass re-encodes the analysis's data and returns exactly the chosen sequences'
  maps: transformers' RobertaModel on the same sequences gives the same attention."""
  torch = pytest.importorskip("torch")
  from heads_jax import load_model
  from heads_jax.data.specs import encode_spec
  from tests.family_models import save_family_dir
  hf, _ = save_family_dir("roberta", tmp_path / "m", seed=4)
  model, tok = load_model(tmp_path / "m")
  specs = [f"conllu:{REPO / 'tests' / 'fixtures' / 'mini.conllu'}",
           f"tsv:{REPO / 'tests' / 'fixtures' / 'pairs.tsv'}:header"]
  need = {1: [(0, 2)], 3: [(1, 0), (0, 1)], 4: [(1, 3)]}  # 3 and 4: the pairs (3 sentences first)
  got = example_maps(model, tok, specs, need, max_length=48)
  assert sorted(got) == [1, 3, 4]
  for seq, spec, row in ((1, specs[0], 1), (3, specs[1], 0), (4, specs[1], 1)):
    _, batches, _ = encode_spec(spec, tok, max_length=48, batch_size=8, syntax=spec.startswith("conllu"))
    indices, batch = next(iter(batches))
    j = int(np.flatnonzero(indices == row)[0])
    n = int(batch["attention_mask"][j].sum())
    ids = batch["input_ids"][j:j + 1, :n]
    assert got[seq]["tokens"] == tok.convert_ids_to_tokens(ids[0].tolist())
    assert got[seq]["segments"] == batch["token_type_ids"][j, :n].tolist()
    with torch.no_grad():
      att = hf(input_ids=torch.tensor(ids, dtype=torch.long), output_attentions=True).attentions
    for l, h in need[seq]:
      np.testing.assert_allclose(got[seq]["maps"][(l, h)], att[l][0, h].numpy(), atol=1e-5)
  with pytest.raises(ValueError, match="not in the data"):
    example_maps(model, tok, specs, {40: [(0, 0)]}, max_length=48)
  with pytest.raises(ValueError, match="positions now"):
    example_maps(model, tok, specs, {0: [(0, 0)]}, max_length=48, lengths=np.full(5, 3))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  """A report directory built from synthetic contract files, with examples.json."""
  from heads_jax.report.analysis import build_analysis_report
  out = tmp_path_factory.mktemp("head_view")
  doc, s, tests = _document()
  contract.write_scores(out, s["sieve_bias"], s["roles"], s["distance"], s["lengths"])
  contract.write_tests(tests, {"tau": 3.0, "alpha": 0.05, "model": "synthetic"}, out)
  clusters = make_clusters_df()
  contract.write_clusters(clusters, {}, out)
  contract.write_examples(doc, out)
  return build_analysis_report(out), doc


@pytest.mark.slow
def test_report_has_the_head_view_and_svg_figures(report):
  page, doc = report
  html = page.read_text()
  assert views.SECTION_TITLE in html and 'id="hv-data"' in html
  pngs = sorted(p.stem for p in (page.parent / "figures").glob("*.png"))
  assert pngs and pngs == sorted(p.stem for p in (page.parent / "figures").glob("*.svg"))
  svg = (page.parent / "figures" / "role_grid.svg").read_text()
  assert svg.lstrip().startswith("<?xml") and "<svg" in svg


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium binary (CI installs it: .ci/run)")
def test_clicking_a_head_in_headless_chromium(report, tmp_path):
  page, doc = report
  head = next(h for h in doc["heads"] if len(h["examples"]) >= 2)
  key = f'{head["layer"]}:{head["head"]}'
  with Browser(find_chromium()) as b:
    b.open(page)
    assert b.problems() == []
    assert b.evaluate("document.querySelectorAll('#hv-view *').length") == 0
    b.click(f'.hv-grid [data-head="{key}"]')
    title = b.evaluate("document.getElementById('hv-title').textContent")
    assert title.startswith(f"Layer {head['layer']}, head {head['head']}:")
    first = head["examples"][0]
    n = len(doc["sequences"][first["sequence"]]["tokens"])
    a = decode_map(first["map"], n)
    assert b.evaluate("document.querySelectorAll('#hv-view line').length") == int((a >= 0.01).sum())
    b.hover('#hv-view text[data-i="1"]')
    assert "query 1" in b.evaluate("document.getElementById('hv-status').textContent")
    b.click("#hv-controls button:nth-of-type(2)")    # the second example
    b.click("#hv-controls button:last-of-type")       # heatmap
    assert b.evaluate("document.querySelectorAll('#hv-view rect').length") == \
        len(doc["sequences"][head["examples"][1]["sequence"]]["tokens"]) ** 2
    b.click(f'.hv-tsne [data-head="0:0"]')             # a point of the t-SNE
    assert b.evaluate("document.getElementById('hv-title').textContent").startswith("Layer 0, head 0:")
    assert b.evaluate("document.querySelectorAll('.hv-sel').length") == 2  # grid cell + point
    shot = b.screenshot(tmp_path / "view.png", selector="#hv")
    assert shot.stat().st_size > 5000
    assert b.problems() == []


def test_an_unchanged_choice_needs_no_forward_pass(report):
  """Re-running the host statistics with the same outcome keeps examples.json as it is."""
  from heads_jax.stats.examples import write_head_examples
  page, doc = report

  def loader():
    raise AssertionError("the model was loaded")
  path, computed = write_head_examples(page.parent, loader, None, [], max_length=64)
  assert not computed and contract.read_examples(page.parent) == json.loads(json.dumps(doc))
  with pytest.raises(AssertionError, match="the model was loaded"):
    write_head_examples(page.parent, loader, None, [], max_length=64, per_head=2)
