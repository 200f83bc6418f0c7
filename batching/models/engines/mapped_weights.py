"""Weights mapped from the engine cache, one copy for every thread count's runner.

The thread governor keeps a runner per thread count (:mod:`.governor`), and each engine
would otherwise hold its own copy of the weights: ONNX Runtime copies every initializer of
the graph into each session, and OpenVINO's compiled models each keep the model they were
compiled from. So the serving runners read the weights from files beside the export, mapped
read-only: the kernel keeps one copy (the page cache's) however many runners map it, and
only the pages a batch reads are resident.

- ONNX Runtime (:func:`ort_initializers`): the initializers it does not repack per session
  (the embedding tables: 45 of the default model's 86 MB) are written once as ``.npy``
  files into ``<graph>.shared/`` and handed to every session as OrtValues over the mapped
  arrays (``SessionOptions.add_initializer``): the sessions share them, and the rows of the
  tokens never seen are never read. The matrices of its MatMul and Attention kernels are
  repacked by each session into a layout of its own (a copy either way), so they stay in
  the graph.
- OpenVINO (:func:`openvino_ir`): the graph is converted once to OpenVINO's IR
  (``<graph>.openvino/model.xml`` and ``.bin``), whose weights OpenVINO maps instead of
  reading (the ONNX reader copies them). Compiling reads every page (a bf16 model converts
  its matrices into a copy of its own and never reads the fp32 ones again), so once the
  runners are compiled :func:`release_pages` tells the kernel the process no longer needs
  the mapped pages (``madvise(MADV_DONTNEED)`` on the read-only mapping; a later read maps
  the page again from the page cache, unchanged).

A cache folder that cannot be written serves as before: ONNX Runtime with the initializers
read into memory once (still shared between the sessions), OpenVINO from the ONNX graph.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "REPACKING_OPS",
    "SharedInitializers",
    "openvino_ir",
    "ort_initializers",
    "release_pages",
]

#: ONNX Runtime operators whose weight inputs (every input after the first) a session
#: repacks into a layout of its own: sharing those would keep the original beside the copy.
REPACKING_OPS = frozenset(
    {
        "Attention",
        "Conv",
        "DynamicQuantizeMatMul",
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        "GRU",
        "Gemm",
        "LSTM",
        "MatMul",
        "MatMulInteger",
        "MatMulNBits",
        "QAttention",
        "QLinearConv",
        "QLinearMatMul",
    }
)
#: Initializers smaller than this stay in the graph (a shared one must be at least 128 bytes,
#: and shape arithmetic reads the small ones while optimising).
MIN_SHARED_BYTES = 64 << 10
_INDEX = "index.json"
_MADV_RANDOM = 1
_MADV_DONTNEED = 4


class SharedInitializers:
    """The OrtValues every session of one graph adds (``add_initializer``); a session must
    hold it while it lives (ONNX Runtime reads the arrays in place)."""

    def __init__(self, arrays: dict[str, Any]) -> None:
        import onnxruntime

        self.arrays = arrays
        self.values = {
            name: onnxruntime.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()
        }

    def add_to(self, options: Any) -> None:
        for name, value in self.values.items():
            options.add_initializer(name, value)


_SHARED: weakref.WeakValueDictionary[str, SharedInitializers] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def ort_initializers(graph: Path) -> SharedInitializers:
    """The initializers of ``graph`` its sessions share (the same object for every session
    of the graph in this process while one holds it)."""
    key = str(graph.resolve())
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = SharedInitializers(_mapped_arrays(graph))
            _SHARED[key] = shared
        return shared


def _mapped_arrays(graph: Path) -> dict[str, Any]:
    import numpy as np

    folder = graph.with_name(graph.name.removesuffix(".onnx") + ".shared")
    index = folder / _INDEX
    if not index.is_file():
        arrays = _shareable(graph)
        try:
            _write_once(folder, lambda out: _save_arrays(arrays, out))
        except OSError:
            return arrays  # a read-only cache: shared in memory, as read
    names = json.loads(index.read_text(encoding="utf-8"))
    return {name: np.load(folder / file, mmap_mode="r") for name, file in names.items()}


def _shareable(graph: Path) -> dict[str, Any]:
    """The graph's initializers no session repacks, of :data:`MIN_SHARED_BYTES` or more."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    repacked = {
        name
        for node in model.graph.node
        if node.op_type in REPACKING_OPS
        for name in node.input[1:]
    }
    arrays = {}
    for tensor in model.graph.initializer:
        if tensor.name in repacked:
            continue
        array = numpy_helper.to_array(tensor)
        if array.nbytes >= MIN_SHARED_BYTES:
            arrays[tensor.name] = array
    return arrays


def _save_arrays(arrays: dict[str, Any], out: Path) -> None:
    import numpy as np

    names = {}
    for number, (name, array) in enumerate(arrays.items()):
        names[name] = f"{number}.npy"
        np.save(out / names[name], array)
    (out / _INDEX).write_text(json.dumps(names), encoding="utf-8")


def openvino_ir(graph: Path) -> Path:
    """The IR of the ONNX ``graph`` (``model.xml``, its weights in ``model.bin``), converted
    once beside it; ``graph`` itself where the folder cannot be written.

    The conversion reads the graph and writes it unchanged (no fp16 compression): the
    compiled model computes the same numbers from either."""
    folder = graph.with_name(graph.name.removesuffix(".onnx") + ".openvino")
    xml = folder / "model.xml"
    if xml.is_file():
        return xml

    def convert(out: Path) -> None:
        import openvino

        model = openvino.Core().read_model(str(graph))
        openvino.save_model(model, str(out / "model.xml"), compress_to_fp16=False)

    try:
        _write_once(folder, convert)
    except OSError:
        return graph
    return xml


def _write_once(folder: Path, make: Callable[[Path], None]) -> None:
    """``make`` a temporary folder beside ``folder`` and rename it into place (another
    process that got there first wins; its folder is as good).

    :raises OSError: when the parent cannot be written."""
    if folder.is_dir():
        return
    work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        make(work)
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not folder.is_dir():
        raise OSError(f"{folder.name} could not be written")


def release_pages(path: Path) -> int:
    """Drop this process's resident pages of every read-only mapping of ``path``, and map
    the ones read later one page at a time (Linux: ``/proc/self/maps`` and ``madvise``;
    elsewhere nothing); the bytes of the mappings.

    The pages stay in the page cache: a later read maps them again, with the same bytes. A
    writable mapping is left alone (dropping its pages would lose what was written)."""
    target = str(path.resolve())
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return 0
    name = ctypes.util.find_library("c")
    if name is None:
        return 0
    libc = ctypes.CDLL(name, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5] != target or "w" in fields[1]:
            continue
        start, end = (int(value, 16) for value in fields[0].split("-"))
        # Random reads: a page a batch reads is mapped alone, not with its neighbours (the
        # kernel maps up to 64 KB around a faulting page: 40 rows of an embedding table).
        libc.madvise(start, end - start, _MADV_RANDOM)
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            released += end - start
    return released
