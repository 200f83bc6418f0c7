"""Media inputs (images, audio) on the wire: bytes in, never a path or a URL.

A model says an input is media in its metadata input entry, with :data:`CONTENT_KEY`:
``{"name": "image", "datatype": "BYTES", "shape": [-1], "content": "image"}`` (or
``"content": "audio"``). Every door then hands the model ``bytes`` for that input:

- the plain door: a raw body whose ``Content-Type`` is of that kind (``image/png``,
  ``image/*``, ``audio/wav``, ...) or ``application/octet-stream`` is one item
  (:func:`media_body`); a JSON body's items are base64 strings (:func:`media_bytes`);
- KServe v2 over HTTP: a BYTES tensor in binary form (raw bytes per element) or in JSON
  (base64 strings);
- gRPC: a BYTES tensor's elements, raw (``raw_input_contents`` or ``bytes_contents``).

A base64 string may carry a ``data:`` URI prefix (``data:image/png;base64,...``, as browsers
and the OpenAI vision API write images); its media type, when given, must be of the input's
kind. Anything else that is not strict base64 (standard alphabet, padded) is a 400, and so is
an empty item. A string is only ever decoded as base64: nothing is opened as a path or
fetched as a URL. Whether the bytes are a decodable image, and not too large, is the data
plane's check (:mod:`batching.models.media`), the same for every door.

Pure functions over bytes and the metadata dict.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence

from batching.errors import InvalidRequest

__all__ = [
    "CONTENT_KEY",
    "RAW_TYPES",
    "media_body",
    "media_bytes",
    "media_kind",
]

#: The key of a metadata input entry that says the input is media bytes, and of which kind.
CONTENT_KEY = "content"

#: Content types of a raw body that is one media item, whatever the model's kind.
RAW_TYPES = frozenset({"application/octet-stream"})

# ``data:[<media type>][;param=value]*;base64,`` (RFC 2397); only base64 payloads.
_DATA_URI = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*?);base64,", re.IGNORECASE)


def media_kind(entry: Mapping[str, object]) -> str | None:
    """The media kind (``"image"``, ``"audio"``) a metadata input entry declares, or None."""
    kind = entry.get(CONTENT_KEY)
    return kind if isinstance(kind, str) and kind else None


def media_bytes(value: object, kind: str, where: str) -> bytes:
    """One media item as the model takes it: ``bytes`` pass as they are; a string is base64
    (optionally a ``data:`` URI of ``kind``), decoded here.

    :param where: names the item in messages, e.g. ``inputs[2]``.
    :raises InvalidRequest: anything else, a string that is not strict base64, or no bytes.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    elif isinstance(value, str):
        data = _from_base64(value, kind, where)
    else:
        raise InvalidRequest(
            f"{where} is {type(value).__name__}; this {kind} input takes base64 text "
            f"(or raw bytes where the protocol carries them)"
        )
    if not data:
        raise InvalidRequest(f"{where} is empty; send the {kind}'s bytes")
    return data


def _from_base64(text: str, kind: str, where: str) -> bytes:
    payload = text.strip()
    uri = _DATA_URI.match(payload)
    if uri is not None:
        media_type = uri.group(1).strip().lower()
        if media_type and media_type.partition("/")[0] != kind and media_type not in RAW_TYPES:
            raise InvalidRequest(
                f"{where} is a data: URI of {media_type!r}; this input takes {kind}/* data"
            )
        payload = payload[uri.end() :]
    elif payload[:5].lower() == "data:":
        raise InvalidRequest(f"{where} is a data: URI without ;base64,; send base64 data")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            f"{where} is not valid base64; this {kind} input takes the {kind}'s bytes as "
            "base64 text (a path or URL is never opened)"
        ) from None


def media_body(
    body: bytes, content_type: str, entries: Sequence[Mapping[str, object]]
) -> tuple[str, str] | None:
    """Whether a raw body is one media item for a model whose metadata inputs are
    ``entries``: ``(input name, kind)`` when its content type is of a media kind the model
    declares (``image/png`` for an ``image`` input) or ``application/octet-stream`` and the
    model has one media input; None when the body is text or JSON for the usual parse.

    :raises InvalidRequest: a media content type the model takes no input of, or an
        octet-stream body for a model with several media inputs.
    """
    media_type = content_type.partition(";")[0].strip().lower()
    major = media_type.partition("/")[0]
    declared = [(str(entry.get("name")), kind) for entry in entries if (kind := media_kind(entry))]
    if media_type in RAW_TYPES:
        if len(declared) == 1:
            return declared[0]
        if declared:
            raise InvalidRequest(
                "this model takes several media inputs; send a body of one of "
                f"{', '.join(f'{kind}/*' for _, kind in declared)}, or JSON"
            )
        return None
    if major not in ("image", "audio", "video"):
        return None
    for name, kind in declared:
        if kind == major:
            return name, kind
    takes = ", ".join(f"{kind}/*" for _, kind in declared)
    raise InvalidRequest(
        f"a body of type {media_type} does not fit this model: it takes "
        + (f"{takes} or JSON" if takes else "text or JSON")
    )
