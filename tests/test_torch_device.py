"""DistDataset(..., add_device=): shares in device memory, registered with libfabric (FI_HMEM).

Here (no GPU) the device code path runs on host memory: DDSTORE_TEST_HOST_AS_DEVICE=1 makes
add_device="cpu" a CPU tensor registered through fi_mr_regattr as FI_HMEM_SYSTEM memory, read
like a GPU share (own rows with torch, other ranks' rows through the fabric, forked workers all
rows through the fabric). The GPU tests run the same checks on torch.cuda and skip without one."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import core_group_and_reader, run_mpi

import pyddstore

torch = pytest.importorskip("torch")
_native = pytest.importorskip("pyddstore._native")

METHODS = set(getattr(_native, "METHODS", ()))
HOST_AS_DEVICE = {"DDSTORE_TEST_HOST_AS_DEVICE": "1", "DDSTORE_FORK_WORKERS": "1"}
CPU = ("--add-device", "cpu")
no_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU (torch.cuda.is_available() is False)"
)


def needs(method: int):
    return pytest.mark.skipif(method not in METHODS, reason=f"method {method} is not in this build")


# -- host memory as device memory: the whole path on this machine's fabric -----------------


@needs(1)
def test_host_as_device_tcp():
    # 3 ranks: remote reads from two peers, uneven shares, a rank with no sample of a small source.
    env = {**HOST_AS_DEVICE, "DDSTORE_FABRIC": "tcp"}
    run_mpi(3, "torch_device.py", "--method", "1", *CPU, env=env, timeout=600)


@needs(1)
def test_host_as_device_shm_hmem_domain():
    # shm offers FI_HMEM: DDSTORE_OFI_HMEM=1 opens the FI_HMEM domain GPU shares use.
    env = {**HOST_AS_DEVICE, "DDSTORE_FABRIC": "shm", "DDSTORE_OFI_HMEM": "1"}
    run_mpi(2, "torch_device.py", "--method", "1", *CPU, "--part", "items", env=env, timeout=600)


@needs(1)
def test_provider_without_hmem_is_refused():
    # tcp;ofi_rxm has no FI_HMEM in libfabric 1.17: a clear error on every rank.
    env = {**HOST_AS_DEVICE, "DDSTORE_FABRIC": "tcp", "DDSTORE_OFI_HMEM": "1"}
    proc = run_mpi(2, "torch_device.py", "--method", "1", *CPU, "--part", "items", env=env, expect_ok=False)
    assert proc.returncode != 0
    assert "FI_HMEM" in proc.stderr and "add_device" in proc.stderr, proc.stderr[-3000:]


@needs(0)
def test_method0_refuses_device_shares():
    run_mpi(2, "torch_device.py", "--method", "0", *CPU, "--part", "method0", env=HOST_AS_DEVICE)


@needs(2)
def test_host_as_device_method2_reader(handshake_dir):
    """A core group of two plain processes with device shares, read by a separate job."""
    env = {"DDSTORE_FORK_WORKERS": "1", "DDSTORE_HANDSHAKE_DIR": str(handshake_dir), "DDSTORE_MPI": "0"}
    core_group_and_reader("torch_device_m2.py", handshake_dir, env, {"DDSTORE_TEST_HOST_AS_DEVICE": "1"})


def _single(monkeypatch, host_as_device: bool = True):
    monkeypatch.setenv("DDSTORE_MPI", "0")
    monkeypatch.setenv("DDSTORE_QUIET", "1")
    monkeypatch.delenv("DDSTORE_COMM", raising=False)
    monkeypatch.delenv("DDSTORE_METHOD", raising=False)
    if host_as_device:
        monkeypatch.setenv("DDSTORE_TEST_HOST_AS_DEVICE", "1")
    else:
        monkeypatch.delenv("DDSTORE_TEST_HOST_AS_DEVICE", raising=False)
    from pyddstore.torch import DistDataset

    return DistDataset


def test_one_process_store_reads_its_share_on_the_device(monkeypatch):
    DistDataset = _single(monkeypatch)
    x = torch.arange(40, dtype=torch.float64).reshape(10, 4)
    src = torch.utils.data.TensorDataset(x, torch.arange(10) % 3 == 0)
    ds = DistDataset(src, "single-dev", add_device="cpu")
    try:
        (share,) = [s for s in ds._device_shares.values() if s.tensor.shape[1] == 32]
        assert share.count == 10 and share.tensor.device.type == "cpu"
        for i in range(10):
            got = ds[i]
            assert torch.equal(got[0], x[i]) and bool(got[1]) == (i % 3 == 0)
        got = ds.read_rows([9, 0, 9])
        assert torch.equal(got[0], x[[9, 0, 9]])
        # The DeviceShare owns the tensor and reads: own rows gathered on the device, or left to
        # gather_own (device to device) with own=False.
        assert isinstance(share, pyddstore.DeviceShare) and share.start == 0 and share.row_bytes == 32
        buf = np.full((2, 4), -1.0)
        share.read(buf, np.array([1, 2]), own=False)
        assert (buf == -1).all()
        share.read(buf, np.array([1, 2]))
        assert (buf == x[[1, 2]].numpy()).all()
        t = torch.full((3, 4), -1.0, dtype=torch.float64)
        share.gather_own(t, np.array([7, 0, 7]))
        assert torch.equal(t, x[[7, 0, 7]])
        share.write(np.full((1, 4), 5.0), 3)
        assert torch.equal(ds[3][0], torch.full((4,), 5.0))
        with pytest.raises(pyddstore.DDStoreIndexError, match="do not fit"):
            share.write(np.zeros((2, 4)), 9)
        with pytest.raises(pyddstore.DDStoreIndexError):
            share.read(buf, np.array([1, 10]))
        # The torch layer reads through the share only: the store refuses no host read here
        # (system memory), and there is no private own_rows switch any more.
        with pytest.raises(TypeError):
            ds.ddstore.get_batch(f"{ds.name}/0", buf, np.array([1, 2]), own_rows="skip")
        assert ds.get_profile()["local_rows"] >= 10
    finally:
        ds.free()


def test_add_device_errors(monkeypatch):
    from pyddstore import DDStoreValueError

    DistDataset = _single(monkeypatch, host_as_device=False)
    src = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    with pytest.raises(DDStoreValueError, match="needs a GPU device"):
        DistDataset(src, "cpu-dev", add_device="cpu")
    with pytest.raises(DDStoreValueError, match="chunk_size"):
        DistDataset(src, "chunked", add_device="cpu", chunk_size=2)
    with pytest.raises(DDStoreValueError, match="not supported"):
        DistDataset(src, "meta", add_device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(DDStoreValueError, match="torch.cuda is not available"):
            DistDataset(src, "no-gpu", add_device="cuda")


# -- real GPUs --------------------------------------------------------------------------------


@no_gpu
def test_gpu_one_process(monkeypatch):
    DistDataset = _single(monkeypatch, host_as_device=False)
    x = torch.randn(50, 3, 5)
    src = torch.utils.data.TensorDataset(x, torch.arange(50))
    ds = DistDataset(src, "gpu-single", add_device="cuda", device="cuda")
    try:
        for share in ds._device_shares.values():
            assert share.tensor.is_cuda
        got = ds.__getitems__([49, 0, 7, 7])
        for j, i in enumerate([49, 0, 7, 7]):
            assert got[j][0].is_cuda and torch.equal(got[j][0].cpu(), x[i])
        # The native layer refuses to memcpy from device memory.
        from pyddstore import DDStoreUnsupportedError

        buf = np.zeros((1, 3, 5), dtype=np.float32)
        with pytest.raises(DDStoreUnsupportedError, match="device memory"):
            ds.ddstore.get_batch(f"{ds.name}/0", buf, np.array([3]))
    finally:
        ds.free()


@no_gpu
@needs(1)
@pytest.mark.parametrize("n", [2, 4])
def test_gpu_shares_method1(n):
    # The fabric must offer FI_HMEM (cxi, verbs with CUDA/ROCm support): DDSTORE_FABRIC as set.
    env = {"DDSTORE_FORK_WORKERS": "1", "DDSTORE_TEST_HOST_AS_DEVICE": None}
    run_mpi(n, "torch_device.py", "--method", "1", "--add-device", "cuda", env=env, timeout=600)


@no_gpu
@needs(0)
def test_gpu_method0_refused():
    env = {"DDSTORE_TEST_HOST_AS_DEVICE": None}
    run_mpi(2, "torch_device.py", "--method", "0", "--add-device", "cuda", "--part", "method0", env=env)
