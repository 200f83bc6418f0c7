"""Per-request embedding options, the same on every door: what a request may ask of an
embedding model (an instruction prompt, the truncation rule and side, fewer dimensions, a
compact encoding), checked against what the model says it applies (its ``"embedding"``
metadata, :data:`~batching.models.items.EMBEDDING_KEY`), and turned into the items its queue
takes.

The options, by the name every door uses (the OpenAI door spells ``encoding`` as
``encoding_format``):

- ``prompt_name``: a key of the model's ``prompts`` (``config_sentence_transformers.json``);
  prepended as sentence-transformers' ``encode(prompt_name=...)`` does. Left out, the model's
  default prompt applies (``default_prompt_name``, ``--default-prompt-name``/``--default-prompt``).
- ``input_type``: Cohere's and Voyage's spelling of the same choice: the prompt of that name,
  or for ``document``/``search_document`` the ``document`` or ``passage`` prompt, for
  ``search_query`` the ``query`` prompt. Given with ``prompt_name``, both must pick one prompt.
- ``truncate``: ``true`` (the server's default unless ``--no-truncate``) cuts a text longer
  than the model's ``max_seq_length``; ``false`` refuses it (413 naming the limit and the
  text's token count).
- ``truncation_direction``: ``right`` (the default) keeps the start, ``left`` the end.
- ``dimensions``: keep the first N dimensions (re-normalised for unit vectors).
- ``encoding``: ``float``, ``base64`` (little-endian float32 bytes), ``int8``, ``uint8``,
  ``binary``, ``ubinary`` (sentence-transformers' ``quantize_embeddings`` precisions), or one
  of those four followed by ``+base64`` (``int8+base64``: the same bytes, base64-encoded).

Anything else is a 400 naming it, never ignored; so is an option the model cannot apply
(a model without ``"embedding"`` metadata takes only ``dimensions``, ``float`` and ``base64``,
which the doors apply themselves). Pure functions over plain values and numpy, in three
steps: :mod:`.reading` (the options a request set, each checked for its type),
:mod:`.planning` (checked against the model's metadata, into the items to queue and the plan of
the answer) and :mod:`.encoding` (the model's outputs as the answer's vectors).
"""

# The three steps' names, as every door imports them: from here.
from . import encoding, planning, reading
from .encoding import *  # noqa: F403
from .planning import *  # noqa: F403
from .reading import *  # noqa: F403

__all__: list[str] = []
__all__ += reading.__all__
__all__ += planning.__all__
__all__ += encoding.__all__
