"""Your own model: python server.py --model mypackage.models:Reverser (from examples/)."""

from batching import ModelBase


class Reverser(ModelBase):
    def load(self, device: str) -> None:
        """Called once per instance, on that instance's thread or process, with its device
        ("cpu", "cuda:0", ...). Load weights here, not in __init__."""

    def predict(self, inputs: list) -> list:
        """One output per input, in order. Called with a whole batch at a time."""
        return [text[::-1] for text in inputs]

    # optional hooks (ModelBase's defaults shown in batching/models/protocol.py)
    def warmup_inputs(self, max_batch_size: int) -> list[list]:
        """Batches to run before the instance reports ready."""
        return [["warm up"], ["warm up"] * max_batch_size]

    def metadata(self) -> dict:
        """Inputs and outputs for the v2 metadata endpoint; a BYTES input marks a text model.
        Shapes start with the batch dimension (-1): one text per item is [-1, 1], and two
        inputs come back as a [2, 1] "reversed" tensor."""
        return {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
            "outputs": [{"name": "reversed", "datatype": "BYTES", "shape": [-1, 1]}],
        }
