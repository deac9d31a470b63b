"""data/glue_splits: row ranges, row selection and the role plan (disjoint roles on a shared
split, caps, the seeded eval cut)."""

import pytest

from heads_jax.data import glue, glue_splits
from heads_jax.errors import UserError


def test_row_ranges_round_trip():
  idx = [7, 1, 2, 3, 9, 10, 5]
  ranges = glue_splits.row_ranges(idx)
  assert ranges == [[1, 4], [5, 6], [7, 8], [9, 11]]
  assert glue_splits.expand_ranges(ranges) == set(idx)
  assert glue_splits.row_ranges([]) == []


def test_select_rows_keeps_order_and_fails_on_missing_rows():
  ex = [glue.GlueExample(f"s{i}", None, i % 2, i) for i in range(10)]
  assert [e.idx for e in glue_splits.select_rows(ex, {8, 2, 5})] == [2, 5, 8]
  with pytest.raises(ValueError, match="1 of the 2 requested rows are not in the split"):
    glue_splits.select_rows(ex, [3, 42])


def _plan(**kw):
  args = dict(test_sequences=10, eval_fraction=0.25, seed=0, partition_shared=True)
  args.update(kw)
  splits = args.pop("splits", {"train": "dev", "eval": "dev", "analysis": "dev"})
  return glue_splits.plan_rows("qqp", {"dev": 90, "test": 30}, splits, **args)


def test_plan_on_one_shared_split_is_a_disjoint_cover():
  plan = _plan()
  assert plan["analysis"] == ("dev", list(range(10)))
  train, ev = set(plan["train"][1]), set(plan["eval"][1])
  assert len(ev) == 20 and not train & ev and train | ev == set(range(10, 90))
  assert _plan() == plan                       # seeded
  assert _plan(seed=1)["eval"] != plan["eval"]
  capped = _plan(max_eval=5, max_train=7)
  assert len(capped["eval"][1]) == 5 and len(capped["train"][1]) == 7


def test_plan_needs_partition_for_shared_splits_and_rows_for_each_role():
  with pytest.raises(UserError, match="partition_shared_splits"):
    _plan(partition_shared=False)
  with pytest.raises(UserError, match="no rows left for eval"):
    glue_splits.plan_rows("mrpc", {"train": 5, "dev": 3, "test": 3},
                          {"train": "train", "eval": "dev", "analysis": "dev"},
                          test_sequences=3, eval_fraction=0.25, seed=0, partition_shared=True)
  separate = _plan(splits={"train": "dev", "eval": "test", "analysis": "test"})
  assert separate["train"] == ("dev", list(range(90)))
  assert separate["eval"] == ("test", list(range(10, 30)))


def test_a_holdout_that_leaves_no_rows_names_the_setting_and_the_file(tmp_path):
  # Before: "holdout_fraction 0.2 leaves no train or eval rows of 0", naming neither.
  (tmp_path / "SST-2").mkdir()
  (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\na fine film\t1\nbad\t0\n")
  with pytest.raises(UserError) as e:
    glue_splits.load_task_splits("sst2", glue_dir=tmp_path, holdout_fraction=0.2)
  msg = str(e.value)
  assert "data.holdout_fraction=0.2 of the 2 rows of GLUE sst2 train" in msg
  assert str(tmp_path) in msg and "leaves no eval rows" in msg
  assert "choose a fraction between 0.5 and 0.5" in msg
