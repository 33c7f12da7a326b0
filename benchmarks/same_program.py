"""Does a change leave the compiled step as it was? Compares two onnx_optax's optimized HLO.

For each rule and tree, compiles the donated step (``scale.make_step``) with
this checkout's onnx_optax and with another revision's (``scale.add_baseline``)
and compares ``compile().as_text()`` line by line as a multiset, after removing
what names and source locations change without changing the program
(instruction and computation names, ``metadata={...}``, the stack-frame
tables). Equal: the same instructions, shapes, fusions and constants, so the
same step time and the same bits.

Usage (from the repository root)::

  python benchmarks/same_program.py f407249                 # mix10 and mix100, every rule
  python benchmarks/same_program.py HEAD~1 --trees mix1000 --rules adam
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax
import scale
from run import RULES

_FRAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalized(text: str) -> list[str]:
  """The optimized HLO's lines, sorted, without names and source locations."""
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  text = re.sub(r"HloModule \S+", "HloModule", text)
  text = re.sub(r"%[\w\-\.]+", "%", text)
  text = re.sub(r"\b(fused_computation|wrapped_\w+|fusion|region)[\w\.\-]*", r"\1", text)
  return sorted(
    line.strip()
    for line in text.splitlines()
    if line.strip() and not re.match(r"^\s*\d+ [\"{]", line) and not any(f in line for f in _FRAMES)
  )


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("baseline", help="a git revision or a folder (see scale.py --baseline)")
  ap.add_argument("--trees", default="mix10,mix100")
  ap.add_argument("--rules", default=",".join(RULES))
  args = ap.parse_args(argv)
  print(f"baseline: {scale.add_baseline(args.baseline)}")
  different = 0
  for tree in args.trees.split(","):
    params = scale.abstract_tree(scale.tree_shapes(tree), None)
    for rule in args.rules.split(","):
      texts = {}
      for lib in ("onnx_optax", "baseline"):
        opt = scale.MAKERS[lib](rule)
        state = jax.eval_shape(opt.init, params)
        step = jax.jit(scale.make_step(opt), donate_argnums=(0, 1))
        texts[lib] = normalized(step.lower(params, state, params).compile().as_text() or "")
      same = texts["onnx_optax"] == texts["baseline"]
      different += not same
      print(f"{tree:8} {rule:14} {'same program' if same else 'DIFFERENT'} ({len(texts['baseline'])} lines)")
  return 1 if different else 0


if __name__ == "__main__":
  sys.exit(main())
