"""How fast a process can pin host memory for spilling, one device and several at once: each way
of getting pinned memory (anonymous memory faulted in then `cuMemHostRegister`ed, with and
without PORTABLE, in chunks of several sizes; `cuMemHostAlloc`; host memory from the virtual
memory API, `cuMemCreate` on the host's NUMA node), timed with one thread for device 0 and with
one thread per device at once, then a device → host copy into it to show it is pinned. Also the
rates a pageable spill tier would have: the driver's own device → pageable copy, and host memcpy.

    python3 scripts/pin_probe.py [GIB_PER_DEVICE (8)] [DEVICES (all)]
"""
import ctypes as C
import os
import sys
import threading
import time

cu = C.CDLL("libcuda.so.1")
libc = C.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = C.c_void_p
libc.mmap.argtypes = [C.c_void_p, C.c_size_t, C.c_int, C.c_int, C.c_int, C.c_long]
libc.munmap.argtypes = [C.c_void_p, C.c_size_t]
libc.madvise.argtypes = [C.c_void_p, C.c_size_t, C.c_int]
libc.memset.argtypes = [C.c_void_p, C.c_int, C.c_size_t]
libc.memcpy.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t]
MIB, GIB = 1 << 20, 1 << 30


def ck(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


ck(cu.cuInit(0), "cuInit")
n = C.c_int()
ck(cu.cuDeviceGetCount(C.byref(n)), "count")
GIB_PER = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
NDEV = min(int(sys.argv[2]), n.value) if len(sys.argv) > 2 else n.value
BYTES = int(GIB_PER * GIB)
ctxs = []
for d in range(NDEV):
    dev = C.c_int()
    ck(cu.cuDeviceGet(C.byref(dev), d), "get")
    ctx = C.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
    ctxs.append(ctx)
# CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134
numa = []
for d in range(NDEV):
    v = C.c_int(-1)
    r = cu.cuDeviceGetAttribute(C.byref(v), 134, d)
    numa.append(v.value if r == 0 else -1)
print(f"{NDEV} devices, host NUMA node per device {numa}, {GIB_PER:g} GiB each", flush=True)


def anon(nbytes):
    p = libc.mmap(None, nbytes + 2 * MIB, 3, 0x22, -1, 0)
    if p in (None, C.c_void_p(-1).value):
        raise MemoryError(nbytes)
    start = (p + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
    libc.madvise(start, nbytes, 14)  # MADV_HUGEPAGE
    return p, start


def fault(start, nbytes, threads=8):
    part = (nbytes + threads - 1) // threads
    ts = [threading.Thread(target=libc.memset, args=(start + o, 0, min(part, nbytes - o)))
          for o in range(0, nbytes, part)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def copy_rate(d, host, size=GIB):
    """Device → host copies of `size` bytes (within one pinned range) into `host`, GB/s."""
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    dp = C.c_uint64()
    ck(cu.cuMemAlloc_v2(C.byref(dp), C.c_size_t(size)), "alloc")
    ck(cu.cuMemcpyDtoH_v2(C.c_void_p(host), dp, C.c_size_t(size)), "warm copy")
    reps = max(3, (3 * GIB) // size)
    t = time.perf_counter()
    for _ in range(reps):
        ck(cu.cuMemcpyDtoH_v2(C.c_void_p(host), dp, C.c_size_t(size)), "copy")
    dt = time.perf_counter() - t
    ck(cu.cuMemFree_v2(dp), "free")
    return reps * size / dt / 1e9


def register(d, flags, chunk):
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    p, start = anon(BYTES)
    t0 = time.perf_counter()
    fault(start, BYTES)
    t1 = time.perf_counter()
    for o in range(0, BYTES, chunk):
        ck(cu.cuMemHostRegister_v2(C.c_void_p(start + o), C.c_size_t(min(chunk, BYTES - o)),
                                   flags), "register")
    t2 = time.perf_counter()
    rate = copy_rate(d, start, min(chunk, GIB))

    def undo():
        for o in range(0, BYTES, chunk):
            ck(cu.cuMemHostUnregister(C.c_void_p(start + o)), "unregister")
        libc.munmap(p, BYTES + 2 * MIB)
    return (t1 - t0, t2 - t1, rate, undo)


def hostalloc(d, chunk):
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    ps = []
    t0 = time.perf_counter()
    for o in range(0, BYTES, chunk):
        p = C.c_void_p()
        ck(cu.cuMemHostAlloc(C.byref(p), C.c_size_t(min(chunk, BYTES - o)), 1), "hostalloc")
        ps.append(p)
    t1 = time.perf_counter()
    rate = copy_rate(d, ps[0].value, min(chunk, GIB))

    def undo():
        for p in ps:
            ck(cu.cuMemFreeHost(p), "freehost")
    return (0.0, t1 - t0, rate, undo)


def vmm_host(d, chunk, loc_type):
    """cuMemCreate of host memory (type 3: HOST_NUMA on the device's node; 2: HOST), mapped,
    made accessible to every device and the host."""
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    node = max(numa[d], 0) if loc_type == 3 else 0
    prop = Prop(1, 0, Loc(loc_type, node), None, Flags())
    gran = C.c_size_t()
    ck(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "granularity")
    chunk = max(chunk, gran.value)
    va = C.c_uint64()
    t0 = time.perf_counter()
    ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(BYTES), C.c_size_t(0), C.c_uint64(0),
                              C.c_ulonglong(0)), "reserve")
    hs = []
    for o in range(0, BYTES, chunk):
        h = C.c_uint64()
        ck(cu.cuMemCreate(C.byref(h), C.c_size_t(chunk), C.byref(prop), C.c_ulonglong(0)),
           "create")
        ck(cu.cuMemMap(C.c_uint64(va.value + o), C.c_size_t(chunk), C.c_size_t(0), h,
                       C.c_ulonglong(0)), "map")
        hs.append(h)
    descs = (Access * (NDEV + 1))(*[Access(Loc(1, i), 3) for i in range(NDEV)],
                                  Access(Loc(loc_type, node), 3))
    ck(cu.cuMemSetAccess(C.c_uint64(va.value), C.c_size_t(BYTES), descs, C.c_size_t(NDEV + 1)),
       "access")
    t1 = time.perf_counter()
    libc.memset(va.value, 1, 4096)  # the host can touch it
    rate = copy_rate(d, va.value)

    def undo():
        ck(cu.cuMemUnmap(C.c_uint64(va.value), C.c_size_t(BYTES)), "unmap")
        for h in hs:
            ck(cu.cuMemRelease(h), "release")
        ck(cu.cuMemAddressFree(C.c_uint64(va.value), C.c_size_t(BYTES)), "free va")
    return (0.0, t1 - t0, rate, undo)


def trial(name, f, devices):
    res = [None] * len(devices)

    def one(i, d):
        try:
            res[i] = f(d)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            res[i] = e
    t = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(devices)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    wall = time.perf_counter() - t
    errs = [r for r in res if isinstance(r, Exception)]
    if errs:
        print(f"{name:42s} x{len(devices)}: FAILED {errs[0]}", flush=True)
        for r in res:
            if not isinstance(r, Exception):
                r[3]()
        return
    fa = max(r[0] for r in res)
    pin = max(r[1] for r in res)
    rates = " ".join(f"{r[2]:.0f}" for r in res)
    total = len(devices) * BYTES / GIB
    print(f"{name:42s} x{len(devices)}: {total:5.0f} GiB in {wall:6.2f} s = "
          f"{total / wall:5.1f} GiB/s (fault {fa:.2f} s, driver {pin:.2f} s); "
          f"D2H GB/s {rates}", flush=True)
    for r in res:
        r[3]()


def pageable(devices):
    """The driver's device → pageable copy, 1 GiB three times per device at once."""
    bufs = []
    for d in devices:
        p, start = anon(GIB)
        fault(start, GIB)
        bufs.append((p, start))
    rates = [0.0] * len(devices)

    def one(i, d):
        rates[i] = copy_rate(d, bufs[i][1])
    ts = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(devices)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    for p, _ in bufs:
        libc.munmap(p, GIB + 2 * MIB)
    print(f"{'device -> pageable copy':42s} x{len(devices)}: GB/s per device "
          + " ".join(f"{r:.1f}" for r in rates), flush=True)


def memcpy_rate(threads):
    size = 2 * GIB
    bufs = []
    for _ in range(threads):
        a = anon(size)
        b = anon(size)
        fault(a[1], size, 1)
        fault(b[1], size, 1)
        bufs.append((a, b))
    t = time.perf_counter()
    ts = [threading.Thread(target=libc.memcpy, args=(b[1], a[1], size)) for a, b in bufs]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    dt = time.perf_counter() - t
    for a, b in bufs:
        libc.munmap(a[0], size + 2 * MIB)
        libc.munmap(b[0], size + 2 * MIB)
    print(f"{'host memcpy 2 GiB per thread':42s} x{threads}: {threads * size / dt / 1e9:.1f} GB/s",
          flush=True)


for path in ("/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/kernel/mm/transparent_hugepage/defrag"):
    try:
        print(path, open(path).read().strip())
    except OSError as e:
        print(path, e)
print("kernel", os.uname().release, "cpus", os.cpu_count(), flush=True)
alld = list(range(NDEV))
for devs in ([0], alld) if NDEV > 1 else ([0],):
    trial("register PORTABLE, 32 MiB chunks", lambda d: register(d, 1, 32 * MIB), devs)
    trial("register PORTABLE, 1 GiB chunks", lambda d: register(d, 1, GIB), devs)
    trial("register flags 0, 32 MiB chunks", lambda d: register(d, 0, 32 * MIB), devs)
    trial("cuMemHostAlloc PORTABLE, 256 MiB", lambda d: hostalloc(d, 256 * MIB), devs)
    trial("cuMemCreate HOST_NUMA, 256 MiB", lambda d: vmm_host(d, 256 * MIB, 3), devs)
    trial("cuMemCreate HOST, 256 MiB", lambda d: vmm_host(d, 256 * MIB, 2), devs)
    pageable(devs)
for th in (1, 4, 16):
    memcpy_rate(th)
# The first trials pay for the host's memory growing as it is first touched: repeat the first.
trial("register PORTABLE, 32 MiB chunks (again)", lambda d: register(d, 1, 32 * MIB), alld)
