"""What each virtual-memory driver call costs per pool chunk (the pool's footprint limit maps and
gives back memory in 2 MiB chunks): cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and
cuMemRelease timed chunk by chunk on device 0, and a chunk unmapped and mapped again elsewhere
(moved) against one released and created anew.

    python3 scripts/vmm_chunk_probe.py [CHUNK_MIB (2)] [CHUNKS (512)]
"""
import ctypes as C, sys, time, statistics
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise RuntimeError(f"{what}: CUresult {r}")
MIB = 1 << 20
CHUNK = (int(sys.argv[1]) if len(sys.argv) > 1 else 2) * MIB
N = int(sys.argv[2]) if len(sys.argv) > 2 else 512
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Flags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32", C.c_void_p), ("allocFlags", Flags)]
class Access(C.Structure): _fields_ = [("location", Loc), ("flags", C.c_int)]
ck(cu.cuInit(0), "cuInit")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "get")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "set")
prop = Prop(1, 0, Loc(1, 0), None, Flags()); acc = Access(Loc(1, 0), 3)
SPAN = 2 * N * CHUNK
va = C.c_uint64(); ck(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(SPAN), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)), "reserve")
at = lambda i: C.c_uint64(va.value + i * CHUNK)
def timed(f):
    t = time.perf_counter(); f(); return (time.perf_counter() - t) * 1e6
def one_round():
    r = {k: [] for k in ("create", "map", "access", "unmap", "release", "move", "anew")}
    hs = []
    for i in range(N):
        h = C.c_uint64(); r["create"].append(timed(lambda: ck(cu.cuMemCreate(C.byref(h), C.c_size_t(CHUNK), C.byref(prop), C.c_ulonglong(0)), "create"))); hs.append(h)
        r["map"].append(timed(lambda: ck(cu.cuMemMap(at(i), C.c_size_t(CHUNK), C.c_size_t(0), h, C.c_ulonglong(0)), "map")))
        r["access"].append(timed(lambda: ck(cu.cuMemSetAccess(at(i), C.c_size_t(CHUNK), C.byref(acc), C.c_size_t(1)), "access")))
    ck(cu.cuCtxSynchronize(), "sync")
    for i, h in enumerate(hs):  # moved: unmapped, mapped at the other half, made accessible
        r["move"].append(timed(lambda: (ck(cu.cuMemUnmap(at(i), C.c_size_t(CHUNK)), "unmap"),
                                        ck(cu.cuMemMap(at(N + i), C.c_size_t(CHUNK), C.c_size_t(0), h, C.c_ulonglong(0)), "map"),
                                        ck(cu.cuMemSetAccess(at(N + i), C.c_size_t(CHUNK), C.byref(acc), C.c_size_t(1)), "access"))))
    for i, h in enumerate(hs):  # released and made anew at the first half
        def anew():
            ck(cu.cuMemUnmap(at(N + i), C.c_size_t(CHUNK)), "unmap"); ck(cu.cuMemRelease(h), "release")
            ck(cu.cuMemCreate(C.byref(h), C.c_size_t(CHUNK), C.byref(prop), C.c_ulonglong(0)), "create")
            ck(cu.cuMemMap(at(i), C.c_size_t(CHUNK), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
            ck(cu.cuMemSetAccess(at(i), C.c_size_t(CHUNK), C.byref(acc), C.c_size_t(1)), "access")
        r["anew"].append(timed(anew))
    for i, h in enumerate(hs):
        r["unmap"].append(timed(lambda: ck(cu.cuMemUnmap(at(i), C.c_size_t(CHUNK)), "unmap")))
        r["release"].append(timed(lambda: ck(cu.cuMemRelease(h), "release")))
    return r
one_round()  # warm-up
rows = [one_round() for _ in range(3)]
print(f"device 0, {N} chunks of {CHUNK // MIB} MiB, µs per chunk (median over {3 * N}; mean beside)")
for k in rows[0]:
    v = [x for r in rows for x in r[k]]
    print(f"  {k:8s} {statistics.median(v):8.1f}  {statistics.mean(v):8.1f}")
# The same chunks mapped side by side, made accessible and unmapped with one call each.
for _ in range(3):
    hs = []
    for i in range(N):
        h = C.c_uint64(); ck(cu.cuMemCreate(C.byref(h), C.c_size_t(CHUNK), C.byref(prop), C.c_ulonglong(0)), "create"); hs.append(h)
        ck(cu.cuMemMap(at(i), C.c_size_t(CHUNK), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
    a = timed(lambda: ck(cu.cuMemSetAccess(at(0), C.c_size_t(N * CHUNK), C.byref(acc), C.c_size_t(1)), "access"))
    u = timed(lambda: ck(cu.cuMemUnmap(at(0), C.c_size_t(N * CHUNK)), "unmap"))
    for h in hs: ck(cu.cuMemRelease(h), "release")
    print(f"  {N} chunks at once: access {a / N:.1f} µs per chunk ({a:.0f} in all), unmap {u / N:.1f} ({u:.0f})")
