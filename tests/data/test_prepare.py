"""The pre-training corpus: `heads-jax prepare-corpus` on a Wikipedia-format Parquet sample the
test writes and on the embedded (and shared) Gutenberg books; resumable; held-out documents never
in a training shard; the stream reads it; the held-out split of plain text sources."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from heads_jax import cli
from heads_jax.data.assets import gutenberg_paths
from heads_jax.data.corpora import (PreparedCorpus, TextCorpus, TfdsCorpus, heldout_unit,
                                    make_corpus)
from heads_jax.data.prepare import prepare_corpus
from heads_jax.data.pretraining import PretrainingExamples, PretrainingSpec
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from tests.helpers import SHARED, requires_shared



def _wiki_parquet(path, first_id: int, n: int):
  """A Parquet file laid out as Hugging Face wikimedia/wikipedia (id, url, title, text)."""
  rows = {"id": [], "url": [], "title": [], "text": []}
  for i in range(first_id, first_id + n):
    rows["id"].append(str(i))
    rows["url"].append(f"https://en.wikipedia.org/wiki?curid={i}")
    rows["title"].append(f"Topic {i}")
    rows["text"].append(f"Topic {i} is a subject numbered {i}. It has a history.\n\n"
                        f"History\n\nThe history of topic {i} began long ago. Many events "
                        f"followed; some were odd.\n" if i % 17 else "")  # some articles empty
  pq.write_table(pa.table(rows), path)


def _docs(corpus) -> list[str]:
  return [corpus.read(d, 0, corpus.length(d))[0] for d in range(len(corpus))]


def test_prepare_wikipedia_and_books_resumable_and_disjoint(tmp_path, capsys):
  wiki = tmp_path / "wiki"
  wiki.mkdir()
  _wiki_parquet(wiki / "train-00000-of-00002.parquet", 1, 300)
  _wiki_parquet(wiki / "train-00001-of-00002.parquet", 301, 300)
  out = tmp_path / "corpus"
  books = [str(p) for p in gutenberg_paths()]
  more = tmp_path / "more"  # a folder of books (two of them) beside a single book file
  more.mkdir()
  for b in books[1:]:
    (more / os.path.basename(b)).write_bytes(open(b, "rb").read())
  text_inputs = [books[0], str(more)]
  argv = ["prepare-corpus", "--out", str(out), "--wikipedia", str(wiki), "--text", books[0],
          "--text", str(more), "--heldout-fraction", "0.05", "--no-progress"]
  assert cli.main(argv) == 0
  assert "done:" in capsys.readouterr().out
  manifest = json.loads((out / "corpus.json").read_text())
  expected_articles = sum(1 for i in range(1, 601) if i % 17)
  train, held = PreparedCorpus(out, "train"), PreparedCorpus(out, "eval")
  texts_train, texts_eval = _docs(train), _docs(held)
  # every non-empty article once, on exactly one side; the held-out ones by the hash rule
  titles = lambda texts: [t.split(" is a subject")[0] for t in texts if t.startswith("Topic ")]
  seen_train, seen_eval = titles(texts_train), titles(texts_eval)
  assert len(seen_train) + len(seen_eval) == expected_articles
  assert not set(seen_train) & set(seen_eval)
  ids = [i for i in range(1, 601) if i % 17]
  want_eval = {f"Topic {i}" for i, h in zip(ids, heldout_unit([f"wikipedia:{i}" for i in ids],
                                                               0.05, at_least_one=False)) if h}
  assert set(seen_eval) == want_eval and 10 <= len(want_eval) <= 50
  # documents: one paragraph per line, the byte ranges exact
  first = next(t for t in texts_train if t.startswith("Topic "))
  assert first.split("\n")[1] == "History" and not first.endswith("\n\n")
  # the books: all their text on one side or the other, none lost, parts grouped by book
  book_text = "".join(t for t in texts_train + texts_eval if not t.startswith("Topic "))
  words = lambda s: len(s.split())
  assert words(book_text) == sum(words(open(b, encoding="utf-8").read()) for b in books)
  assert manifest["splits"]["eval"]["documents"] == len(held)
  book_groups = {train.group(d) for d in range(len(train)) if not texts_train[d].startswith("Topic ")}
  assert len(book_groups) == 3  # one group per book, whatever its parts
  # a second run resumes: nothing to do, the same index
  before = (out / "index-train.npz").read_bytes()
  logs = []
  prepare_corpus(out, wikipedia=[str(wiki)], text=text_inputs,
                 heldout_fraction=0.05, progress=False, log=logs.append)
  assert logs and "4 of 4 inputs already prepared" in logs[0]
  assert (out / "index-train.npz").read_bytes() == before
  # an interrupted run (one unit's marker missing) redoes that unit only, with the same result
  marker = next((out / "parts").glob("wiki-train-00001*.json"))
  marker.unlink()
  prepare_corpus(out, wikipedia=[str(wiki)], text=text_inputs,
                 heldout_fraction=0.05, progress=False, log=logs.append)
  assert "3 of 4 inputs already prepared" in logs[-1]
  assert _docs(PreparedCorpus(out, "train")) == texts_train
  with pytest.raises(UserError, match="other settings"):
    prepare_corpus(out, wikipedia=[str(wiki)], heldout_fraction=0.1, progress=False)
  # the pre-training stream reads it, through make_corpus, on each side
  tok = load_tokenizer()
  spec = PretrainingSpec(max_seq_length=32, max_predictions=5)
  for side in ("train", "eval"):
    corpus = make_corpus(str(out), side=side)
    assert isinstance(corpus, PreparedCorpus) and corpus.use == side
    batch = PretrainingExamples(corpus, tok, spec, seed=0).batch(0, 8)
    assert batch["attention_mask"].sum(1).min() > 5


def test_prepare_errors(tmp_path):
  assert cli.main(["prepare-corpus", "--out", str(tmp_path / "c")]) == 2
  assert cli.main(["prepare-corpus", "--out", str(tmp_path / "c"), "--wikipedia",
                   str(tmp_path / "missing")]) == 2
  bad = tmp_path / "bad.parquet"
  pq.write_table(pa.table({"title": ["x"]}), bad)
  with pytest.raises(UserError, match="'id' and 'text'"):
    prepare_corpus(tmp_path / "c2", wikipedia=[str(bad)], progress=False)


def test_heldout_split_of_plain_text_sources_is_disjoint_and_complete():
  books = gutenberg_paths()
  full = TextCorpus(books)
  train = TextCorpus(books, use="train", heldout_fraction=0.3)
  held = TextCorpus(books, use="eval", heldout_fraction=0.3)
  assert len(held) >= 1 and len(train) >= 1
  spans = lambda c: {(int(f), int(s), int(e)) for f, s, e in zip(c.file, c.start, c.end)}
  assert not spans(train) & spans(held)
  # together they cover every byte of every book exactly once
  assert train.estimated_chars() + held.estimated_chars() == full.estimated_chars()
  for f in range(len(books)):
    ranges = sorted((s, e) for ff, s, e in spans(train) | spans(held) if ff == f)
    assert ranges[0][0] == 0 and ranges[-1][1] == os.path.getsize(books[f])
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
  # parts of one book share its group; the choice depends only on the keys
  assert {train.group(d) for d in range(len(train))} <= {0, 1, 2}
  assert heldout_unit(["a", "b", "c"], 0.0).sum() == 0
  assert heldout_unit(["a", "b", "c"], 1e-9).sum() == 1  # at least one held out
  assert list(heldout_unit(["x", "y"], 0.5)) == list(heldout_unit(["x", "y"], 0.5))


def test_pretraining_never_trains_on_the_evaluation_text(tmp_path):
  """The default held-out evaluation reads documents the training stream never reads."""
  from heads_jax.training import configlib, pretrain
  c = configlib.load_config("configs/pretrain.py:tiny")
  tok = load_tokenizer()
  train = pretrain.build_examples(c, tok)
  held = pretrain.build_examples(c, tok, eval_split=True)
  assert train.corpus.use == "train" and held.corpus.use == "eval"
  span = lambda corpus: {(int(f), int(s), int(e)) for f, s, e in
                         zip(corpus.file, corpus.start, corpus.end)}
  assert not span(train.corpus) & span(held.corpus)
  # explicit eval_sources: the training stream keeps every document of data.sources
  c.data.eval_sources = str(gutenberg_paths()[0])
  assert pretrain.build_examples(c, tok).corpus.use == "all"


def test_tfds_sources_split_by_document():
  docs = [{"text": f"Doc {i}. A sentence here.\nAnother line."} for i in range(400)]
  train = TfdsCorpus("wikipedia/x", source=docs, use="train", heldout_fraction=0.1)
  held = TfdsCorpus("wikipedia/x", source=docs, use="eval", heldout_fraction=0.1)
  rng = np.random.default_rng(0)
  a = {train.sample_document(rng) for _ in range(300)}
  b = {held.sample_document(rng) for _ in range(300)}
  assert a and b and not a & b
  assert all(held.on_side(d) and not train.on_side(d) for d in b)


@requires_shared("corpus", "gutenberg")
def test_prepare_the_shared_gutenberg_subset(tmp_path):
  src = SHARED / "corpus" / "gutenberg"
  n = len(list(src.glob("*.txt")))
  m = prepare_corpus(tmp_path / "g", text=[str(src)], progress=False)
  assert m["splits"]["eval"]["documents"] >= 1 and m["splits"]["train"]["documents"] > n
  total = m["splits"]["train"]["bytes"] + m["splits"]["eval"]["bytes"]
  assert total > 0.9 * sum(p.stat().st_size for p in src.glob("*.txt"))
  train = PreparedCorpus(tmp_path / "g", "train")
  assert len({train.group(d) for d in range(len(train))}) <= n
