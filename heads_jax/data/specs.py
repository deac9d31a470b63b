"""Data spec strings -> datasets -> encoded batch streams (the analysis input entry point).

Accepted forms (`SPEC_FORMS`):

  conllu:FILE               CoNLL-U with gold dependency arcs (e.g. UD English EWT)
  glue:TASK[:SPLIT]         GLUE through TFDS (task mrpc, qqp, sst2, qnli; split default validation)
  glue-tsv:DIR/TASK[:SPLIT] GLUE TSV files in DIR/<task folder> (split default dev)
  tsv:FILE[:header]         TSV of sentences (1 column) or pairs (2 columns); ":header" skips line 1
  text:FILE                 plain text, one sentence per line
  squad:FILE[:v1|v2][:n=N][:seed=S]
                            SQuAD official JSON: question + context pairs (v1: answerable questions
                            only; default: the file's version); n=N: N questions drawn at random
                            with seed S (default 0), as Guan et al.'s 1,000 SQuAD samples
  squad-tfds:[v1.1|v2.0][:SPLIT][:n=N][:seed=S]
                            TFDS squad (default v1.1, split validation), sampled likewise
  ud-ewt | sst2 | mrpc      embedded data: UD EWT test, GLUE SST-2 dev, GLUE MRPC dev

Text inputs (everything except CoNLL-U) get dependency arcs from a spaCy parser when
``syntax=True``; CoNLL-U uses its gold arcs. ``syntax=False`` drops all arcs (no syntactic roles).
"""

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

from heads_jax.data import assets, conllu, glue, squad, text
from heads_jax.data import syntax as syn
from heads_jax.data.encoding import (DEFAULT_BUCKET_STEP, DEFAULT_MAX_LENGTH, AnalysisExample,
                                     Segment, iter_batches)

SPEC_FORMS = ("conllu:FILE", "glue:TASK[:SPLIT]", "glue-tsv:DIR/TASK[:SPLIT]", "tsv:FILE[:header]",
              "text:FILE", "squad:FILE[:v1|v2][:n=N][:seed=S]",
              "squad-tfds:[v1.1|v2.0][:SPLIT][:n=N][:seed=S]", "ud-ewt", "sst2", "mrpc")


def _bad(spec: str, why: str) -> ValueError:
  return ValueError(f"data spec {spec!r}: {why}; accepted forms: {', '.join(SPEC_FORMS)}")


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """A parsed spec. ``kind``: conllu, glue, glue-tsv, tsv or text; ``path`` a file or (glue-tsv)
  the GLUE root / task folder; ``task`` and ``split`` for GLUE; ``header`` for tsv."""
  spec: str
  kind: str
  path: Path | None = None
  task: str | None = None
  split: str | None = None
  header: bool = False
  version: str | None = None   # squad: "v1" / "v2" (None: the file's)
  sample: int | None = None    # squad: draw this many questions at random
  seed: int = 0


def _existing_file(spec, path) -> Path:
  path = Path(path).expanduser()
  if path.is_dir():
    raise _bad(spec, f"{path} is a directory; give a file")
  if not path.is_file():
    raise _bad(spec, f"file {path} does not exist")
  return path


def _split_suffix(body: str) -> tuple[str, str | None]:
  head, sep, tail = body.rpartition(":")
  if sep and head and re.fullmatch(r"[A-Za-z0-9_]+", tail):
    return head, tail
  return body, None


