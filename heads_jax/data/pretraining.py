"""BERT pre-training examples (masked LM + next-sentence prediction), streamed and deterministic.

Each example follows google-research/bert ``create_pretraining_data.py``:

* a target length of ``max_seq_length - 3`` wordpieces, or with probability
  ``short_seq_prob`` (0.1) a random length in ``[2, max_seq_length - 3]``;
* a chunk of consecutive sentences of one document, accumulated until it reaches the target
  length (or the document ends); segment A is its first ``a_end`` sentences (``a_end`` random
  in ``[1, len(chunk) - 1]``);
* segment B is the rest of the chunk, or with probability ``random_next_prob`` (0.5, and always
  when the chunk is a single sentence) sentences from a random place in *another* document
  (another book for the ``paragraphs`` layout), label ``next_sentence_label = 1``;
* the pair is truncated to ``max_seq_length - 3`` by removing wordpieces from the front or back
  (at random) of the longer segment, then laid out as ``[CLS] A [SEP] B [SEP]``;
* ``min(max_predictions, max(1, round(n * masked_lm_prob)))`` positions (n = the sequence's
  length *including* its three special tokens, as the recipe) chosen at random among the
  non-special positions (whole words when ``whole_word_mask``); each chosen position becomes
  ``[MASK]`` with probability 0.8, a random vocabulary id with probability 0.1 (any id, as the
  recipe) and stays unchanged with probability 0.1.

Where this differs from the recipe, on purpose: the recipe walks every document in order,
writes all instances (``dupe_factor`` differently masked copies) to disk and shuffles them in
memory. Here example ``i`` is a pure function of ``(seed, i)``: it draws a document with
probability proportional to its length, a random place in it, and builds the chunk from the first
sentence that starts after that place. So examples are i.i.d. draws (no shuffle buffer is
needed), nothing is held in memory but a small index of document byte offsets, batch ``N`` of
the stream is ``examples[N * B : (N + 1) * B]`` (a run resumed at step N sees exactly the
batches an uninterrupted run would), and each host process builds only its own rows of the
global batch (``process_index`` / ``process_count`` passed in).

Sentences come from ``heads_jax.data.sentences``, documents from a corpus of
``heads_jax.data.corpora``, and ``PretrainingExamples.batches`` builds batches ahead with
``heads_jax.data.prefetch``.

Batches are numpy dicts: ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[b, q]``;
``masked_positions``, ``masked_ids`` int32 and ``masked_weights`` float32 ``[b, p]``
(p = ``max_predictions``; padding slots have position 0, id 0, weight 0);
``next_sentence_label`` int32 ``[b]`` (0 = B follows A, 1 = B is random).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterator, Sequence

import numpy as np

from heads_jax.data.prefetch import prefetch as prefetch_batches
from heads_jax.data.sentences import chop_sentence, split_sentences


@dataclasses.dataclass(frozen=True)
class PretrainingSpec:
  """The recipe's parameters (defaults: sequence length 128, 20 predictions)."""
  max_seq_length: int = 128          # tokens, [CLS] and both [SEP]s included
  max_predictions: int = 20          # masked positions at most (p of the batches)
  masked_lm_prob: float = 0.15       # share of a sequence's tokens masked
  short_seq_prob: float = 0.1        # chance of a random, shorter target length
  random_next_prob: float = 0.5      # chance segment B comes from another document
  whole_word_mask: bool = False      # mask every wordpiece of a chosen word

  def __post_init__(self):
    if self.max_seq_length < 5:
      raise ValueError(f"max_seq_length must be at least 5, got {self.max_seq_length}")
    if not 0 < self.max_predictions <= self.max_seq_length:
      raise ValueError(f"max_predictions must be in [1, max_seq_length], got {self.max_predictions}")


