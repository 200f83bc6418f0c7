"""Export a model folder to ONNX, the format ONNX Runtime and OpenVINO both read.

The recipe: the model loaded with eager attention (the attention kernels of the other
implementations do not export), traced by ``torch.onnx.export`` (TorchScript, opset 17) on a
padded batch of two, with the batch and sequence dimensions left dynamic. For the model types
ONNX Runtime's transformer optimiser knows (BERT and its relatives), a second, fused graph is
written beside it (attention, embedding and layer norms fused); OpenVINO reads the plain one.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from ..shared.torch_models import WEIGHTS_LOADING
from .cache import FUSED, PLAIN

__all__ = ["FUSED", "HEADS", "PLAIN", "export_onnx"]

OPSET = 17

#: What is exported, by head: the transformers class that loads it.
HEADS: dict[str, Any] = {
    "base": transformers.AutoModel,
    "sequence-classification": transformers.AutoModelForSequenceClassification,
    "masked-lm": transformers.AutoModelForMaskedLM,
}

#: Model types whose graphs ONNX Runtime's "bert" optimiser fuses.
_FUSABLE = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "mpnet"})


class _Outputs(torch.nn.Module):
    """The model with positional inputs, returning its first output only (the last hidden
    state, or the logits)."""

    def __init__(self, model: Any, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = tuple(names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True)))[0]  # type: ignore[no-any-return]


def _sample(names: Sequence[str], vocab: int) -> tuple[torch.Tensor, ...]:
    """A batch of two, the second padded: so the traced graph keeps the attention mask."""
    length = 8
    tensors = []
    for name in names:
        if name == "input_ids":
            tensor = (torch.arange(2 * length).reshape(2, length) % max(vocab - 1, 1)) + 1
        elif name == "attention_mask":
            tensor = torch.ones(2, length, dtype=torch.long)
            tensor[1, length // 2 :] = 0
        else:
            tensor = torch.zeros(2, length, dtype=torch.long)
        tensors.append(tensor.to(torch.long))
    return tuple(tensors)


#: The loggers of ONNX Runtime's optimiser (its modules log under their own short names).
_CHATTY = ("onnxruntime", "fusion", "onnx_model", "optimizer", "float16", "shape_infer")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter's tracer warnings and the optimiser's notes say nothing to act on."""
    saved: dict[str, int] = {}

    def silence() -> None:
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(_CHATTY) and name not in saved:
                chatty = logging.getLogger(name)
                saved[name] = chatty.level
                chatty.setLevel(logging.ERROR)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            silence()
            yield
            silence()
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def export_onnx(model_folder: Path, head: str, names: Sequence[str], out: Path) -> None:
    """Write ``out/model.onnx`` (and ``out/model.fused.onnx`` where fusion applies).

    :param head: a key of :data:`HEADS`.
    :param names: the model's inputs, in the order the tokenizer gives them.
    :raises Exception: whatever the exporter raises for an architecture it cannot trace.
    """
    loader = HEADS[head]
    with _quiet():
        with WEIGHTS_LOADING:
            model = loader.from_pretrained(str(model_folder), attn_implementation="eager")
        model.eval()
        config = model.config
        wrapped = _Outputs(model, names).eval()
        sample = _sample(names, int(getattr(config, "vocab_size", 2) or 2))
        axes = {name: {0: "batch", 1: "sequence"} for name in names}
        with torch.no_grad():
            rank = wrapped(*sample).dim()
        axes["output"] = {0: "batch", 1: "sequence"} if rank == 3 else {0: "batch"}
        with torch.no_grad():
            torch.onnx.export(
                wrapped,
                sample,
                str(out / PLAIN),
                input_names=list(names),
                output_names=["output"],
                dynamic_axes=axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        del model, wrapped
        _fuse(out, config)


def _fuse(out: Path, config: Any) -> None:
    """ONNX Runtime's optimiser, for the model types it knows; any failure leaves the plain
    graph alone (the fused one is checked against torch like any other variant)."""
    if getattr(config, "model_type", None) not in _FUSABLE:
        return
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not isinstance(heads, int) or not isinstance(hidden, int):
        return
    try:
        from onnxruntime.transformers import optimizer
    except ImportError:
        return
    try:
        with _quiet():
            fused = optimizer.optimize_model(
                str(out / PLAIN),
                model_type="bert",
                num_heads=heads,
                hidden_size=hidden,
                opt_level=1,
            )
            fused.save_model_to_file(str(out / FUSED))
    except Exception:
        (out / FUSED).unlink(missing_ok=True)