def parse_spec(spec: str) -> DataSpec:
  """Parses and checks a spec string (files must exist); one-line ValueError otherwise."""
  if not isinstance(spec, str) or not spec.strip():
    raise _bad(str(spec), "empty spec")
  spec = spec.strip()
  if spec == "ud-ewt":
    return DataSpec(spec, "conllu", assets.ud_ewt_test_path())
  if spec in ("sst2", "mrpc"):
    return DataSpec(spec, "glue-tsv", assets.glue_dir(), spec, "dev")
  if spec == "squad-tfds":
    return _squad_spec(spec, spec, "")
  kind, sep, body = spec.partition(":")
  if not sep or not body:
    raise _bad(spec, "unknown form")
  try:
    if kind == "conllu":
      return DataSpec(spec, "conllu", _existing_file(spec, body))
    if kind == "text":
      return DataSpec(spec, "text", _existing_file(spec, body))
    if kind == "tsv":
      header = body.endswith(":header")
      if header:
        body = body[: -len(":header")]
      return DataSpec(spec, "tsv", _existing_file(spec, body), header=header)
    if kind == "glue":
      task, _, split = body.partition(":")
      return DataSpec(spec, "glue", None, glue.task_info(task).name, split or "validation")
    if kind in ("squad", "squad-tfds"):
      return _squad_spec(spec, kind, body)
    if kind == "glue-tsv":
      body, split = _split_suffix(body)
      path = Path(body).expanduser()
      task = glue.task_info(path.name).name
      root = path if path.is_dir() else path.parent
      glue.tsv_path(root, task, split or "dev")  # checks the file exists
      return DataSpec(spec, "glue-tsv", root, task, split or "dev")
  except ValueError as e:
    if str(e).startswith("data spec"):
      raise
    raise _bad(spec, str(e)) from None
  except FileNotFoundError as e:
    raise _bad(spec, str(e).split(";")[0]) from None
  raise _bad(spec, f"unknown kind {kind!r}")


_SQUAD_VERSIONS = {"squad": ("v1", "v2", "v1.1", "v2.0", "1.1", "2.0"),
                   "squad-tfds": ("v1.1", "v2.0", "v1", "v2", "1.1", "2.0")}
_OPTION = re.compile(r"([A-Za-z_]+)=(.*)")
_VERSION_LIKE = re.compile(r"v?\d+(\.\d+)*")


def _squad_option(spec: str, part: str, opts: dict) -> None:
  """Reads ``n=N`` / ``seed=S`` into ``opts``; a bad value or another key is named."""
  key, value = _OPTION.fullmatch(part).groups()
  if key not in ("n", "seed"):
    raise _bad(spec, f"unknown option {part!r}: a SQuAD spec takes n=N (questions to sample) and "
                     f"seed=S (the sampling seed)")
  if key in opts:
    raise _bad(spec, f"{key}= is given twice")
  if not re.fullmatch(r"[+-]?\d+", value.strip()):
    raise _bad(spec, f"{part!r}: {key} must be a whole number, e.g. "
                     f"{'n=1000' if key == 'n' else 'seed=0'}")
  number = int(value)
  if key == "n" and number < 1:
    raise _bad(spec, f"{part!r}: n is the number of questions to sample and must be at least 1 "
                     f"(leave n= out to read every question)")
  if key == "seed" and number < 0:
    raise _bad(spec, f"{part!r}: seed must be 0 or more")
  opts[key] = number


def _squad_spec(spec: str, kind: str, body: str) -> DataSpec:
  """``squad:FILE[:v1|v2][:n=N][:seed=S]`` or ``squad-tfds:[v1.1|v2.0][:SPLIT][:n=N][:seed=S]``:
  options are read from the end (a file name may hold ``:``); a bad ``n=``, ``seed=``, version or
  unknown option is named, never taken for part of the file name."""
  parts = body.split(":") if body else []
  opts: dict = {}
  rest = list(parts)

  def version(part: str) -> bool:
    if not (part in _SQUAD_VERSIONS[kind] or _VERSION_LIKE.fullmatch(part)):
      return False
    if part not in _SQUAD_VERSIONS[kind]:
      raise _bad(spec, f"SQuAD version {part!r} is not one of "
                       f"{', '.join(_SQUAD_VERSIONS[kind][:2])}")
    if "version" in opts:
      raise _bad(spec, "the SQuAD version is given twice")
    opts["version"] = squad._version_of(part, "v1")
    return True

  first_option = 0 if kind == "squad-tfds" else 1  # squad: the first part is the file
  while len(rest) > first_option and (_OPTION.fullmatch(rest[-1]) or version(rest[-1])):
    if _OPTION.fullmatch(rest[-1]):
      _squad_option(spec, rest[-1], opts)
    rest.pop()
  if kind == "squad-tfds" and rest and version(rest[0]):  # [v1.1|v2.0] before the split
    rest.pop(0)
  if kind == "squad-tfds":
    if len(rest) > 1:
      raise _bad(spec, f"squad-tfds takes [v1.1|v2.0][:SPLIT][:n=N][:seed=S], not "
                       f"{':'.join(rest)!r}")
    return DataSpec(spec, kind, None, None, rest[0] if rest else "validation",
                    version=opts.get("version", "v1"), sample=opts.get("n"),
                    seed=opts.get("seed", 0))
  if not rest or not rest[0]:
    raise _bad(spec, "no SQuAD file given")
  return DataSpec(spec, kind, _existing_file(spec, ":".join(rest)), version=opts.get("version"),
                  sample=opts.get("n"), seed=opts.get("seed", 0))


