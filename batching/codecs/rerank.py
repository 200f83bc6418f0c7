"""The rerank API's wire format (``POST /v1/rerank``, as Cohere, Jina and text-embeddings-
inference serve it), and how a text-pair model's output becomes a relevance score. Pure.

A request is ``{"model", "query", "documents", "top_n"?, "return_documents"?}``: ``documents``
is a non-empty array of strings (or of ``{"text": ...}`` objects); ``top_n`` (default: all)
keeps the best ones; ``return_documents`` (default false) echoes each document as
``{"text": ...}``. The answer is ``{"results": [{"index", "relevance_score", "document"?}],
"model", "usage"}``, best first (ties in document order). Each document is one item, the pair
``{"text": query, "text_pair": document}``, so the documents are batched like any items, and a
pair longer than the model's maximum length is truncated longest-first, as the model always
does. Errors use OpenAI's error document (:mod:`.openai`).

The relevance score is what the model says of the pair (:func:`relevance_of`):

- a number (a custom model's own score): that number;
- ``{"label", "score"}`` from a model with one label (a cross-encoder with a single relevance
  logit, e.g. the ms-marco ones): its score, which the text-classification pipeline has passed
  through a sigmoid, as sentence-transformers' ``CrossEncoder.predict`` does;
- from a model with two labels (a binary relevance classifier, a two-way NLI model): the
  softmax probability of its positive label, whether or not that label won; the positive label
  is the one named ``entailment``, ``positive``, ``relevant``, ``yes``, ``true`` or ``pos``
  (any case), else the second label (``LABEL_1``, the positive class by convention);
- a list of ``{"label", "score"}`` (every label's score): the positive label's score, found
  as above;
- a model with three or more labels answering only its top label (three-way NLI models) gives
  no relevance for the other pairs: the request is refused with a 400 saying so;
- ``{"label", "score"}`` from a model that does not list its ``labels`` in its metadata: the
  score as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from .openai import OpenAIError, json_object, model_name

__all__ = [
    "POSITIVE_LABELS",
    "RerankRequest",
    "encode_rerank",
    "pair_items",
    "parse_rerank_request",
    "positive_label",
    "relevance_of",
]

#: Label names read as "relevant" (lower case).
POSITIVE_LABELS = frozenset({"entailment", "positive", "pos", "relevant", "yes", "true"})


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """A parsed ``POST /v1/rerank`` body."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = False


def _document(value: object, index: int) -> str:
    if isinstance(value, dict) and set(value) == {"text"}:
        value = value["text"]
    if not isinstance(value, str):
        raise OpenAIError(
            f"documents[{index}] must be a string (or an object with a string 'text'), "
            f"not {type(value).__name__}",
            param="documents",
            code="invalid_type",
        )
    return value


def parse_rerank_request(body: bytes) -> RerankRequest:
    """A ``POST /v1/rerank`` body.

    :raises OpenAIError: naming the parameter at fault.
    """
    document = json_object(body)
    model = model_name(document)
    query = document.get("query")
    if not isinstance(query, str) or not query:
        raise _refused("query", query, "a non-empty string")
    documents = document.get("documents")
    if not isinstance(documents, list) or not documents:
        raise _refused("documents", documents, "a non-empty array of strings")
    texts = [_document(value, index) for index, value in enumerate(documents)]
    top_n = document.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise OpenAIError(
            f"top_n must be a positive integer, not {top_n!r}", param="top_n", code="invalid_value"
        )
    return_documents = document.get("return_documents", False)
    if return_documents is None:
        return_documents = False
    if not isinstance(return_documents, bool):
        raise OpenAIError(
            f"return_documents must be true or false, not {return_documents!r}",
            param="return_documents",
            code="invalid_type",
        )
    return RerankRequest(model, query, texts, top_n, return_documents)


def pair_items(request: RerankRequest) -> list[dict[str, str]]:
    """One item per document: the pair ``{"text": query, "text_pair": document}``."""
    return [{"text": request.query, "text_pair": text} for text in request.documents]


def positive_label(labels: Sequence[str]) -> str | None:
    """The label that means "relevant" among a model's ``labels`` (in logit order)."""
    for label in labels:
        if label.lower() in POSITIVE_LABELS:
            return label
    if len(labels) == 1:
        return labels[0]
    if len(labels) == 2:
        return labels[1]
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        return float(value.reshape(-1)[0])
    if isinstance(value, list) and len(value) == 1:
        return _number(value[0])
    return None


def _unreadable(model: str, why: str) -> OpenAIError:
    return OpenAIError(
        f"model {model!r} cannot rerank: {why}; /v1/rerank needs a model that scores a pair "
        "with one number, one relevance label, or two labels",
        param="model",
        code="model_not_supported",
    )


def relevance_of(output: object, labels: Sequence[str], model: str) -> float:
    """The relevance score of one pair from the model's ``output`` for it (see the module's
    docstring); ``labels`` are the model's labels in logit order (empty when unknown).

    :raises OpenAIError: no relevance can be read from this model's outputs.
    """
    number = _number(output)
    if number is not None:
        return number
    if isinstance(output, Mapping) and "score" in output:
        score = _number(output["score"])
        if score is None:
            raise _unreadable(model, f"its score {output['score']!r} is not a number")
        label = output.get("label")
        if label is None or len(labels) <= 1:
            return score
        positive = positive_label(labels)
        if len(labels) == 2:
            return score if label == positive else 1.0 - score
        raise _unreadable(
            model,
            f"it has {len(labels)} labels ({', '.join(labels)}) and answers only the top one",
        )
    if (
        isinstance(output, list)
        and output
        and all(
            isinstance(entry, Mapping) and "label" in entry and "score" in entry for entry in output
        )
    ):
        scores = {str(entry["label"]): entry["score"] for entry in output}
        if labels:
            positive = positive_label(labels)
        else:  # listed best first: only a name, or a lone label, says which one is relevant
            named = [label for label in scores if label.lower() in POSITIVE_LABELS]
            positive = named[0] if named else next(iter(scores)) if len(scores) == 1 else None
        value = _number(scores.get(positive)) if positive is not None else None
        if value is None:
            raise _unreadable(model, f"none of its labels ({', '.join(scores)}) means relevant")
        return value
    raise _unreadable(model, f"it answered {type(output).__name__}, not a score")


def encode_rerank(
    request: RerankRequest, model: str, scores: Sequence[float], tokens: int
) -> bytes:
    """The ``POST /v1/rerank`` answer: the ``top_n`` best documents, best first."""
    order = sorted(range(len(scores)), key=lambda index: -scores[index])
    if request.top_n is not None:
        order = order[: request.top_n]
    results: list[dict[str, object]] = []
    for index in order:
        result: dict[str, object] = {"index": index, "relevance_score": scores[index]}
        if request.return_documents:
            result["document"] = {"text": request.documents[index]}
        results.append(result)
    return orjson.dumps(
        {
            "results": results,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _refused(name: str, value: object, wanted: str) -> OpenAIError:
    """The error for a missing or unfit required field ``name``."""
    return OpenAIError(
        f"{name} must be {wanted}",
        param=name,
        code="missing_required_parameter" if value is None else "invalid_value",
    )
