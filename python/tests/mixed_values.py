"""A device value with a small host frame beside its device frame, as cuDF's values have
(metadata on the host, columns on the device): used by test_dask_transfer_edges.py, imported by
reference on the worker processes (this directory is on their path), which registers its
Dask serializers there."""

from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
from distributed.protocol.serialize import dask_deserialize, dask_serialize

import rmm_rs


class Mixed:
    """``meta`` (host bytes) and ``buf`` (an ``rmm_rs.DeviceBuffer``)."""

    def __init__(self, meta, buf):
        self.meta = meta
        self.buf = buf

    @property
    def __cuda_array_interface__(self):
        return self.buf.__cuda_array_interface__


def _device_buffer(frame):
    if isinstance(frame, rmm_rs.DeviceBuffer):
        return frame
    cai = frame.__cuda_array_interface__
    return rmm_rs.DeviceBuffer.copy_of_device(cai["data"][0], cai["shape"][0])


@cuda_serialize.register(Mixed)
def _cuda_serialize(x):
    return {}, [x.meta, x.buf]


@cuda_deserialize.register(Mixed)
def _cuda_deserialize(header, frames):
    # The host frame is copied: the value itself keeps nothing of the message.
    return Mixed(bytes(frames[0]), _device_buffer(frames[1]))


@dask_serialize.register(Mixed)
def _dask_serialize(x):
    return {}, [x.meta, x.buf.to_bytes()]


@dask_deserialize.register(Mixed)
def _dask_deserialize(header, frames):
    return Mixed(bytes(frames[0]), rmm_rs.DeviceBuffer.from_bytes(frames[1]))
