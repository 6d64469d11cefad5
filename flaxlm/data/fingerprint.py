"""A fingerprint of what a function computes, for a cache key: flaxlm.data.rows keys its cached token rows by the
fingerprint of the row function, so that editing the function (in a copied script, or a helper it calls)
makes the rows anew.

    key = fingerprint(functools.partial(my_rows, tokenizer=tok, length=128))   # a hex string

What counts, recursively:
- a function: its bytecode, constants (nested functions' code too), the names it reads, its argument layout,
  defaults, closure values and the globals it reads: project functions and classes by their code, plain
  constants by value, modules by the attributes the code names. "Project" is any code not installed as a
  library: the flaxlm package, the scripts and their copies. Library code (numpy, transformers, the
  standard library) counts by module, name and version only: its own code is not read.
- a functools.partial: the function and its bound arguments; a bound method: the function and its object;
  an instance of a project class: its class and its attributes.
- a tokenizer: its tokenizer.json without the call-time truncation/padding state, and its special tokens;
  a numpy array: dtype, shape and bytes; any other library object: datasets' Hasher (its pickled state).

Stable across processes and runs: nothing taken from id() or memory addresses goes in (an object met twice is
described twice alike; a reference back to an object being described, a cycle, by how many levels up it
closes); dicts and sets are sorted by the description of their keys or items (set order changes with
PYTHONHASHSEED); file names and line numbers are left out (a copy of a script elsewhere, or a line added above a
function, keeps the key). What does change it: a docstring (a constant of its function), another Python
version (other bytecode), and a global the function reads that holds other values when the key is made.
"""
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import sysconfig
import types

import numpy as np
from datasets.fingerprint import Hasher

