"""Request bodies: built-in sentences or lines from a file, in each of the server's formats.

Bodies are encoded once, before the run, into a small pool that the client cycles through, so
building a request costs nothing while the clock runs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = [
    "API_CHOICES",
    "GRPC_METHOD",
    "INPUT_NAME",
    "OPENAI_ENCODINGS",
    "Payload",
    "PayloadSet",
    "build_payloads",
    "bytes_tensor",
    "load_texts",
    "make_sentence",
    "parse_range",
    "request_path",
]

#: ``plain``: one text per request as ``text/plain``; ``json``: ``{"inputs": [...]}``;
#: ``v2``: a KServe v2 ``infer`` body with one BYTES tensor as JSON data; ``v2-binary``: the
#: same with the tensor as binary data after a JSON header, and binary outputs asked for;
#: ``openai``: an OpenAI ``/v1/embeddings`` body; ``grpc``: KServe v2 ``ModelInfer`` over gRPC
#: (the payload's body is the tensor's ``raw_input_contents``: 4-byte little-endian length and
#: UTF-8 bytes per text).
API_CHOICES = ("plain", "json", "v2", "v2-binary", "openai", "grpc")

#: ``encoding_format`` values of the OpenAI embeddings API (the ``openai`` SDK asks for base64).
OPENAI_ENCODINGS = ("base64", "float")

#: The RPC the ``grpc`` API calls, shown where an HTTP API shows its path.
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"

#: The name of the one input tensor of the v2 and gRPC bodies.
INPUT_NAME = "text"

# Everyday words of mixed length, so a sentence of N words has a realistic token count
# (about 1.3 tokens per word for a WordPiece vocabulary).
_WORDS = (
    "the quick brown fox jumps over a lazy dog while small children play in the park near "
    "river bank every morning people walk their dogs and drink coffee before work begins "
    "teachers explain difficult ideas with simple examples students listen carefully and "
    "write notes about history science music language mathematics engineering medicine "
    "weather today looks bright warm pleasant although clouds may gather later evening "
    "market sells fresh bread cheese apples oranges vegetables fish flowers honey "
    "computer network server request response latency throughput batch model embedding "
    "customer support ticket order delivery invoice payment refund account password "
    "mountain valley forest ocean island desert city village road bridge station airport "
    "happy quietly suddenly often never always sometimes because however therefore"
).split()


@dataclass(frozen=True, slots=True)
class Payload:
    """One encoded request body, the number of inputs it carries, and any HTTP headers it
    needs besides ``Content-Type`` and ``Content-Length``."""

    body: bytes
    items: int
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PayloadSet:
    """The pool of bodies a run cycles through, all of one API."""

    api: str
    path: str
    content_type: str
    payloads: tuple[Payload, ...]
    #: The model named in the body or RPC (``openai``, ``grpc``) or the path (``v2``).
    model_name: str = ""

    def __len__(self) -> int:
        return len(self.payloads)


def parse_range(text: str) -> tuple[int, int]:
    """``"4"`` -> ``(4, 4)``; ``"1-6"`` -> ``(1, 6)``.

    :raises ValueError: when the text is not one or two positive integers in order.
    """
    low_text, sep, high_text = text.strip().partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise ValueError(f"{text!r} is not N or A-B") from None
    if low < 1 or high < low:
        raise ValueError(f"{text!r}: need 1 <= A <= B")
    return low, high


def make_sentence(rng: random.Random, words: int) -> str:
    """A sentence of exactly ``words`` words, capitalised and ending with a full stop."""
    picked = [rng.choice(_WORDS) for _ in range(words)]
    picked[0] = picked[0].capitalize()
    return " ".join(picked) + "."


def load_texts(path: Path) -> list[str]:
    """Inputs from a file: a JSON list of strings (``.json``), else one input per line.

    :raises ValueError: when the file holds no usable input.
    """
    raw = path.read_bytes()
    if path.suffix == ".json":
        data = orjson.loads(raw)
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise ValueError(f"{path}: a .json payload file must hold a list of strings")
        texts = [x for x in data if x]
    else:
        texts = [line.strip() for line in raw.decode("utf-8").splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no inputs")
    return texts


def request_path(api: str, model_name: str) -> str:
    """The URL path each API posts to (for ``grpc``, the RPC it calls)."""
    if api in ("v2", "v2-binary"):
        return f"/v2/models/{model_name}/infer"
    if api == "openai":
        return "/v1/embeddings"
    if api == "grpc":
        return GRPC_METHOD
    return "/"


def bytes_tensor(texts: Sequence[str]) -> bytes:
    """``texts`` as the binary form of a KServe v2 BYTES tensor: each element's byte length
    as 4 little-endian bytes, then its UTF-8 bytes."""
    parts = []
    for text in texts:
        encoded = text.encode("utf-8")
        parts.append(len(encoded).to_bytes(4, "little"))
        parts.append(encoded)
    return b"".join(parts)


def _encode(
    api: str, texts: Sequence[str], model_name: str, openai_encoding: str
) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """The body of one request and the extra headers it needs."""
    if api == "plain":
        return texts[0].encode("utf-8"), ()
    if api == "json":
        return orjson.dumps({"inputs": list(texts)}), ()
    if api == "openai":
        document = {"model": model_name, "input": list(texts), "encoding_format": openai_encoding}
        return orjson.dumps(document), ()
    if api == "grpc":
        return bytes_tensor(texts), ()
    tensor: dict[str, object] = {"name": INPUT_NAME, "datatype": "BYTES", "shape": [len(texts), 1]}
    if api == "v2":
        tensor["data"] = list(texts)
        return orjson.dumps({"inputs": [tensor]}), ()
    data = bytes_tensor(texts)
    tensor["parameters"] = {"binary_data_size": len(data)}
    header = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
    return header + data, (("Inference-Header-Content-Length", str(len(header))),)


def _content_type(api: str) -> str:
    if api == "plain":
        return "text/plain; charset=utf-8"
    if api == "v2-binary":
        return "application/octet-stream"
    if api == "grpc":
        return "application/grpc"
    return "application/json"


def build_payloads(
    *,
    api: str,
    items: tuple[int, int],
    words: tuple[int, int] = (12, 12),
    texts: Sequence[str] | None = None,
    count: int = 512,
    seed: int = 0,
    model_name: str = "all-MiniLM-L6-v2",
    openai_encoding: str = "base64",
) -> PayloadSet:
    """``count`` bodies with ``items`` inputs each (drawn uniformly from the range).

    Inputs are sentences of ``words`` words, or drawn from ``texts`` when given. The same seed
    gives the same bodies, so two runs compare like with like, and the same texts whatever
    the API, so two doors compare like with like too. ``openai_encoding`` is the
    ``encoding_format`` an ``openai`` body asks for.

    :raises ValueError: for an unknown API or encoding, or ``plain`` with more than one item
        per request.
    """
    if api not in API_CHOICES:
        raise ValueError(f"unknown api {api!r}; choose from {', '.join(API_CHOICES)}")
    if openai_encoding not in OPENAI_ENCODINGS:
        raise ValueError(f"unknown encoding {openai_encoding!r}; choose from base64, float")
    if api == "plain" and items != (1, 1):
        raise ValueError("a plain text body carries exactly one input: use --items 1")
    if count < 1:
        raise ValueError("count must be at least 1")
    rng = random.Random(seed)
    payloads = []
    for _ in range(count):
        n = rng.randint(*items)
        if texts:
            chosen = [rng.choice(texts) for _ in range(n)]
        else:
            chosen = [make_sentence(rng, rng.randint(*words)) for _ in range(n)]
        body, headers = _encode(api, chosen, model_name, openai_encoding)
        payloads.append(Payload(body=body, items=n, headers=headers))
    return PayloadSet(
        api=api,
        path=request_path(api, model_name),
        content_type=_content_type(api),
        payloads=tuple(payloads),
        model_name=model_name,
    )
