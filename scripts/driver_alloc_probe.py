"""Does the driver allocate on several devices of one process in parallel? cuMemAlloc/cuMemFree
against the virtual memory API (cuMemCreate + cuMemMap + cuMemSetAccess), 1 device vs all at once."""
import ctypes as C, threading, time, sys, statistics
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: CUresult {r}")
ck(cu.cuInit(0), "cuInit")
n = C.c_int(); ck(cu.cuDeviceGetCount(C.byref(n)), "count"); N = n.value
GB = 1 << 30
SIZE = int(sys.argv[1]) * GB if len(sys.argv) > 1 else 32 * GB
CHUNK = int(sys.argv[2]) * GB if len(sys.argv) > 2 else SIZE
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Flags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32", C.c_void_p), ("allocFlags", Flags)]
class Access(C.Structure): _fields_ = [("location", Loc), ("flags", C.c_int)]
ctxs = []
for d in range(N):
    dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), d), "get")
    ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain"); ctxs.append(ctx)
def classic(d, out):
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    p = C.c_uint64()
    t = time.perf_counter(); ck(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(SIZE)), "alloc"); a = time.perf_counter() - t
    t = time.perf_counter(); ck(cu.cuMemFree_v2(p), "free"); f = time.perf_counter() - t
    out[d] = {"alloc": a, "free": f}
def vmm(d, out):
    ck(cu.cuCtxSetCurrent(ctxs[d]), "set")
    prop = Prop(1, 0, Loc(1, d), None, Flags())
    va = C.c_uint64()
    ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(SIZE), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)), "reserve")
    hs = []; r = {}
    t = time.perf_counter()
    for off in range(0, SIZE, CHUNK):
        h = C.c_uint64(); ck(cu.cuMemCreate(C.byref(h), C.c_size_t(CHUNK), C.byref(prop), C.c_ulonglong(0)), "create"); hs.append(h)
    r["create"] = time.perf_counter() - t; t = time.perf_counter()
    for i, h in enumerate(hs):
        ck(cu.cuMemMap(C.c_uint64(va.value + i * CHUNK), C.c_size_t(CHUNK), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
    r["map"] = time.perf_counter() - t; t = time.perf_counter()
    acc = Access(Loc(1, d), 3)
    ck(cu.cuMemSetAccess(va, C.c_size_t(SIZE), C.byref(acc), C.c_size_t(1)), "access")
    r["access"] = time.perf_counter() - t; t = time.perf_counter()
    ck(cu.cuMemUnmap(va, C.c_size_t(SIZE)), "unmap")
    r["unmap"] = time.perf_counter() - t; t = time.perf_counter()
    for h in hs: ck(cu.cuMemRelease(h), "release")
    r["release"] = time.perf_counter() - t
    ck(cu.cuMemAddressFree(va, C.c_size_t(SIZE)), "addrfree")
    out[d] = r
def run(fn, devs):
    out = {}; ts = [threading.Thread(target=fn, args=(d, out)) for d in devs]
    t = time.perf_counter(); [x.start() for x in ts]; [x.join() for x in ts]; wall = time.perf_counter() - t
    keys = out[devs[0]].keys()
    return wall, {k: max(out[d][k] for d in devs) for k in keys}
print(f"{N} devices, {SIZE/GB:.0f} GiB per device, VMM chunks of {CHUNK/GB:.0f} GiB")
for name, fn in [("cuMemAlloc/cuMemFree", classic), ("VMM create/map/access/unmap/release", vmm)]:
    fn(0, {})  # warm-up
    for devs in ([0], list(range(N))):
        rows = [run(fn, devs) for _ in range(5)]
        wall = statistics.median(r[0] for r in rows) * 1e3
        parts = {k: statistics.median(r[1][k] for r in rows) * 1e3 for k in rows[0][1]}
        print(f"{name}, {len(devs)} device(s): wall {wall:.1f} ms; " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