_PRIMITIVES = (type(None), bool, int, float, complex, str, type(Ellipsis))
_LIBRARY_DIRS = tuple(sorted({os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "")
                              for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_CLASS_SKIPS = {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"}


def fingerprint(obj) -> str:
    """Hex digest of `obj` as described in the module docstring."""
    text = json.dumps(_Describer().describe(obj), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def is_library(module_name) -> bool:
    """True for modules installed as libraries (site-packages, the standard library, built-in modules);
    False for flaxlm, a script run as __main__ and any other module outside those directories."""
    name = module_name or "__main__"
    top = name.split(".")[0]
    if top in ("flaxlm", "__main__"):
        return False
    if top in sys.builtin_module_names:
        return True
    module = sys.modules.get(name) or sys.modules.get(top)
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or ()), None)
    return where is not None and os.path.realpath(where).startswith(_LIBRARY_DIRS)


def _library(module_name, qualname):
    top = (module_name or "").split(".")[0]
    return ["library", module_name, qualname, _version(top)]


@functools.cache
def _version(top):
    version = getattr(sys.modules.get(top), "__version__", None)
    if isinstance(version, str):
        return version
    dists = importlib.metadata.packages_distributions().get(top)
    return importlib.metadata.version(dists[0]) if dists else platform.python_version()


class _Describer:
    """Turns an object into nested lists of plain values (JSON) for `fingerprint`."""

    def __init__(self):
        self.done = {}  # id(obj) -> its description, reused where obj comes again
        self.path = []  # id(obj) of the objects being described, outermost first (a cycle leads back to one)
        self.open_modules = []  # names of the modules being described
        self.alive = []  # every object met, kept alive so that no id is reused during one description

    def describe(self, obj, names=()):
        if isinstance(obj, _PRIMITIVES):
            return [type(obj).__name__, repr(obj)]
        if isinstance(obj, bytes):
            return ["bytes", hashlib.sha256(obj).hexdigest()]
        if isinstance(obj, types.ModuleType):
            return self._module(obj, names)
        key = id(obj)
        if key in self.path:  # a cycle: how many levels up it closes
            return ["cycle", len(self.path) - self.path.index(key)]
        if key not in self.done:
            self.path.append(key)
            self.alive.append(obj)
            try:
                self.done[key] = self._new(obj)
            finally:
                self.path.pop()
        return self.done[key]

    def _new(self, obj):
        if isinstance(obj, (list, tuple)):
            return [type(obj).__name__, [self.describe(x) for x in obj]]
        if isinstance(obj, dict):
            return ["dict", self._sorted([[self.describe(k), self.describe(v)] for k, v in obj.items()])]
        if isinstance(obj, (set, frozenset)):
            return [type(obj).__name__, self._sorted([self.describe(x) for x in obj])]
        if isinstance(obj, functools.partial):
            return ["partial", self.describe(obj.func), self.describe(obj.args), self.describe(obj.keywords)]
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, types.CodeType):
            return self._code(obj)
        if isinstance(obj, types.MethodType):
            return ["method", self.describe(obj.__func__), self.describe(obj.__self__)]
        if isinstance(obj, (staticmethod, classmethod)):
            return [type(obj).__name__, self.describe(obj.__func__)]
        if isinstance(obj, property):
            return ["property", self.describe(obj.fget), self.describe(obj.fset)]
        if isinstance(obj, types.BuiltinFunctionType):
            owner = obj.__self__
            bound = owner is not None and not isinstance(owner, types.ModuleType)
            return ["builtin", obj.__qualname__, self.describe(owner) if bound else obj.__module__]
        if isinstance(obj, type):
            return self._class(obj)
        return self._instance(obj)

    def _sorted(self, described):
        return sorted(described, key=lambda d: json.dumps(d, separators=(",", ":")))

    def _module(self, module, names):
        """A library module by name and version; a project module by the attributes `names` (the names the
        code that reads it uses) picks out of it."""
        if is_library(module.__name__):
            return _library(module.__name__, None)
        if module.__name__ in self.open_modules:  # met again on the way down: how many modules up
            return ["module cycle", len(self.open_modules) - self.open_modules.index(module.__name__)]
        self.open_modules.append(module.__name__)
        try:
            return ["module", {n: self.describe(vars(module)[n], names) for n in sorted(names) if n in vars(module)}]
        finally:
            self.open_modules.pop()

    def _function(self, fn):
        if is_library(fn.__module__):
            return _library(fn.__module__, fn.__qualname__)
        names = _names_read(fn.__code__)
        cells = [c.cell_contents if _filled(c) else ["empty cell"] for c in fn.__closure__ or ()]
        read = {n: self.describe(fn.__globals__[n], names) for n in sorted(names) if n in fn.__globals__}
        return ["function", self._code(fn.__code__), self.describe(fn.__defaults__),
                self.describe(fn.__kwdefaults__), self.describe(cells), read]

    def _code(self, code):
        consts = [self._code(c) if isinstance(c, types.CodeType) else self.describe(c) for c in code.co_consts]
        return ["code", code.co_code.hex(), consts, list(code.co_names), list(code.co_varnames),
                list(code.co_freevars), list(code.co_cellvars), code.co_argcount, code.co_posonlyargcount,
                code.co_kwonlyargcount, code.co_flags]

    def _class(self, cls):
        if is_library(cls.__module__):
            return _library(cls.__module__, cls.__qualname__)
        members = {k: v for k, v in vars(cls).items() if k not in _CLASS_SKIPS and _counts_in_class(v)}
        return ["class", cls.__qualname__, [self.describe(b) for b in cls.__bases__], self.describe(members)]

    def _instance(self, obj):
        if _is_tokenizer(obj):
            return ["tokenizer", self._tokenizer(obj)]
        if isinstance(obj, np.ndarray):
            return ["ndarray", obj.dtype.str, list(obj.shape), hashlib.sha256(np.ascontiguousarray(obj)).hexdigest()]
        if not is_library(type(obj).__module__) and hasattr(obj, "__dict__"):
            return ["object", self.describe(type(obj)), self.describe(vars(obj))]
        return ["hashed", type(obj).__module__, type(obj).__qualname__, Hasher.hash(obj)]

    def _tokenizer(self, tokenizer):
        """tokenizer.json without the truncation/padding state a call leaves behind, and the special tokens."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "to_str"):  # a slow (Python) tokenizer
            return Hasher.hash(tokenizer)
        spec = json.loads(backend.to_str())
        spec["truncation"] = spec["padding"] = None
        special = getattr(tokenizer, "special_tokens_map", {})
        return [hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest(), self.describe(special)]


def _names_read(code):
    """Every name the code (and the code of the functions defined in it) reads as a global or an attribute."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _names_read(c)
    return names


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:  # a variable of the enclosing function not assigned yet
        return False
    return True


def _counts_in_class(value):
    """Members of a project class that say what it computes: its functions and plain constants."""
    return isinstance(value, (types.FunctionType, staticmethod, classmethod, property, *_PRIMITIVES,
                              bytes, tuple, list, dict, frozenset, set))


def _is_tokenizer(obj):
    """A transformers tokenizer or a tokenizers.Tokenizer (checked without importing either)."""
    transformers, tokenizers = sys.modules.get("transformers"), sys.modules.get("tokenizers")
    return ((transformers is not None and isinstance(obj, transformers.PreTrainedTokenizerBase))
            or (tokenizers is not None and isinstance(obj, tokenizers.Tokenizer)))
