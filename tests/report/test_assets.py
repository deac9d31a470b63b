"""The reports' CSS and JavaScript are package files (heads_jax/report/assets/), read with
importlib.resources and inlined into the page, which stays self-contained."""

from importlib import resources

from heads_jax.report import page, views


def test_assets_are_package_files_inlined_into_the_page(tmp_path):
  folder = resources.files("heads_jax.report").joinpath("assets")
  names = sorted(p.name for p in folder.iterdir() if p.name.endswith((".css", ".js")))
  assert names == ["head_view.css", "head_view.js", "page.css"]
  js = page.asset("head_view.js")
  assert js == views.JS and "addEventListener" in js and "</script" not in js.lower()
  assert page.asset("page.css") == page.CSS and "font-family" in page.CSS
  text = page.write_page(tmp_path, title="t", sections=[("s", "<p>x</p>")]).read_text()
  assert f"<style>{page.CSS}</style>" in text
  assert "<link" not in text and "src=" not in text


def test_setup_cfg_ships_the_assets_in_the_wheel():
  from pathlib import Path
  cfg = (Path(__file__).parents[2] / "setup.cfg").read_text()
  assert "heads_jax.report = assets/*.css, assets/*.js" in cfg
