# One C++ client mode under the bridge, for strace/perf: python3 .bridge_probe.py MODE N
import ctypes, sys, time
import rmm.mr
import rmm_rs
from rmm_rs.allocators import rmm as rr
rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "4GiB"}})
bridge = rr.resource(0)
rmm.mr.set_per_device_resource(0, bridge)
lib = ctypes.CDLL("/tmp/librmm_client.so")
args = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_size_t]
mode, n = sys.argv[1], int(sys.argv[2])
f = getattr(lib, mode)
f.argtypes = args
err = ctypes.create_string_buffer(256)
sec = ctypes.c_double()
f(1, 1000, ctypes.byref(sec), err, 256)
t = time.perf_counter()
rc = f(1, n, ctypes.byref(sec), err, 256)
print(mode, rc, err.value, f"{sec.value / n * 1e9:.0f} ns per op", flush=True)
