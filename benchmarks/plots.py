"""Plots of the benchmark scripts' JSON outputs (needs matplotlib).

* :func:`compile_plot`: ``scale.py``'s trace + lower + compile (process CPU
  seconds, median) against the number of leaves, onnx_optax and Optax (and a
  ``--baseline``), one panel per rule.
* :func:`step_plot`: ``run.py``'s step time against the number of elements of
  a one-leaf tree, onnx_optax, Optax and PyTorch (``foreach``, ``fused``), one
  panel per rule.

``scale.py --plot FILE.png`` and ``run.py --plot FILE.png`` call them at the
end of a run; for a saved run::

  python benchmarks/plots.py compile docs/benchmarks/compile_cpu.png scale_a.json [scale_b.json ...]
  python benchmarks/plots.py step docs/benchmarks/steps_cpu.png steps_cpu.json

Several ``scale.py`` runs (say, the small trees in one run and ``mix10k``
in another) are drawn as one plot, their rows put together.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: Line style per contender: the same colours in every plot.
STYLE = {
  "onnx_optax": dict(color="C0", marker="o", linestyle="-"),
  "optax": dict(color="C1", marker="s", linestyle="--"),
  "baseline": dict(color="C2", marker="^", linestyle=":"),
  "torch_foreach": dict(color="C3", marker="v", linestyle="-."),
  "torch_fused": dict(color="C4", marker="D", linestyle="-."),
}


def _figure(rules: list[str]):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = min(3, len(rules))
  rows = -(-len(rules) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols + 0.4, 3.3 * rows + 0.5), squeeze=False)
  flat = list(axes.flat)
  for ax in flat[len(rules) :]:
    ax.set_visible(False)
  return plt, fig, flat[: len(rules)]


def _plain_ticks(ax) -> None:
  """Tick labels as plain numbers (0.5, 2, 100), not powers of ten."""
  from matplotlib.ticker import FuncFormatter

  fmt = FuncFormatter(lambda v, _: f"{v:g}")
  for axis in (ax.xaxis, ax.yaxis):
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _title(env: dict[str, Any], what: str) -> str:
  commit = f", onnx_optax {str(env['commit']).split(' ')[0]}" if env.get("commit") else ""
  return (
    f"{what}: {env['device_kind']}, {env['cpu_count']} CPU cores ({env.get('processor', '')}), "
    f"jax {env['jax']}, optax {env['optax']}{commit}; {env['started']}"
  )


def compile_plot(out: dict[str, Any], path: str) -> None:
  """Total compile CPU seconds against leaves, per rule (``scale.py``'s rows)."""
  rows = out["rows"]
  rules = list(dict.fromkeys(r["rule"] for r in rows))
  plt, fig, axes = _figure(rules)
  for ax, rule in zip(axes, rules):
    mine = sorted((r for r in rows if r["rule"] == rule), key=lambda r: r["leaves"])
    for lib in [k for k in STYLE if k in mine[0]["median"]]:
      xs = [r["leaves"] for r in mine]
      ys = [r["median"][lib]["total_cpu_s"] for r in mine]
      ax.plot(xs, ys, label=lib, **STYLE[lib])
    for r in mine:
      ratio = r["ratio"]["total_cpu_s"]
      ax.annotate(
        f"{ratio:.2f}x",
        (r["leaves"], r["median"]["onnx_optax"]["total_cpu_s"]),
        textcoords="offset points",
        xytext=(0, -13),
        ha="center",
        fontsize=7,
        color=STYLE["onnx_optax"]["color"],
      )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax)
    ax.margins(x=0.12, y=0.15)
    ax.set_title(rule, fontsize=10)
    ax.set_xlabel("leaves")
    ax.grid(True, which="both", alpha=0.3)
  for ax in axes[:: min(3, len(axes))]:
    ax.set_ylabel("trace + lower + compile, CPU s")
  axes[0].legend(fontsize=8, loc="upper left")
  fig.suptitle(
    _title(out["env"], "Compile of the donated step (median; labels: onnx_optax / Optax)"), fontsize=8
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def step_plot(out: dict[str, Any], path: str) -> None:
  """Step time against elements of one leaf, per rule (``run.py``'s one-leaf rows)."""
  rows = [r for r in out["results"] if r["leaves"] == 1]
  rules = list(dict.fromkeys(r["rule"] for r in rows))
  plt, fig, axes = _figure(rules)
  for ax, rule in zip(axes, rules):
    mine = sorted((r for r in rows if r["rule"] == rule), key=lambda r: r["elements"])
    for lib in [k for k in STYLE if k in mine[0]["ms"]]:
      pts = [(r["elements"], r["ms"][lib]) for r in mine if lib in r["ms"]]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], label=lib, **STYLE[lib])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_ticks(ax)
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2**20:g}M"))
    ax.set_title(rule, fontsize=10)
    ax.set_xlabel("float32 elements (one leaf; M = 2^20)")
    ax.grid(True, which="both", alpha=0.3)
  for ax in axes[:: min(3, len(axes))]:
    ax.set_ylabel("step time, ms (median)")
  axes[0].legend(fontsize=8, loc="upper left")
  fig.suptitle(_title(out["env"], f"Step time (median of {out['env']['repeats']} interleaved)"), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str]) -> None:
  if len(argv) < 3 or argv[0] not in ("compile", "step") or (argv[0] == "step" and len(argv) != 3):
    sys.exit(__doc__)
  runs = []
  for name in argv[2:]:
    with open(name) as f:
      runs.append(json.load(f))
  if argv[0] == "step":
    step_plot(runs[0], argv[1])
    return
  out = dict(runs[0], rows=[row for run in runs for row in run["rows"]])
  compile_plot(out, argv[1])


if __name__ == "__main__":
  main(sys.argv[1:])
