"""Dask serializers for rmm-rs buffers, and a "cuda" serializer for PyTorch tensors.

* ``rmm_rs.DeviceBuffer`` and ``rmm_rs.SpillableBuffer`` travel between workers as device
  frames with Dask's "cuda" family (over UCX and other transports that carry device memory)
  and as host frames with the "dask" family; both also pickle through host bytes.
* ``torch.Tensor`` on a CUDA device gets a "cuda" serializer (Distributed has only a host
  one), so a worker's device store can spill and rebuild tensors without a host round trip
  through NumPy.

Importing ``rmm_rs`` in a process that already imported Distributed registers these (every
Dask worker does, before it unpickles a value of these types).
"""

from typing import Any, Dict, List, Tuple

from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
from distributed.protocol.serialize import dask_deserialize, dask_serialize

from .. import _rmm_rs

DeviceBuffer = _rmm_rs.DeviceBuffer
SpillableBuffer = _rmm_rs.SpillableBuffer
DeviceView = _rmm_rs.DeviceView


def device_extent(obj: Any) -> Tuple[int, int]:
    """``(address, nbytes)`` of a contiguous object with ``__cuda_array_interface__``."""
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    itemsize = int(cai["typestr"][2:])
    n = itemsize
    for s in shape:
        n *= s
    strides = cai.get("strides")
    if strides is not None and n > 0:
        expected: List[int] = []
        step = itemsize
        for s in reversed(shape):
            expected.append(step)
            step *= s
        if tuple(reversed(expected)) != tuple(strides):
            raise ValueError(
                f"a device frame must be contiguous; got shape {shape} and strides {strides}"
            )
    return int(cai["data"][0]), n


def _device_buffer_of(frame: Any, device: int = 0) -> "_rmm_rs.DeviceBuffer":
    """A ``rmm_rs.DeviceBuffer`` holding ``frame``: itself, a zero-copy buffer over a
    ``DeviceView``, or a device copy of any other device object (a received UCX frame)."""
    if isinstance(frame, DeviceBuffer):
        return frame
    if isinstance(frame, DeviceView):
        return DeviceBuffer.over_view(frame, device)
    ptr, n = device_extent(frame)
    return DeviceBuffer.copy_of_device(ptr, n, device)


@cuda_serialize.register(DeviceBuffer)
def _cuda_serialize_device_buffer(x: Any) -> Tuple[Dict[str, Any], List[Any]]:
    return {"device": x.device, "nbytes": x.size}, [x]


@cuda_deserialize.register(DeviceBuffer)
def _cuda_deserialize_device_buffer(header: Dict[str, Any], frames: List[Any]) -> Any:
    (frame,) = frames
    return _device_buffer_of(frame, header.get("device", 0))


@dask_serialize.register(DeviceBuffer)
def _dask_serialize_device_buffer(x: Any) -> Tuple[Dict[str, Any], List[Any]]:
    return {"device": x.device, "nbytes": x.size}, [x.to_bytes()]


@dask_deserialize.register(DeviceBuffer)
def _dask_deserialize_device_buffer(header: Dict[str, Any], frames: List[Any]) -> Any:
    (frame,) = frames
    return DeviceBuffer.from_bytes(frame, header.get("device", 0))


@cuda_serialize.register(SpillableBuffer)
def _cuda_serialize_spillable_buffer(x: Any) -> Tuple[Dict[str, Any], List[Any]]:
    return {"device": x.device, "nbytes": x.size}, [x.device_view()]


@cuda_deserialize.register(SpillableBuffer)
def _cuda_deserialize_spillable_buffer(header: Dict[str, Any], frames: List[Any]) -> Any:
    (frame,) = frames
    ptr, n = device_extent(frame)
    return SpillableBuffer.copy_of_device(ptr, n, header.get("device", 0))


@dask_serialize.register(SpillableBuffer)
def _dask_serialize_spillable_buffer(x: Any) -> Tuple[Dict[str, Any], List[Any]]:
    return {"device": x.device, "nbytes": x.size}, [x.to_bytes()]


@dask_deserialize.register(SpillableBuffer)
def _dask_deserialize_spillable_buffer(header: Dict[str, Any], frames: List[Any]) -> Any:
    (frame,) = frames
    return SpillableBuffer(frame, header.get("device", 0))


@cuda_serialize.register_lazy("torch")
def _register_torch() -> None:
    import torch

    @cuda_serialize.register(torch.Tensor)
    def _cuda_serialize_torch_tensor(t: Any) -> Tuple[Dict[str, Any], List[Any]]:
        if t.device.type != "cuda":
            raise NotImplementedError("a tensor on the host: Dask's own serializer takes it")
        if t.requires_grad or t.grad is not None:
            raise NotImplementedError("a tensor with autograd state: Dask's own serializer")
        c = t.contiguous()
        header = {
            "shape": tuple(c.shape),
            "dtype": str(c.dtype).removeprefix("torch."),
            "device": c.device.index or 0,
        }
        return header, [c.reshape(-1).view(torch.uint8)]

    @cuda_deserialize.register(torch.Tensor)
    def _cuda_deserialize_torch_tensor(header: Dict[str, Any], frames: List[Any]) -> Any:
        (frame,) = frames
        dtype = getattr(torch, header["dtype"])
        raw = torch.as_tensor(frame, device=f"cuda:{header['device']}")
        return raw.view(dtype).reshape(header["shape"])
