"""The kernel runtime: sources, compilation, kernel signatures and launches. It knows no op.

Each package registers its own CUDA sources (``register``); a source names its instances in
groups (one group per element type, say), and each group is one NVRTC module, compiled the
first time one of its kernels is asked for on a device (``kernel``). So a call compiles only
the family, and the element type, that it runs.

The text that is compiled is the file with three things done to it:
- the ``#define`` lines of the source's Python constants (``Source.defines``) come first, so a
  constant that host and device share has one definition, in Python;
- each ``#include "name"`` line is replaced by that header's text (once per header), so that
  CuPy's compile cache, which keys on the text, sees every edit of a header;
- nothing else: the compile check (``cukernels.compile_check``) compiles the same text.

A kernel's parameters are read back from its declaration in that text (``signature``), so
the host packs every argument by name with the parameter's own type (a Python float for a
``float`` is rounded to float32, never passed as a double) and launches through
``cuLaunchKernel`` with one packed parameter block: no per-argument work in CuPy.
CuPy is imported lazily, so the packages import on machines without it.
"""
from __future__ import annotations

import ctypes
import operator
import os
import pathlib
import re
import struct
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

#: NVRTC options of every module (CuPy adds -ftz=true and the device's own -arch);
#: CK_LINEINFO=1 adds source line numbers, for compute-sanitizer's and ncu's reports
COMPILE_OPTIONS = ("--std=c++17",)
if os.environ.get("CK_LINEINFO") == "1":
    COMPILE_OPTIONS += ("-lineinfo",)


def _always(name: str, cc: int) -> bool:
    return True


@dataclass(eq=False)
class Source:
    """A kernel source file that a package registers.

    name        the file name (unique across packages), e.g. "activations.cu"
    directory   the folder it lies in; headers are looked for there, then among the
                registered headers (register_header)
    instances   () -> {group: instance names}: every template instance the package launches,
                in groups that compile as one module each (the compile check reads them too)
    defines     () -> {macro: value}: the constants rendered as #define lines
    launched_on (instance name, compute capability as 90) -> whether the package launches it
                there (the compile check counts register spills only where it does)
    """
    name: str
    directory: pathlib.Path
    instances: Callable[[], Mapping[str, Sequence[str]]]
    defines: Callable[[], Mapping[str, object]] = dict
    launched_on: Callable[[str, int], bool] = _always
    _groups: Mapping = field(default=None, repr=False)
    _group_of: dict = field(default=None, repr=False)

    @property
    def path(self) -> pathlib.Path:
        return self.directory / self.name

    def groups(self) -> Mapping:
        """{group: tuple of instance names}, worked out once (``rebuild`` forgets it); a
        read-only view: the modules compile from it."""
        if self._groups is None:
            self._groups = types.MappingProxyType(
                {g: tuple(names) for g, names in self.instances().items()})
            self._group_of = {n: g for g, names in self._groups.items() for n in names}
        return self._groups

    def names(self) -> tuple:
        return tuple(n for names in self.groups().values() for n in names)

    def group_of(self, name: str) -> str:
        self.groups()
        try:
            return self._group_of[name]
        except KeyError:
            raise KeyError(f"{name} is not a registered instance of {self.name}") from None

    def text(self) -> str:
        """The text that is compiled: rendered defines (those of the headers it includes,
        then its own), then the file with its headers pasted."""
        seen = []
        body = _paste(self.path.read_text(), self.directory, seen, self.name)
        values = {}
        for header in seen:
            values.update(_HEADERS[header][1]() if header in _HEADERS else {})
        values.update(self.defines())
        defines = "".join(f"#define {k} {v}\n" for k, v in values.items())
        head = f"// {self.name}, as cukernels.runtime compiles it\n"
        return head + (f"// constants rendered from Python\n{defines}" if defines else "") + body


_INCLUDE = re.compile(r'^[ \t]*#include\s+"([^"]+)"[ \t]*$', re.M)
#: headers that sources of any package may include: name -> (path, defines)
_HEADERS: dict = {}