class PretrainingExamples:
  """Example ``i`` (an int) of the stream defined by ``(corpus, tokenizer, spec, seed)``.

  Args:
    corpus: a corpus of ``heads_jax.data.corpora`` (or anything with their methods).
    tokenizer: a ``transformers.BertTokenizerFast`` (``heads_jax.data.tokenizer.load_tokenizer``).
    spec: ``PretrainingSpec``.
    seed: non-negative int; example ``i`` uses ``np.random.default_rng([seed, i])``.
  """

  def __init__(self, corpus, tokenizer, spec: PretrainingSpec = PretrainingSpec(), seed: int = 0):
    if seed < 0:
      raise ValueError(f"seed must be >= 0, got {seed}")
    self.corpus, self.tokenizer, self.spec, self.seed = corpus, tokenizer, spec, int(seed)
    self.cls_id = tokenizer.cls_token_id
    self.sep_id = tokenizer.sep_token_id
    self.mask_id = tokenizer.mask_token_id
    self.pad_id = tokenizer.pad_token_id or 0
    self.vocab_size = int(tokenizer.vocab_size)
    self._max_sentence_chars = 10 * spec.max_seq_length
    self._is_subword = None
    if spec.whole_word_mask:
      tokens = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
      self._is_subword = np.array([t.startswith("##") for t in tokens])

  # -- tokenised sentences at a random place of a document ---------------------------------------

  def _tokenize(self, sentences: list[str]) -> list[list[int]]:
    if not sentences:
      return []
    return self.tokenizer(sentences, add_special_tokens=False)["input_ids"]

  def _sentences_at(self, doc: int, rng: np.random.Generator, min_tokens: int) -> list[list[int]]:
    """Tokenised consecutive sentences of ``doc`` from the first sentence that starts after a
    random byte, accumulated until they hold ``min_tokens`` wordpieces or the document ends."""
    n = self.corpus.length(doc)
    if n <= 0:
      return []
    for attempt in range(8):
      start = int(rng.integers(0, n)) if attempt < 7 else 0
      window = 256 + 8 * min_tokens
      while True:
        text, at_end = self.corpus.read(doc, start, start + window)
        sentences = [piece for p in self.corpus.paragraphs_of(doc, text) for s in split_sentences(p)
                     for piece in chop_sentence(s, self._max_sentence_chars)]
        if start > 0:
          sentences = sentences[1:]  # the first one is (most likely) cut
        if not at_end:
          sentences = sentences[:-1]  # so is the last one
        # Tokenise a few sentences at a time (most of the window is not needed): the same
        # wordpieces as tokenising the whole window, at a fraction of the cost.
        total, chunk, i, group = 0, [], 0, 4
        while i < len(sentences):
          for t in self._tokenize(sentences[i:i + group]):
            if not t:
              continue
            chunk.append(t)
            total += len(t)
            if total >= min_tokens:
              return chunk
          i += group
          group *= 2
        if at_end or window >= 64 * (256 + 8 * min_tokens):
          if chunk:
            return chunk
          break  # no complete sentence after `start`: draw another place
        window *= 2
    return []

  # -- one example ---------------------------------------------------------------------------------

  def example(self, index: int) -> dict:
    """Example ``index``: unpadded ``tokens``/``segment_ids`` lists, masked predictions and label."""
    spec = self.spec
    rng = np.random.default_rng([self.seed, int(index)])
    max_num_tokens = spec.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < spec.short_seq_prob:
      target = int(rng.integers(2, max_num_tokens + 1))
    chunk = []
    for _ in range(100):
      doc = self.corpus.sample_document(rng)
      chunk = self._sentences_at(doc, rng, target)
      if chunk:
        break
    if not chunk:
      raise ValueError("the corpus yields no sentences: is it empty or not text?")
    a_end = 1 if len(chunk) < 2 else int(rng.integers(1, len(chunk)))
    tokens_a = [t for s in chunk[:a_end] for t in s]
    if len(chunk) == 1 or rng.random() < spec.random_next_prob:
      is_random_next = True
      target_b = max(1, target - len(tokens_a))
      group = self.corpus.group(doc)
      tokens_b = []
      for _ in range(100):
        other = doc
        for _ in range(10):  # as the recipe: up to 10 tries to find another document
          other = self.corpus.sample_document(rng)
          if self.corpus.group(other) != group:
            break
        tokens_b = [t for s in self._sentences_at(other, rng, target_b) for t in s]
        if tokens_b:
          break
    else:
      is_random_next = False
      tokens_b = [t for s in chunk[a_end:] for t in s]
    _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
    tokens = [self.cls_id] + tokens_a + [self.sep_id] + tokens_b + [self.sep_id]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    tokens, positions, labels = self._mask(tokens, rng)
    return {"tokens": tokens, "segment_ids": segment_ids, "masked_positions": positions,
            "masked_ids": labels, "next_sentence_label": int(is_random_next)}

  def _mask(self, tokens: list[int], rng: np.random.Generator):
    """The recipe's ``create_masked_lm_predictions``: returns (tokens, positions, original ids)."""
    spec = self.spec
    candidates = []
    for i, t in enumerate(tokens):
      if t in (self.cls_id, self.sep_id):
        continue
      if spec.whole_word_mask and candidates and candidates[-1][-1] == i - 1 and self._is_subword[t]:
        candidates[-1].append(i)  # (a "##" piece right after [CLS]/[SEP] starts its own word)
      else:
        candidates.append([i])
    order = rng.permutation(len(candidates))
    num_to_predict = min(spec.max_predictions, max(1, int(round(len(tokens) * spec.masked_lm_prob))))
    output = list(tokens)
    chosen = []
    for c in order:
      word = candidates[c]
      if len(chosen) >= num_to_predict:
        break
      if len(chosen) + len(word) > num_to_predict:
        continue
      for i in word:
        if rng.random() < 0.8:
          output[i] = self.mask_id
        elif rng.random() < 0.5:
          output[i] = tokens[i]
        else:
          output[i] = int(rng.integers(0, self.vocab_size))
        chosen.append(i)
    chosen.sort()
    return output, chosen, [tokens[i] for i in chosen]

  def unigram_entropy(self, num_examples: int = 2048) -> float:
    """The unigram baseline of the MLM loss, in nats per wordpiece.

    Entropy of the wordpiece frequencies over examples ``0 .. num_examples - 1`` (masked
    positions restored to their original wordpieces; [CLS], [SEP] and padding left out): the
    loss of a model that predicts every masked wordpiece from its corpus frequency alone,
    without context. A pre-trained model's held-out MLM loss must fall below it. Estimated
    from a sample (plug-in); its downward bias is about (types seen) / (2 x tokens counted),
    0.01 nats for 2,048 examples of 128 wordpieces.
    """
    if num_examples < 1:
      raise ValueError("num_examples must be at least 1")
    counts = np.zeros(self.vocab_size, np.int64)
    for i in range(num_examples):
      ex = self.example(i)
      tokens = np.asarray(ex["tokens"], np.int64)
      if len(ex["masked_positions"]):
        tokens[np.asarray(ex["masked_positions"])] = ex["masked_ids"]
      tokens = tokens[(tokens != self.cls_id) & (tokens != self.sep_id) & (tokens != self.pad_id)]
      counts += np.bincount(tokens, minlength=self.vocab_size)[:self.vocab_size]
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())

  # -- batches -------------------------------------------------------------------------------------

  def batch(self, step: int, batch_size: int, process_index: int = 0, process_count: int = 1) -> dict:
    """This process's rows of global batch ``step`` (examples ``step * batch_size + row``).

    ``batch_size`` is the global batch size; it must be divisible by ``process_count``; process
    ``p`` gets rows ``[p * B / P, (p + 1) * B / P)``.
    """
    if batch_size % process_count:
      raise ValueError(f"global batch size {batch_size} is not divisible by the number of host "
                       f"processes {process_count}")
    local = batch_size // process_count
    first = int(step) * batch_size + process_index * local
    return self.collate([self.example(first + r) for r in range(local)])

  def collate(self, examples: Sequence[dict]) -> dict:
    """Pads examples into the batch dict of the module docstring."""
    b, q, p = len(examples), self.spec.max_seq_length, self.spec.max_predictions
    out = {
        "input_ids": np.full((b, q), self.pad_id, np.int32),
        "attention_mask": np.zeros((b, q), np.int32),
        "token_type_ids": np.zeros((b, q), np.int32),
        "masked_positions": np.zeros((b, p), np.int32),
        "masked_ids": np.zeros((b, p), np.int32),
        "masked_weights": np.zeros((b, p), np.float32),
        "next_sentence_label": np.zeros((b,), np.int32),
    }
    for r, ex in enumerate(examples):
      n, m = len(ex["tokens"]), len(ex["masked_positions"])
      out["input_ids"][r, :n] = ex["tokens"]
      out["attention_mask"][r, :n] = 1
      out["token_type_ids"][r, :n] = ex["segment_ids"]
      out["masked_positions"][r, :m] = ex["masked_positions"]
      out["masked_ids"][r, :m] = ex["masked_ids"]
      out["masked_weights"][r, :m] = 1.0
      out["next_sentence_label"][r] = ex["next_sentence_label"]
    return out

  def batches(self, start_step: int, batch_size: int, *, process_index: int = 0,
              process_count: int = 1, prefetch: int = 2, num_workers: int = 0,
              num_steps: int | None = None) -> Iterator[dict]:
    """Batches ``start_step, start_step + 1, ...`` (endless unless ``num_steps``), built ahead.

    ``num_workers > 0`` builds batches in that many spawned processes (the tokenizer and the
    corpus are pickled to them); 0 uses one background thread. Either way the order and the
    contents are the same.
    """
    batch_fn = functools.partial(self.batch, batch_size=batch_size, process_index=process_index,
                                 process_count=process_count)
    return prefetch_batches(batch_fn, start_step, num_steps=num_steps, depth=prefetch,
                            num_workers=num_workers)


def _truncate_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng) -> None:
  """The recipe's ``truncate_seq_pair``: trims the longer list from a random end, in place."""
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng.random() < 0.5:
      del trunc[0]
    else:
      trunc.pop()
