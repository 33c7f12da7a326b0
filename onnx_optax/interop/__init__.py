"""Bridges that carry a training run, optimizer state included, across frameworks.

* :func:`from_torch` / :func:`to_torch`: ``torch.optim.SGD`` (ONNX
  ``Momentum``), ``torch.optim.Adagrad`` (ONNX ``Adagrad``) and
  ``torch.optim.Adam`` / ``AdamW`` (ONNX Runtime ``AdamWOptimizer``,
  ``adam_mode=0``: :func:`onnx_optax.ort_adamw`); :func:`torch_params`
  copies the weights.
* :func:`from_torch_state_dict` / :func:`to_torch_state_dict`: the same from
  and to a saved optimizer state dict (``torch.save``, Hugging Face's
  ``optimizer.pt``, ``get_optimizer_state_dict``), with no PyTorch optimizer;
  :func:`to_torch_scheduler_state_dict` writes the learning-rate scheduler's
  side, :func:`to_trainer_checkpoint` and :func:`to_lightning_checkpoint` the
  checkpoints that Hugging Face's Trainer and Lightning resume from, and
  :func:`torch_param_names` names the parameters of their index-keyed files.
* :func:`from_keras` / :func:`to_keras`: Keras 3's ``keras.optimizers.Adam``
  (DirectML Adam, on any Keras backend).
* :mod:`onnx_optax.interop.layout` and :mod:`onnx_optax.interop.flax_nnx`: a
  run carried into one's own model (a Flax NNX port), in its names and layouts:
  ``from_torch(..., layout=)`` and ``to_torch(..., layout=)``.

``from_*(optimizer, params)`` returns ``(tx, state)``: the transform of
:mod:`onnx_optax.transforms` with the other optimizer's hyperparameters and
the state with its tensors, so that the next JAX updates are the steps the
other framework would have taken. ``to_*(state, optimizer)`` loads the state
back. Whatever does not map exactly is refused, with the reason and the
nearest exact alternative. The tables, the refusals and the bounds that the
tests check: docs/interop.md.

The bridges only map state: every formula is the transforms'. Importing this
package imports neither PyTorch nor Keras; a function that needs one imports
it and says which extra installs it (``pip install 'onnx_optax[interop]'``).
"""

from __future__ import annotations

from onnx_optax.interop.keras import from_keras, to_keras
from onnx_optax.interop.torch import from_torch, to_torch, torch_params
from onnx_optax.interop.torch_checkpoints import to_torch_scheduler_state_dict, torch_param_names
from onnx_optax.interop.torch_lightning import to_lightning_checkpoint
from onnx_optax.interop.torch_state_dict import from_torch_state_dict, to_torch_state_dict
from onnx_optax.interop.torch_trainer import to_trainer_checkpoint

__all__ = [
  "from_keras",
  "from_torch",
  "from_torch_state_dict",
  "to_keras",
  "to_lightning_checkpoint",
  "to_torch",
  "to_torch_scheduler_state_dict",
  "to_torch_state_dict",
  "to_trainer_checkpoint",
  "torch_param_names",
  "torch_params",
]