def register_header(path, defines: Callable[[], Mapping[str, object]] = dict) -> None:
    """A header that any package's sources may include by its file name, with the constants
    it uses (rendered into every source that includes it)."""
    path = pathlib.Path(path)
    _HEADERS[path.name] = (path, defines)


def _paste(text, directory, seen, where):
    def one(m):
        name = m.group(1)
        if name in seen:
            return f"// ({name} pasted above)"
        p = pathlib.Path(directory) / name
        if not p.is_file():
            if name not in _HEADERS:
                raise FileNotFoundError(f"{where} includes {name}: not in {directory} and "
                                        "not a registered header")
            p = _HEADERS[name][0]
        seen.append(name)
        return _paste(p.read_text(), p.parent, seen, name)
    return _INCLUDE.sub(one, text)


_SOURCES: dict[str, Source] = {}


def register(source: Source) -> Source:
    """Add a package's source (once; a second source of the same name is an error)."""
    old = _SOURCES.get(source.name)
    if old is not None and old.path != source.path:
        raise ValueError(f"two kernel sources named {source.name}: {old.path} and {source.path}")
    _SOURCES[source.name] = source
    return source


def sources() -> dict[str, Source]:
    """The registered sources, by name (those of the packages imported so far)."""
    return dict(_SOURCES)


def source(name: str) -> Source:
    try:
        return _SOURCES[name]
    except KeyError:
        raise KeyError(f"no kernel source {name} is registered") from None


def declared_packages() -> list:
    """The modules that installed distributions declare as registering kernel sources."""
    from importlib import metadata
    return [ep.value for ep in metadata.entry_points(group="cukernels.kernel_sources")]


def discover() -> dict[str, Source]:
    """Import every package that declares kernel sources (entry-point group
    ``cukernels.kernel_sources`` of the installed distributions), then return them all."""
    from importlib import import_module, metadata
    for ep in metadata.entry_points(group="cukernels.kernel_sources"):
        import_module(ep.value)
    return sources()


# ----------------------------------------------------------------------------- signatures
#: struct format of each parameter kind (every parameter in its own 8-byte slot, little-endian:
#: what cuLaunchKernel reads through a pointer per parameter)
_SLOT = {"ptr": "Q", "i32": "i4x", "u32": "I4x", "i64": "q", "f32": "f4x", "f64": "d"}
_KIND = [(re.compile(p), k) for p, k in (
    (r"\*", "ptr"), (r"^(unsigned\s+long\s+long|long\s+long|long\s+long\s+int)$", "i64"),
    (r"^unsigned(\s+int)?$", "u32"), (r"^int$", "i32"), (r"^float$", "f32"),
    (r"^double$", "f64"), (r"^T$", "elem"))]
_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?"
                     r"(?:[A-Z_][A-Z0-9_]*\([^)]*\)\s*)?(\w+(?:\s*##\s*\w+)?)\s*\(")
_MACRO = re.compile(r"^[ \t]*#define[ \t]+(\w+)(\(([^)]*)\))?((?:[^\n]*\\\n)*[^\n]*)$", re.M)


def _balanced(text, start):
    """The text between the parenthesis at text[start - 1] and its match."""
    depth, i = 1, start
    while depth:
        c = text[i]
        depth += c == "("
        depth -= c == ")"
        i += 1
    return text[start:i - 1]


def _param(decl):
    """(name, kind) of one declared parameter, e.g. 'const T* __restrict__ gi'."""
    decl = re.sub(r"\b(const|__restrict__|volatile)\b", " ", decl)
    m = re.fullmatch(r"\s*(.*?)\s*\b(\w+)\s*", decl.replace("*", " * "))
    typ = re.sub(r"\s+", " ", m.group(1)).strip()
    for pattern, kind in _KIND:
        if pattern.search(typ):
            return m.group(2), kind
    raise ValueError(f"kernel parameter type {typ!r} ({decl.strip()}) is not supported")


