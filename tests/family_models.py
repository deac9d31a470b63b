"""Tiny random-weight Hugging Face models of every family, saved with a tokenizer (test helper).

``save_family_dir(family, path)`` builds a transformers model of ``family`` (PyTorch, random
weights, biases and LayerNorm parameters moved off their initial values so that a swapped
parameter cannot go unnoticed), and a tokenizer of the family's kind, trained here on a few
hundred sentences of the embedded UD English EWT test text (nothing downloads):

* ``bert``, ``distilbert``, ``electra``: WordPiece (``vocab.txt``), lower-cased;
* ``roberta``: byte-level BPE (``tokenizers.ByteLevelBPETokenizer``);
* ``xlm-roberta``, ``albert``: SentencePiece Unigram (``tokenizers.SentencePieceUnigramTokenizer``);
* ``modernbert``: byte-level BPE with ``[CLS] A [SEP] B [SEP]`` templates in ``tokenizer.json``, a
  ``PreTrainedTokenizerFast`` as answerdotai/ModernBERT-base ships it.

Both are written with ``save_pretrained``, as a model downloaded from the hub would be.
"""

from __future__ import annotations

import functools

import numpy as np

from heads_jax.data.assets import ud_ewt_test_path

FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert")
HF_CLASS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta",
            "distilbert": "DistilBert", "electra": "Electra", "albert": "Albert",
            "modernbert": "ModernBert"}
# ModernBERT's special tokens in its own order (answerdotai/ModernBERT-base: the OLMo vocabulary's
# "|||IP_ADDRESS|||", "<|padding|>" first; [CLS]/[SEP]/[PAD]/[MASK] added).
MODERNBERT_SPECIALS = ["|||IP_ADDRESS|||", "<|padding|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]

_PROBE = "the of and to in is was that it for on with as he be at by this had not are but from"


@functools.lru_cache(maxsize=1)
def corpus(n: int = 600) -> tuple[str, ...]:
  """The first ``n`` sentence texts of the embedded UD EWT test file, plus a probe line."""
  out = [_PROBE]
  with open(ud_ewt_test_path(), encoding="utf-8") as f:
    for line in f:
      if line.startswith("# text = "):
        out.append(line[len("# text = "):].rstrip("\n"))
        if len(out) > n:
          break
  return tuple(out)


@functools.lru_cache(maxsize=None)
def build_tokenizer(family: str):
  """A transformers tokenizer of the family's kind, trained on ``corpus()`` (cached: do not
  modify it)."""
  import transformers
  from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
  text = list(corpus())
  if family in ("bert", "distilbert", "electra"):
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(text, vocab_size=700, min_frequency=1,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    vocab = sorted(wp.get_vocab().items(), key=lambda kv: kv[1])
    cls = getattr(transformers, f"{HF_CLASS[family]}Tokenizer")
    return cls(vocab={t: i for t, i in vocab}, do_lower_case=True)
  if family == "modernbert":
    from tokenizers import processors
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=700, min_frequency=1, special_tokens=MODERNBERT_SPECIALS)
    backend = bpe._tokenizer
    vocab = backend.get_vocab()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        unk_token="[UNK]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])
  if family == "roberta":
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=700, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    model = __import__("json").loads(bpe._tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return transformers.RobertaTokenizer(vocab=model["vocab"], merges=merges)
  specials = {"xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>"],
              "albert": ["<pad>", "<unk>", "[CLS]", "[SEP]"]}[family]
  mask = {"xlm-roberta": "<mask>", "albert": "[MASK]"}[family]
  sp = SentencePieceUnigramTokenizer()
  sp.train_from_iterator([t.lower() if family == "albert" else t for t in text], vocab_size=600,
                         special_tokens=specials + [mask], unk_token="<unk>")
  pieces = __import__("json").loads(sp._tokenizer.to_str())["model"]["vocab"]
  vocab = [(p, float(s)) for p, s in pieces]
  if family == "xlm-roberta":
    return transformers.XLMRobertaTokenizer(vocab=vocab)
  return transformers.AlbertTokenizer(vocab=vocab, do_lower_case=True)


def hf_config(family: str, vocab_size: int, **overrides):
  """A tiny transformers config of ``family`` (2 layers x 4 heads, hidden 32; ALBERT 4 applied
  layers in 2 groups; ELECTRA and ALBERT with embedding size 16), eager attention."""
  import transformers
  common = dict(vocab_size=vocab_size, max_position_embeddings=64, attn_implementation="eager")
  if family == "modernbert":
    # 4 layers (global, local, local, global), a window of 8 (|i - j| <= 4), norms with biases
    # off as ModernBERT's; the special ids of MODERNBERT_SPECIALS.
    kw = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
              local_attention=8, global_attn_every_n_layers=3, global_rope_theta=160000.0,
              local_rope_theta=10000.0, pad_token_id=5, cls_token_id=3, sep_token_id=4,
              bos_token_id=3, eos_token_id=4, **common)
    kw.update(overrides)
    return transformers.ModernBertConfig(**kw)
  if family == "distilbert":
    kw = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, pad_token_id=0, **common)
  else:
    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              **common)
    if family in ("roberta", "xlm-roberta"):
      kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
                max_position_embeddings=66, layer_norm_eps=1e-5)
    elif family == "electra":
      kw.update(embedding_size=16)
    elif family == "albert":
      kw.update(embedding_size=16, num_hidden_layers=4, num_hidden_groups=2, inner_group_num=1,
                pad_token_id=0)
  kw.update(overrides)
  return getattr(transformers, f"{HF_CLASS[family]}Config")(**kw)


def build_hf_model(family: str, vocab_size: int, *, task: str = "Model", seed: int = 0,
                   num_labels: int = 2, **overrides):
  """A random transformers model ``{HfClass}{task}`` (``task``: ``"Model"``,
  ``"ForSequenceClassification"``, ``"ForMaskedLM"``, ...), in eval mode."""
  import torch
  import transformers
  torch.manual_seed(seed)
  cfg = hf_config(family, vocab_size, **overrides)
  if task == "ForSequenceClassification":
    cfg.num_labels = num_labels
  model = getattr(transformers, f"{HF_CLASS[family]}{task}")(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def save_family_dir(family: str, path, *, task: str = "Model", seed: int = 0, tokenizer=None,
                    **overrides):
  """Writes a random ``family`` model and its tokenizer to ``path`` (``save_pretrained``);
  returns ``(hf_model, tokenizer)``."""
  tokenizer = tokenizer or build_tokenizer(family)
  model = build_hf_model(family, len(tokenizer), task=task, seed=seed, **overrides)
  model.save_pretrained(path)
  tokenizer.save_pretrained(path)
  return model, tokenizer


def random_inputs(rng: np.random.Generator, b: int, k: int, vocab: int, pad_id: int = 0):
  """Random ids (>= 5, clear of the special tokens) with right padding ``pad_id`` on some rows:
  ``(input_ids, attention_mask, segments)``; segments: 1 on the second half of each row."""
  lengths = rng.integers(3, k + 1, size=b)
  lengths[0] = k
  mask = (np.arange(k)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(5, vocab, size=(b, k)), pad_id).astype(np.int32)
  segments = ((np.arange(k)[None] >= (lengths // 2)[:, None]) & (mask > 0)).astype(np.int32)
  return ids, mask, segments