@dataclasses.dataclass
class Dataset:
  """Loaded examples of a spec. ``examples``: `conllu.Sentence` (conllu), `glue.GlueExample`
  (glue, glue-tsv), `text.TextExample` (tsv, text) or `squad.SquadExample` (squad, squad-tfds:
  question and context as a pair). ``gold_arcs``: the data carries its own
  dependency parses; ``pairs``: examples are sentence pairs."""
  spec: DataSpec
  examples: list
  gold_arcs: bool
  pairs: bool
  name: str
  warnings: tuple[str, ...] = ()   # about the input itself (e.g. a TSV column of labels)

  @property
  def labels(self) -> list | None:
    if self.spec.kind in ("glue", "glue-tsv"):
      return [e.label for e in self.examples]
    return None

  def __len__(self) -> int:
    return len(self.examples)


def check_max_examples(max_examples) -> None:
  """``max_examples``: None (all) or a positive integer; a ValueError naming the flag otherwise."""
  if max_examples is not None and (isinstance(max_examples, bool) or not
                                   isinstance(max_examples, int) or max_examples < 1):
    raise ValueError(f"--max-examples must be a positive number of examples per data set, got "
                     f"{max_examples!r}; leave it out to read every example")


def load_spec(spec: str | DataSpec, max_examples: int | None = None) -> Dataset:
  """Reads the examples a spec names (at most ``max_examples``)."""
  ds = spec if isinstance(spec, DataSpec) else parse_spec(spec)
  check_max_examples(max_examples)
  if ds.kind == "conllu":
    examples = conllu.load_conllu(ds.path, max_examples)
    return Dataset(ds, examples, True, False, ds.spec)
  if ds.kind == "glue":
    examples = glue.load_glue_tfds(ds.task, ds.split, max_examples=max_examples)
    return Dataset(ds, examples, False, glue.TASKS[ds.task].is_pair, f"glue/{ds.task}:{ds.split}")
  if ds.kind == "glue-tsv":
    examples = glue.load_glue_tsv(ds.path, ds.task, ds.split, max_examples)
    return Dataset(ds, examples, False, glue.TASKS[ds.task].is_pair, f"{ds.task}:{ds.split}")
  if ds.kind in ("squad", "squad-tfds"):
    report: dict = {}
    if ds.kind == "squad":
      examples = squad.read_squad_json(ds.path, ds.version, report=report)
    else:
      examples = squad.read_squad_tfds(ds.version, ds.split)
    dropped = report.get("unanswerable_dropped", 0)
    warn = (f"{ds.spec}: read as v1: {dropped} of {dropped + len(examples)} questions "
            f"(unanswerable, SQuAD v2.0) left out; :v2 keeps them",) if dropped else ()
    examples = squad.sample_examples(examples, ds.sample, ds.seed)[:max_examples]
    return Dataset(ds, examples, False, True, ds.spec, warn)
  if ds.kind == "tsv":
    examples = text.load_tsv(ds.path, ds.header, max_examples)
    labels = text.label_column(examples)
    warn = () if labels is None else (
        f"{ds.spec}: the second column holds only {labels} (class labels?), not sentences; it "
        "is read as sentence B of a pair. For a GLUE file use glue-tsv:DIR/TASK; for single "
        "sentences keep only the first column",)
    return Dataset(ds, examples, False, any(e.text_b is not None for e in examples), ds.spec,
                   warn)
  if ds.kind == "text":
    examples = text.load_text(ds.path, max_examples)
    return Dataset(ds, examples, False, False, ds.spec)
  raise _bad(ds.spec, f"unknown kind {ds.kind!r}")


