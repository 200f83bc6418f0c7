"""Weights mapped from the engine cache (:mod:`batching.models.engines.mapped_weights`): the
runners of two thread counts hold one copy of the weights, and compute what they computed
with copies of their own, on a small hand-made ONNX graph (an embedding table gathered by
token id, then a matrix product)."""

from __future__ import annotations

import gc
import mmap
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from batching.models.engines import mapped_weights
from batching.models.engines.mapped_weights import openvino_ir, ort_initializers, release_pages
from batching.models.engines.openvino_engine import OpenVinoRunner
from batching.models.engines.ort_engine import OnnxRuntimeRunner

VOCAB, WIDTH, OUT = 512, 128, 64  # a 256 KB table: shared (64 KB or more)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    weight = rng.standard_normal((WIDTH, OUT)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
        helper.make_node("MatMul", ["rows", "weight"], ["output"]),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "tiny",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", OUT])],
            [
                numpy_helper.from_array(table, "table"),
                numpy_helper.from_array(weight, "weight"),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path_factory.mktemp("graph") / "model.onnx"
    onnx.save(model, str(path))
    return path


def ids(batch: int = 3, length: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + length)
    return {"input_ids": rng.integers(0, VOCAB, (batch, length), dtype=np.int64)}


def own_copy(graph: Path, threads: int) -> np.ndarray:
    """What a session with weights of its own computes."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    output: np.ndarray = session.run(None, ids())[0]
    return output


def mapped_rss_kb(path: Path) -> int:
    """This process's resident kB of its mappings of ``path``."""
    target, inside, total = str(path.resolve()), False, 0
    with open("/proc/self/smaps", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and fields[0][0] in "0123456789abcdef":
                inside = len(fields) >= 6 and fields[5] == target
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_two_onnx_runtime_sessions_of_one_graph_read_one_mapped_embedding_table(
    graph: Path,
) -> None:
    two, one = OnnxRuntimeRunner(graph, 2), OnnxRuntimeRunner(graph, 1)
    assert two.shared is one.shared
    assert set(two.shared.values) == {"table"}  # the MatMul's weight is repacked: not shared
    value = two.shared.values["table"]
    array = two.shared.arrays["table"]
    assert isinstance(array, np.memmap)
    assert value.data_ptr() == array.ctypes.data  # read in place, not copied
    assert (graph.parent / "model.shared" / "index.json").is_file()
    np.testing.assert_array_equal(two(ids()), own_copy(graph, 2))
    np.testing.assert_array_equal(one(ids()), own_copy(graph, 1))


def test_a_cache_folder_that_cannot_be_written_shares_the_initializers_in_memory(
    graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "model.onnx"
    copy.write_bytes(graph.read_bytes())

    def refused(folder: Path, make: object) -> None:
        raise OSError("read-only")

    monkeypatch.setattr(mapped_weights, "_write_once", refused)
    two, one = OnnxRuntimeRunner(copy, 2), OnnxRuntimeRunner(copy, 1)
    assert two.shared is one.shared
    assert not isinstance(two.shared.arrays["table"], np.memmap)
    assert not (tmp_path / "model.shared").exists()
    np.testing.assert_array_equal(one(ids()), own_copy(graph, 1))


def test_the_shared_initializers_are_let_go_with_the_last_session_that_reads_them(
    graph: Path,
) -> None:
    runner = OnnxRuntimeRunner(graph, 1)
    held = weakref.ref(runner.shared)
    del runner
    gc.collect()
    assert held() is None
    assert ort_initializers(graph).values["table"] is not None  # read again when asked


def test_openvino_serves_from_an_ir_converted_once_and_computes_what_the_onnx_graph_does(
    graph: Path,
) -> None:
    xml = openvino_ir(graph)
    assert xml == graph.parent / "model.openvino" / "model.xml"
    assert xml.with_suffix(".bin").is_file()
    written = xml.stat().st_mtime_ns
    assert openvino_ir(graph) == xml and xml.stat().st_mtime_ns == written
    from_onnx = OpenVinoRunner(graph, "fp32", 2)
    from_ir = OpenVinoRunner(xml, "fp32", 2)
    assert from_ir.weights == xml.with_suffix(".bin") and from_onnx.weights is None
    np.testing.assert_array_equal(from_ir(ids()), from_onnx(ids()))


def test_two_openvino_thread_counts_map_one_weights_file_and_drop_its_pages_when_released(
    graph: Path,
) -> None:
    xml = openvino_ir(graph)
    two = OpenVinoRunner(xml, "fp32", 2)
    one = two.on_threads(1)
    assert one.model is two.model and one.weights == two.weights
    before = two(ids()), one(ids())
    assert mapped_rss_kb(xml.with_suffix(".bin")) > 0
    two.release_memory()
    assert mapped_rss_kb(xml.with_suffix(".bin")) == 0
    np.testing.assert_array_equal(two(ids()), before[0])
    np.testing.assert_array_equal(one(ids()), before[1])


def test_releasing_pages_leaves_a_writable_mapping_and_its_bytes_alone(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"\0" * mmap.PAGESIZE * 4)
    with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        mapped[:5] = b"kept!"
        assert release_pages(path) == 0
        assert mapped[:5] == b"kept!"
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as read:
        assert read[:5] == b"kept!"
        assert release_pages(path) == mmap.PAGESIZE * 4
        assert read[:5] == b"kept!"
