"""softrdma_coll: collectives over softrdma from Python.

A ctypes module over the C API of libsoftrdma_coll.so (include/softrdma_coll.h),
not a compiled extension: nothing to build beyond the Rust crate, no Python
headers, and it runs on any CPython 3 (see docs/collectives.md, "Python").
Buffers are anything with the buffer protocol: NumPy arrays, array.array,
bytearray, memoryview. Their type comes from the buffer's format (float32,
float64, float16, int32, int64, uint8) or the ``dtype=`` argument
(``BF16`` has no buffer format: pass ``dtype=BF16`` with uint16 storage).

    from mpi4py import MPI
    import softrdma_coll
    comm = softrdma_coll.Communicator.from_mpi4py(MPI.COMM_WORLD)
    comm.all_reduce(grad)                  # in place, sum
    comm.all_reduce(x, op=softrdma_coll.MAX, out=y)

The library is found at $SOFTRDMA_COLL_LIB, else next to this file's
repository build (target/release), else by the loader (LD_LIBRARY_PATH).
"""

import ctypes
import os
import socket

F32, F64, F16, BF16, I32, I64, U8 = range(7)
SUM, PROD, MIN, MAX, AVG = range(5)
_SIZES = {F32: 4, F64: 8, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}


class Error(RuntimeError):
    """A softrdma_coll call failed (the library's reason in the message)."""


def _find_lib():
    p = os.environ.get("SOFTRDMA_COLL_LIB")
    if p:
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    for t in (os.environ.get("CARGO_TARGET_DIR"), os.path.join(root, "target")):
        if t:
            c = os.path.join(t, "release", "libsoftrdma_coll.so")
            if os.path.exists(c):
                return c
    return "libsoftrdma_coll.so"


_lib = ctypes.CDLL(_find_lib())
_P = ctypes.c_void_p
_lib.softrdma_coll_init.restype = _P
_lib.softrdma_coll_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]
_lib.softrdma_coll_finalize.argtypes = [_P]
_lib.softrdma_coll_finalize.restype = None
for _f in ("rank", "size", "in_network"):
    getattr(_lib, "softrdma_coll_" + _f).argtypes = [_P]
    getattr(_lib, "softrdma_coll_" + _f).restype = ctypes.c_int
_lib.softrdma_coll_set_algorithm.argtypes = [_P, ctypes.c_char_p]
_lib.softrdma_coll_all_reduce.argtypes = [_P, _P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_lib.softrdma_coll_broadcast.argtypes = [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_lib.softrdma_coll_barrier.argtypes = [_P]
_lib.softrdma_coll_last_error.restype = ctypes.c_char_p


def _check(rc):
    if rc != 0:
        raise Error(_lib.softrdma_coll_last_error().decode(errors="replace"))


def _dtype_of(mv, dtype):
    if dtype is not None:
        if dtype not in _SIZES:
            raise ValueError(f"dtype {dtype!r}: use F32, F64, F16, BF16, I32, I64 or U8")
        if mv.itemsize != _SIZES[dtype] and mv.format not in ("B", "b", "c"):
            raise ValueError(f"a {mv.itemsize}-byte buffer item for a {_SIZES[dtype]}-byte type")
        return dtype
    fmt = mv.format.lstrip("@=<")
    table = {"f": F32, "d": F64, "e": F16, "B": U8}
    if fmt in table:
        return table[fmt]
    if fmt in ("i", "l", "q", "h") and mv.itemsize in (4, 8):
        return I32 if mv.itemsize == 4 else I64
    raise ValueError(f"buffer format {mv.format!r} has no softrdma_coll type (pass dtype=)")


def _view(buf, writable):
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("buffer is not contiguous")
    if writable and mv.readonly:
        raise ValueError("buffer is read-only")
    return mv


def _addr(mv):
    """The address of a buffer's first byte (keeps a ctypes view alive)."""
    if mv.nbytes == 0:
        return None, None
    if mv.readonly:
        keep = ctypes.create_string_buffer(mv.tobytes(), mv.nbytes)
    else:
        keep = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    return ctypes.addressof(keep), keep


class Communicator:
    """Ranks joined by softrdma RC queue pairs (softrdma_coll::Communicator)."""

    def __init__(self, rank=None, size=None, rendezvous=None, aggd=None):
        """rank=None: rank, size and rendezvous from the launcher's variables."""
        r = -1 if rank is None else int(rank)
        n = 0 if size is None else int(size)
        rdv = rendezvous.encode() if rendezvous else None
        agg = aggd.encode() if aggd else None
        h = _lib.softrdma_coll_init(r, n, rdv, agg)
        if not h:
            raise Error(_lib.softrdma_coll_last_error().decode(errors="replace"))
        self._h = h

    @classmethod
    def from_mpi4py(cls, comm, aggd=None, host="127.0.0.1"):
        """Rank and size from an mpi4py communicator; rank 0 picks a free
        port on `host` and broadcasts the rendezvous address over MPI."""
        addr = None
        if comm.Get_rank() == 0:
            s = socket.socket()
            s.bind((host, 0))
            addr = f"{host}:{s.getsockname()[1]}"
            s.close()
        addr = comm.bcast(addr, root=0)
        return cls(comm.Get_rank(), comm.Get_size(), addr, aggd)

    def _handle(self):
        if not self._h:
            raise Error("communicator closed")
        return self._h

    @property
    def rank(self):
        return _lib.softrdma_coll_rank(self._handle())

    @property
    def size(self):
        return _lib.softrdma_coll_size(self._handle())

    @property
    def in_network(self):
        """True when "innetwork" all-reduces go to the aggregation service."""
        return bool(_lib.softrdma_coll_in_network(self._handle()))

    def set_algorithm(self, name=None):
        """"ring", "rhd", "tree", "innetwork", or None (automatic)."""
        _check(_lib.softrdma_coll_set_algorithm(self._handle(), name.encode() if name else None))

    def all_reduce(self, buf, op=SUM, out=None, dtype=None):
        """Reduces every rank's `buf` into `out` (default: `buf`, in place); returns it."""
        if out is None:
            mv = _view(buf, True)
            d = _dtype_of(mv, dtype)
            p, keep = _addr(mv)
            _check(_lib.softrdma_coll_all_reduce(self._handle(), p, p, mv.nbytes // _SIZES[d], d, op))
            del keep
            return buf
        src, dst = _view(buf, False), _view(out, True)
        d = _dtype_of(src, dtype)
        if _dtype_of(dst, dtype) != d or src.nbytes != dst.nbytes:
            raise ValueError("buf and out differ in type or length")
        (ps, ks), (pd, kd) = _addr(src), _addr(dst)
        _check(_lib.softrdma_coll_all_reduce(self._handle(), ps, pd, src.nbytes // _SIZES[d], d, op))
        del ks, kd
        return out

    def broadcast(self, buf, root=0, dtype=None):
        """Root's `buf` to every rank, in place; returns it."""
        mv = _view(buf, True)
        d = _dtype_of(mv, dtype)
        p, keep = _addr(mv)
        _check(_lib.softrdma_coll_broadcast(self._handle(), p, mv.nbytes // _SIZES[d], d, root))
        del keep
        return buf

    def barrier(self):
        _check(_lib.softrdma_coll_barrier(self._handle()))

    def close(self):
        if getattr(self, "_h", None):
            _lib.softrdma_coll_finalize(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
