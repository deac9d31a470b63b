"""The demo's front-page verdict on the model pre-trained from scratch (heads_jax.report.demo)."""

import pytest

from heads_jax.report.demo import scratch_verdict


@pytest.mark.parametrize("loss,unigram,start", [
    (5.50, 5.84, "it has begun to use the context"),
    (5.86, 5.84, "about as good as word frequencies alone"),
    (5.80, 5.84, "about as good as word frequencies alone"),
    (6.19, 5.84, "0.35 nats worse than word frequencies alone"),  # the demo's run of issue 33
])
def test_scratch_verdict_says_which_side_of_the_unigram_baseline(loss, unigram, start):
  assert scratch_verdict(loss, unigram).startswith(start)