def parser_name(nlp) -> str:
  """A readable name of a spaCy pipeline or parser callable."""
  meta = getattr(nlp, "meta", None)
  if isinstance(meta, dict) and meta.get("name"):
    return f"{meta.get('lang', '')}_{meta['name']}".strip("_")
  return getattr(nlp, "__name__", type(nlp).__name__)


def analysis_examples(dataset: Dataset, nlp=None, syntax_on: bool = True,
                      parse_batch_size: int = 64) -> Iterator[AnalysisExample]:
  """The dataset's examples as `AnalysisExample`s, lazily (text is parsed as it is read).

  CoNLL-U: pre-split words with gold arcs (no arcs if ``syntax_on`` is False). Text: parsed
  by ``nlp`` (a callable, already resolved) if ``syntax_on``, else raw text without arcs.
  """
  if dataset.gold_arcs:
    for s in dataset.examples:
      yield AnalysisExample(Segment.from_sentence(s, arcs=syntax_on))
    return
  label_of = (lambda e: e.label) if dataset.spec.kind in ("glue", "glue-tsv") else (lambda e: None)
  if not syntax_on:
    for e in dataset.examples:
      b = None if e.text_b is None else Segment.from_text(e.text_b)
      yield AnalysisExample(Segment.from_text(e.text_a), b, label_of(e))
    return

  def texts():
    for e in dataset.examples:
      yield e.text_a
      if e.text_b is not None:
        yield e.text_b

  parses = syn.parse_texts(texts(), nlp, batch_size=parse_batch_size)
  for e in dataset.examples:
    a = Segment.from_parse(next(parses))
    b = None if e.text_b is None else Segment.from_parse(next(parses))
    yield AnalysisExample(a, b, label_of(e))


@dataclasses.dataclass(frozen=True)
class InputCounts:
  """What `input_counts` found in a dataset, before any batch: ``read`` examples; ``empty``
  ones (a segment with no wordpiece: dropped, they would be bare ``[CLS] [SEP]`` sequences);
  ``truncated`` ones (longer than ``max_length`` with the special tokens: cut); ``duplicates``
  (the same text as an earlier example: kept, counted)."""
  read: int
  empty: int = 0
  truncated: int = 0
  duplicates: int = 0

  def text(self, max_length: int) -> str:
    """One line for the log (only the counts that are not 0)."""
    parts = [f"{self.read} read"]
    if self.empty:
      parts.append(f"{self.empty} with no wordpiece dropped")
    if self.truncated:
      parts.append(f"{self.truncated} truncated to {max_length} wordpieces")
    if self.duplicates:
      parts.append(f"{self.duplicates} duplicate(s) of an earlier example (kept)")
    return ", ".join(parts)


def _segment_texts(dataset: Dataset):
  """Each example's segments as ``(text_a, text_b or None)`` (CoNLL-U: its words joined)."""
  if dataset.gold_arcs:
    return [(" ".join(s.forms), None) for s in dataset.examples]
  return [(e.text_a, e.text_b) for e in dataset.examples]