def parse_signatures(text: str) -> dict[str, tuple]:
    """{kernel name: ((parameter name, kind), ...)} of every __global__ function in `text`:
    declared directly, with a parameter list held in an object-like macro, or in the body
    of a function-like macro whose invocations name the kernels (a body may declare
    several, named by a macro argument or by one pasted to a suffix, NAME##_multi)."""
    macros = {m.group(1): (m.group(3), m.group(4).replace("\\\n", " "))
              for m in _MACRO.finditer(text)}

    def params(inner):
        inner = inner.strip()
        if inner in macros and macros[inner][0] is None:
            inner = macros[inner][1]
        return tuple(_param(p) for p in inner.split(",") if p.strip())

    out = {}
    plain = _MACRO.sub("", text)
    for m in _GLOBAL.finditer(plain):
        out[m.group(1)] = params(_balanced(plain, m.end()))
    for name, (args, body) in macros.items():
        if args is None or "__global__" not in body:
            continue
        formal = [a.strip() for a in args.split(",")]
        calls = [c.group(1).split(",") for c in
                 re.finditer(rf"^[ \t]*{name}\(([^)]*)\)", plain, re.M)]
        for g in _GLOBAL.finditer(body):      # (a kernel named NAME or NAME##suffix)
            sig = params(_balanced(body, g.end()))
            formal_name, _, suffix = (t.strip() for t in g.group(1).partition("##"))
            slot = formal.index(formal_name)
            for call in calls:
                out[call[slot].strip() + suffix] = sig
    return out


def element_type(instance: str) -> str | None:
    """'float' or 'double', the first template argument of an instance name, if any."""
    m = re.match(r"\w+<\s*(float|double)\b", instance)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------- CuPy side
_CUPY = None


def cupy_module():
    """The cupy module, or None where it is not installed (looked up once)."""
    global _CUPY
    if _CUPY is None:
        try:
            import cupy
        except ImportError:
            return None
        if not hasattr(cupy, "ndarray"):
            return None     # (a folder named cupy in the working directory, not CuPy)
        _CUPY = cupy
    return _CUPY


_MAKER = threading.local()


def empty(shape, dtype):
    """A new, uninitialised cupy array on the current device: cupy.empty without its Python
    wrapper (measured 20% cheaper on the host), or what this thread's array maker makes
    (`made_by`). The calls' results come from here, and the GPU tests' poison fixture fills
    what it returns with NaN."""
    make = getattr(_MAKER, "make", None)
    if make is not None:
        return make(shape, dtype)
    return (_CUPY or cupy_module()).ndarray(shape, dtype)


#: a call's results of at most this many bytes together come from one allocation (empty_set);
#: 0 gives each result its own
SET_BYTES = 1 << 16
#: the offset of each array in such an allocation is a multiple of this many bytes
SET_ALIGN = 256
_SET_LAYOUTS: dict = {}