def input_counts(dataset: Dataset, tokenizer, max_length: int) -> tuple[Dataset, InputCounts]:
  """Counts the empty, truncated and duplicated examples of ``dataset`` (one tokenizer pass,
  no special tokens, no truncation) and drops the empty ones; returns ``(kept dataset,
  counts)``."""
  texts = _segment_texts(dataset)
  if not texts:
    return dataset, InputCounts(0)
  a = tokenizer([t[0] for t in texts], add_special_tokens=False, verbose=False)["input_ids"]
  b_idx = [i for i, t in enumerate(texts) if t[1] is not None]
  b = dict(zip(b_idx, tokenizer([texts[i][1] for i in b_idx], add_special_tokens=False,
                                verbose=False)["input_ids"] if b_idx else []))
  single, pair = (tokenizer.num_special_tokens_to_add(pair=False),
                  tokenizer.num_special_tokens_to_add(pair=True))
  keep, empty, truncated, duplicates, seen = [], 0, 0, 0, set()
  for i, ex in enumerate(dataset.examples):
    if not a[i] or (i in b and not b[i]):
      empty += 1
      continue
    total = len(a[i]) + (len(b[i]) + pair if i in b else single)
    truncated += total > max_length
    if texts[i] in seen:
      duplicates += 1
    seen.add(texts[i])
    keep.append(ex)
  kept = dataset if not empty else dataclasses.replace(dataset, examples=keep)
  return kept, InputCounts(len(texts), empty, int(truncated), duplicates)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What `encode_spec` read: the dataset, where its arcs come from (``"gold"``,
  ``"parser:<name>"`` or None), the encoding settings, and the `InputCounts`."""
  dataset: Dataset
  arcs: str | None
  max_length: int
  batch_size: int
  counts: InputCounts | None = None

  @property
  def num_examples(self) -> int:
    return len(self.dataset)

  @property
  def warnings(self) -> tuple[str, ...]:
    return self.dataset.warnings

  def settings(self) -> dict:
    """JSON-friendly description, for output files."""
    out = {"data": self.dataset.spec.spec, "data_name": self.dataset.name,
           "num_examples": self.num_examples, "pairs": self.dataset.pairs,
           "gold_arcs": self.dataset.gold_arcs, "arcs": self.arcs,
           "max_length": self.max_length}
    if self.counts is not None:
      out.update(num_read=self.counts.read, num_empty_dropped=self.counts.empty,
                 num_truncated=self.counts.truncated, num_duplicates=self.counts.duplicates)
    if self.warnings:
      out["warnings"] = list(self.warnings)
    return out


def encode_spec(spec: str, tokenizer, max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 32,
                max_examples: int | None = None, parser=None, syntax: bool = True,
                sort_window: int | None = None, bucket_step: int = DEFAULT_BUCKET_STEP,
                pad_to_batch_size: bool = False):
  """Reads a spec and returns ``(info, batches, n)``.

  ``batches`` yields ``(indices, batch)`` as `encoding.iter_batches` (lazy: text is parsed and
  encoded while iterating); ``n`` the number of examples kept (`input_counts`: examples with no
  wordpiece are dropped; ``info.counts`` holds what was read, dropped, truncated, duplicated). ``parser``: None (``en_core_web_sm``),
  a spaCy pipeline name, or a callable ``nlp(text) -> Doc``; it is loaded here, before any
  batch, so a missing pipeline fails at once (`syntax.MissingParserError`). ``syntax=False``
  skips parsing and drops all arcs.
  """
  dataset, counts = input_counts(load_spec(spec, max_examples), tokenizer, max_length)
  nlp, arcs = None, None
  if syntax:
    if dataset.gold_arcs:
      arcs = "gold"
    else:
      nlp = syn.resolve_parser(parser)
      arcs = f"parser:{parser_name(nlp)}"
  examples = analysis_examples(dataset, nlp, syntax)
  batches = iter_batches(examples, tokenizer, max_length=max_length, batch_size=batch_size,
                         sort_window=sort_window, bucket_step=bucket_step,
                         pad_to_batch_size=pad_to_batch_size)
  return DatasetInfo(dataset, arcs, max_length, batch_size, counts), batches, len(dataset)