def _set_layout(shapes, dtype):
    """(offsets, total bytes) of `shapes` in one allocation (empty_set), or None where they
    take more than SET_BYTES together; kept per (shapes, dtype)."""
    key = (shapes, dtype)
    got = _SET_LAYOUTS.get(key, False)
    if got is False:
        itemsize, offsets, total = np.dtype(dtype).itemsize, [], 0
        for shape in shapes:
            n = itemsize
            for d in ((shape,) if isinstance(shape, int) else shape):
                n *= d
            offsets.append(total)
            total += -(-max(n, 1) // SET_ALIGN) * SET_ALIGN
        got = (tuple(offsets), total) if total <= SET_BYTES else None
        if len(_SET_LAYOUTS) < 4096:
            _SET_LAYOUTS[key] = got
    return got


def empty_set(dtype, shapes):
    """New uninitialised cupy arrays of `shapes` (a tuple of shape tuples), one per shape:
    where they take at most SET_BYTES together, arrays on one allocation (each at its own
    offset: an array keeps the allocation alive, so a small call's results free their memory
    together), which costs the host less than an allocation each (an array made on a given
    pointer skips the pool); else, or where this thread has an array maker (made_by), `empty`
    for each."""
    layout = None if len(shapes) < 2 or getattr(_MAKER, "make", None) is not None \
        else _set_layout(shapes, dtype)
    if layout is None:
        return tuple(empty(s, dtype) for s in shapes)
    cp = _CUPY or cupy_module()
    offsets, total = layout
    block = cp.cuda.alloc(total)
    nd = cp.ndarray
    return tuple(nd(s, dtype, block + o if o else block) for s, o in zip(shapes, offsets))


def made_by(make):
    """Let `make(shape, dtype)` make the arrays `empty` returns on this thread, until the
    returned function is called (it restores the maker before). For a framework that hands
    its own memory to the calls, so that their results are its tensors from the start."""
    previous = getattr(_MAKER, "make", None)
    _MAKER.make = make

    def restore():
        _MAKER.make = previous
    return restore


def gpu_available() -> bool:
    cp = cupy_module()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 (no driver, or no device)
        return False


_MODULES: dict = {}
_KERNELS: dict = {}
_SIGNATURES: dict = {}
#: seconds each module took to load the first time in this process, by (source, group):
#: the NVRTC compile, or a read from CuPy's disk cache
COMPILE_SECONDS: dict = {}
_LOCK = threading.Lock()


def signatures(source_name: str) -> dict:
    """The parameters of every kernel of a source, read from its compiled text."""
    sig = _SIGNATURES.get(source_name)
    if sig is None:
        sig = _SIGNATURES[source_name] = parse_signatures(source(source_name).text())
    return sig


def _module(src: Source, group: str, device_id: int):
    key = (src.name, group, device_id)
    mod = _MODULES.get(key)
    if mod is None:
        cp = cupy_module()
        t0 = time.perf_counter()
        mod = cp.RawModule(code=src.text(), options=COMPILE_OPTIONS,
                           name_expressions=src.groups()[group])
        mod.get_function(src.groups()[group][0])      # (compiles, or loads the cached binary)
        COMPILE_SECONDS.setdefault((src.name, group), time.perf_counter() - t0)
        _MODULES[key] = mod
    return mod


def kernel(source_name: str, name: str, params: tuple | None = None) -> "Kernel":
    """The compiled kernel `name` (a registered instance of `source_name`) on the current
    device, compiling its module the first time. `params`: the parameter names a caller
    that launches with positional values (Kernel.launch_values) expects, in order; checked
    against the kernel's declaration (an error if they differ)."""
    dev = (_CUPY or cupy_module()).cuda.runtime.getDevice()
    k = _KERNELS.get((source_name, name, dev))
    if k is not None and (params is None or params is k.checked):
        return k
    if k is None:
        with _LOCK:
            src = source(source_name)
            raw = _module(src, src.group_of(name), dev).get_function(name)
            base = name.split("<", 1)[0]
            params_ = signatures(source_name).get(base)
            if params_ is None:
                raise KeyError(f"{source_name} declares no kernel {base}")
            k = _KERNELS[(source_name, name, dev)] = Kernel(name, raw, params_)
    if params is not None:
        if tuple(params) != k.names:
            raise TypeError(f"{name}: launched with parameters {tuple(params)}, but it "
                            f"declares {k.names}")
        k.checked = params
    return k


_REBUILD_HOOKS: list = []


def on_rebuild(hook) -> None:
    """Call `hook()` at each rebuild: for a package that keeps what holds compiled code
    (cugru's CUDA graphs name the kernels they launch)."""
    if hook not in _REBUILD_HOOKS:
        _REBUILD_HOOKS.append(hook)


def rebuild() -> None:
    """Forget compiled modules, kernels, signatures and instance lists (after a tuning script
    changed a constant that the sources render or that decides the instances), and what the
    packages keep of them (on_rebuild)."""
    _MODULES.clear()
    _KERNELS.clear()
    _SIGNATURES.clear()
    for src in _SOURCES.values():
        src._groups = src._group_of = None
    for hook in _REBUILD_HOOKS:
        hook()


@dataclass(frozen=True)
class Device:
    """What the launch code asks of a device, read once."""
    id: int
    sms: int
    smem_optin: int
    cc: int


_DEVICES: dict = {}


def device(device_id: int | None = None) -> Device:
    cp = cupy_module()
    if device_id is None:
        device_id = cp.cuda.runtime.getDevice()
    d = _DEVICES.get(device_id)
    if d is None:
        dev = cp.cuda.Device(device_id)
        attrs = dev.attributes
        d = _DEVICES[device_id] = Device(
            device_id, attrs["MultiProcessorCount"], attrs["MaxSharedMemoryPerBlockOptin"],
            int(dev.compute_capability))
    return d


# ------------------------------------------------------------------------------- launches
#: per thread, one parameter block of _SLOTS 8-byte slots and the array of their addresses,
#: made once: a launch packs into it, and cuLaunchKernel copies it before returning
_BLOCKS = threading.local()
_SLOTS = 64


def _shared_block():
    blk = getattr(_BLOCKS, "block", None)
    if blk is None:
        buf = (ctypes.c_uint64 * _SLOTS)()
        base = ctypes.addressof(buf)
        addrs = (ctypes.c_void_p * _SLOTS)(*range(base, base + 8 * _SLOTS, 8))
        blk = _BLOCKS.block = (buf, ctypes.addressof(addrs), addrs)
    return blk


class Kernel:
    """A compiled kernel with its parameters (read from the source). ``launch`` takes the
    arguments by parameter name: device arrays (or None for a null pointer, or an int
    address) for pointers, numbers for the rest, each packed as its parameter's type."""

    __slots__ = ("name", "raw", "ptr", "params", "fmt", "_get", "_pointers", "_shared",
                 "_struct", "_codes", "names", "checked")

    def __init__(self, name, raw, params):
        self.name, self.raw, self.params = name, raw, params
        self.ptr = raw.kernel.ptr          # (a RawKernel holds its CUfunction in .kernel)
        elem = element_type(name)
        if len(params) > _SLOTS:
            raise ValueError(f"{name} has {len(params)} parameters; at most {_SLOTS}")
        kinds = [(("f32" if elem == "float" else "f64") if k == "elem" else k)
                 for _, k in params]
        if "elem" in (k for _, k in params) and elem is None:
            raise ValueError(f"{name}: parameters of type T, but no element type in the name")
        self.fmt = "<" + "".join(_SLOT[k] for k in kinds)
        self._struct = struct.Struct(self.fmt)
        self._codes = re.findall(r"[QiIqfd]", self.fmt)
        names = [n for n, _ in params]
        self._get = operator.itemgetter(*names) if len(names) > 1 else \
            (lambda a, n=names[0]: (a[n],))
        self._pointers = tuple(i for i, k in enumerate(kinds) if k == "ptr")
        self._shared = 0
        self.names = tuple(names)
        self.checked = None       # (the parameter names a positional caller was checked for)

    def values(self, args: Mapping) -> list:
        """The argument of each parameter, in order, pointers as addresses."""
        if len(args) != len(self.params):
            extra = sorted(set(args) - set(self.names))
            missing = [n for n in self.names if n not in args]
            raise TypeError(f"{self.name}: " + (f"unknown argument(s) {extra}" if extra else
                                                f"missing argument(s) {missing}"))
        try:
            vals = list(self._get(args))
        except KeyError as e:
            raise TypeError(f"{self.name}: missing argument {e.args[0]!r}") from None
        return self._addresses(vals)

    def _addresses(self, vals: list) -> list:
        """`vals` with each pointer parameter's array (or None) replaced by its address."""
        for i in self._pointers:
            v = vals[i]
            if v is None:
                vals[i] = 0
            elif type(v) is not int:
                vals[i] = v.data.ptr
        return vals

    def pack_into(self, buf, args: Mapping) -> None:
        """Pack the arguments into `buf` (8 bytes a parameter)."""
        try:
            self._struct.pack_into(buf, 0, *self.values(args))
        except struct.error as e:
            raise ValueError(f"{self.name}: an argument does not fit its parameter ({e})") \
                from None

    def allow_shared(self, nbytes: int) -> "Kernel":
        """Let the kernel take `nbytes` of dynamic shared memory (set once per size)."""
        if nbytes > self._shared:
            if nbytes > self.raw.max_dynamic_shared_size_bytes:
                self.raw.max_dynamic_shared_size_bytes = nbytes
            self._shared = nbytes
        return self

    def launch(self, grid, block, args: Mapping, *, shared_mem=0, cooperative=False,
               stream=None) -> None:
        """Launch on the current stream (or `stream`, a handle); `cooperative`: every block
        resident at once (the driver refuses a grid that does not fit), for a kernel with a
        barrier across blocks."""
        buf, addrs, _ = _shared_block()
        self.pack_into(buf, args)
        self._launch(grid, block, addrs, shared_mem, stream, cooperative)

    def launch_values(self, grid, block, values, *, shared_mem=0, stream=None) -> None:
        """Launch with `values` in the order of the parameters (pointers as int addresses),
        for a caller whose order kernel(..., params=) has checked: no dictionary per call."""
        buf, addrs, _ = _shared_block()
        try:
            self._struct.pack_into(buf, 0, *values)
        except struct.error as e:
            raise ValueError(f"{self.name}: the arguments do not fit the parameters "
                             f"{self.names} ({e})") from None
        self._launch(grid, block, addrs, shared_mem, stream, False)

    def launch_args(self, grid, block, values, *, shared_mem=0, stream=None) -> None:
        """launch_values with arrays (or None, a null pointer) in the pointer parameters: for
        a caller that keeps the parameters' order (checked once by kernel(..., params=)) and
        hands over its arrays, not their addresses."""
        self.launch_values(grid, block, self._addresses(list(values)), shared_mem=shared_mem,
                           stream=stream)

    def launch_1d(self, blocks, threads, values) -> None:
        """launch_values on a one-dimensional grid and block, on the current stream, with no
        shared memory: the elementwise and update kernels' launch, with the least host work."""
        buf, addrs, _ = getattr(_BLOCKS, "block", None) or _shared_block()
        try:
            self._struct.pack_into(buf, 0, *values)
        except struct.error as e:
            raise ValueError(f"{self.name}: the arguments do not fit the parameters "
                             f"{self.names} ({e})") from None
        launch_kernel, current_stream = _DRIVER or _driver()
        launch_kernel(self.ptr, blocks, 1, 1, threads, 1, 1, 0, current_stream().ptr, addrs, 0)

    def _launch(self, grid, block, addrs, shared_mem, stream, cooperative):
        """cuLaunchKernel (or its cooperative form) on the packed parameter block at addrs."""
        cp = _CUPY or cupy_module()
        n = len(grid)
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        n = len(block)
        bx, by, bz = block[0], block[1] if n > 1 else 1, block[2] if n > 2 else 1
        if stream is None:
            stream = cp.cuda.get_current_stream().ptr
        if cooperative:
            cp.cuda.driver.launchCooperativeKernel(self.ptr, gx, gy, gz, bx, by, bz,
                                                   shared_mem, stream, addrs)
        else:
            cp.cuda.driver.launchKernel(self.ptr, gx, gy, gz, bx, by, bz, shared_mem, stream,
                                        addrs, 0)

    def typed(self, args: Mapping) -> tuple:
        """The arguments as numpy scalars of each parameter's type, in order (pointers as
        64-bit addresses), for CuPy's own RawKernel call (the reference launch)."""
        return tuple(_NUMPY[c](v) for c, v in zip(self._codes, self.values(args)))


_DRIVER = None


def _driver():
    """(cuLaunchKernel's wrapper, the current-stream getter) of CuPy, looked up once."""
    global _DRIVER
    cp = cupy_module()
    _DRIVER = (cp.cuda.driver.launchKernel, cp.cuda.get_current_stream)
    return _DRIVER


_NUMPY = {"Q": np.uint64, "i": np.int32, "I": np.uint32, "q": np.int64, "f": np.float32,
          "d": np.float64}


def launch(source_name: str, name: str, grid, block, args: Mapping, **kw) -> None:
    """kernel(source_name, name).launch(grid, block, args, **kw)"""
    kernel(source_name, name).launch(grid, block, args, **kw)
