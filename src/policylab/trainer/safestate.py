"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint's training state (optimizer and scheduler state dicts, every RNG state, the
task position, controller state, the queue of stale `RolloutBatch`es) is a tree of
dicts, lists, tuples, numbers, strings, tensors, numpy arrays and a few dataclasses.
`encode` splits such a tree into

    a JSON document   the structure and every non-tensor leaf
    a tensor table    name -> tensor, written with safetensors

and `decode` rebuilds the tree so that decode(*encode(x)) == x: same types (tuples stay
tuples, dict keys keep their type and order, ints stay ints, floats round-trip exactly,
NaN and +-inf included), same tensor dtypes, shapes and values.

Neither half can run code when it is read: JSON is parsed by `json.loads`, tensors by
safetensors. A dataclass is written as its type's short name and its fields, and read
back only if that name is in `ALLOWED_DATACLASSES` (an explicit table of classes; a name
found in a file is never imported). New fields of an allowed dataclass are carried
automatically (fields are enumerated with `dataclasses.fields`); a file naming a field
the class does not have is refused.

Encoding of a JSON node (every non-primitive is an object with exactly one `$` tag):

    null / true / false / int / str / finite float    themselves
    list                                              a JSON array
    {"$float": "nan" | "inf" | "-inf"}                a non-finite float
    {"$tuple": [...]}, {"$set": [...]}, {"$frozenset": [...]}
    {"$dict": {str: node}}                            a dict whose keys are all str
    {"$items": [[key node, value node], ...]}         any other dict (int keys ...)
    {"$odict": [[key node, value node], ...]}         a collections.OrderedDict
    {"$tensor": name}                                 a torch tensor (the tensor table; "device"
                                                      is added for a tensor that is not on the CPU)
    {"$ndarray": name, "dtype": str, "shape": [...]}  a numpy array (raw bytes as uint8)
    {"$npscalar": dtype, "hex": str}                  a numpy scalar (its raw bytes)
    {"$dtype": "float32"}                             a torch dtype
    {"$dataclass": name, "fields": {field: node}}     an allowed dataclass
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from policylab.errors import PolicylabError

FORMAT = "policylab-state/1"
JSON_NAME = "state.json"
TENSORS_NAME = "state.safetensors"

__all__ = [
    "FORMAT", "JSON_NAME", "TENSORS_NAME", "ALLOWED_DATACLASSES", "StateFormatError", "allow_dataclass",
    "encode", "decode", "save_state", "load_state",
]


class StateFormatError(PolicylabError):
    """A state file that is not valid policylab state (damaged, or not written by policylab)."""


def _default_dataclasses() -> dict[str, type]:
    from policylab.batch import RolloutBatch, SamplingSettings

    return {"RolloutBatch": RolloutBatch, "SamplingSettings": SamplingSettings}


ALLOWED_DATACLASSES: dict[str, type] = {}


def allow_dataclass(cls: type, name: str | None = None) -> type:
    """Allow instances of the dataclass `cls` in saved state (under `name`, default its
    class name). Returns `cls`, so it can be used as a decorator."""
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a dataclass type")
    key = name or cls.__name__
    if ALLOWED_DATACLASSES.get(key, cls) is not cls:
        raise ValueError(f"another dataclass is already allowed under the name {key!r}")
    ALLOWED_DATACLASSES[key] = cls
    return cls


def _allowed() -> dict[str, type]:
    if not ALLOWED_DATACLASSES:
        ALLOWED_DATACLASSES.update(_default_dataclasses())
    return ALLOWED_DATACLASSES


_DTYPES = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
                 "bfloat16", "float32", "float64", "complex64", "complex128")
    if isinstance(getattr(torch, name, None), torch.dtype)
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


# ---------------------------------------------------------------------------------- encode
class _Encoder:
    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_id: dict[int, str] = {}  # the same tensor object referenced twice is stored once
        self._storages: set[tuple[int, int]] = set()
        self._keep: list = []  # keeps encoded objects alive so their ids stay unique

    def tensor(self, t: torch.Tensor) -> str:
        if id(t) in self._by_id:
            return self._by_id[id(t)]
        if t.layout != torch.strided or t.is_quantized or t.is_meta:
            raise TypeError(f"cannot save a {t.layout} tensor (only dense tensors)")
        if t.dtype not in _DTYPE_NAMES:
            raise TypeError(f"cannot save a tensor of dtype {t.dtype}")
        out = t.detach().cpu()
        storage = (out.untyped_storage().data_ptr(), out.untyped_storage().nbytes())
        # safetensors stores each tensor on its own: views of a storage another entry uses,
        # and non-contiguous views, are copied (values unchanged)
        if not out.is_contiguous() or (storage in self._storages and storage[1] > 0):
            out = out.contiguous().clone()
        elif out.numel() and out.untyped_storage().nbytes() != out.numel() * out.element_size():
            out = out.clone()
        self._storages.add((out.untyped_storage().data_ptr(), out.untyped_storage().nbytes()))
        name = f"t{len(self.tensors)}"
        self.tensors[name] = out
        self._by_id[id(t)] = name
        self._keep.append(t)
        return name

    def node(self, x, where: str):
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) is int:
            return x
        if type(x) is float:
            if math.isfinite(x):
                return x
            return {"$float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, torch.Tensor):
            node = {"$tensor": self.tensor(x)}
            if x.device.type != "cpu":
                node["device"] = str(x.device)
            if x.requires_grad:
                node["requires_grad"] = True
            return node
        if isinstance(x, torch.dtype):
            if x not in _DTYPE_NAMES:
                raise TypeError(f"{where}: cannot save dtype {x}")
            return {"$dtype": _DTYPE_NAMES[x]}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "biufc":
                raise TypeError(f"{where}: cannot save a numpy array of dtype {x.dtype}")
            raw = np.ascontiguousarray(x)
            buf = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8) if raw.nbytes else torch.empty(0, dtype=torch.uint8)
            name = f"t{len(self.tensors)}"
            self.tensors[name] = buf
            return {"$ndarray": name, "dtype": raw.dtype.str, "shape": list(raw.shape)}
        if isinstance(x, np.generic):
            if x.dtype.kind not in "biufc":
                raise TypeError(f"{where}: cannot save a numpy scalar of dtype {x.dtype}")
            return {"$npscalar": x.dtype.str, "hex": x.tobytes().hex()}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            name = next((k for k, cls in _allowed().items() if type(x) is cls), None)
            if name is None:
                raise TypeError(
                    f"{where}: {type(x).__module__}.{type(x).__qualname__} is not an allowed dataclass "
                    "(policylab.trainer.safestate.allow_dataclass)"
                )
            return {"$dataclass": name,
                    "fields": {f.name: self.node(getattr(x, f.name), f"{where}.{f.name}") for f in dataclasses.fields(x)}}
        if type(x) is list:
            return [self.node(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if type(x) is tuple or isinstance(x, torch.Size):
            return {"$tuple": [self.node(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if type(x) in (set, frozenset):
            tag = "$set" if type(x) is set else "$frozenset"
            return {tag: [self.node(v, f"{where}{{}}") for v in x]}
        if type(x) is collections.OrderedDict:
            return {"$odict": [[self.node(k, f"{where} key"), self.node(v, f"{where}[{k!r}]")] for k, v in x.items()]}
        if type(x) is dict:
            if all(type(k) is str for k in x):
                return {"$dict": {k: self.node(v, f"{where}[{k!r}]") for k, v in x.items()}}
            return {"$items": [[self.node(k, f"{where} key"), self.node(v, f"{where}[{k!r}]")] for k, v in x.items()]}
        raise TypeError(f"{where}: cannot save a value of type {type(x).__module__}.{type(x).__qualname__}")


def encode(obj) -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON document, tensor table) of `obj`; raises TypeError for a value it cannot
    represent (the path to it is in the message)."""
    enc = _Encoder()
    root = enc.node(obj, "state")
    return {"format": FORMAT, "root": root}, enc.tensors


# ---------------------------------------------------------------------------------- decode
class _Decoder:
    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.used: dict[str, torch.Tensor] = {}

    def tensor(self, name) -> torch.Tensor:
        if not isinstance(name, str) or name not in self.tensors:
            raise StateFormatError(f"the state names tensor {name!r}, which the tensor file does not hold")
        return self.tensors[name]

    def node(self, x):
        """The Python value of one JSON node: plain JSON values as they are, a tagged
        object ({"$tag": value, ...}) through the reader of its tag; anything else refused."""
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.node(v) for v in x]
        if not isinstance(x, dict):
            raise StateFormatError(f"unexpected JSON value {x!r}")
        tags = [k for k in x if k.startswith("$")]
        if len(tags) != 1:
            raise StateFormatError(f"a state node must have exactly one $tag, got keys {sorted(x)}")
        reader = self.READERS.get(tags[0])
        if reader is None:
            raise StateFormatError(f"unknown state tag {tags[0]!r}")
        return reader(self, x[tags[0]], x)

    def _float(self, v, x):
        if v not in ("nan", "inf", "-inf"):
            raise StateFormatError(f"bad $float {v!r}")
        return float(v)

    def _dict(self, v, x):
        if not isinstance(v, dict):
            raise StateFormatError("$dict must hold an object")
        return {k: self.node(i) for k, i in v.items()}

    def _items(self, v, out, tag):
        for pair in _list(v, tag):
            if not isinstance(pair, list) or len(pair) != 2:
                raise StateFormatError("$items entries must be [key, value] pairs")
            out[self.node(pair[0])] = self.node(pair[1])
        return out

    def _tensor(self, v, x):
        t = self.tensor(v)
        if "device" in x:
            try:
                t = t.to(torch.device(str(x["device"])))
            except (RuntimeError, AssertionError, TypeError) as exc:
                raise StateFormatError(
                    f"the state holds tensors on {x['device']!r}, which this machine cannot use ({exc})") from None
        if x.get("requires_grad"):
            t = t.requires_grad_(True)
        return t

    def _dtype(self, v, x):
        if v not in _DTYPES:
            raise StateFormatError(f"unknown dtype {v!r}")
        return _DTYPES[v]

    def _ndarray(self, v, x):
        buf = self.tensor(v)
        try:
            dtype = np.dtype(x["dtype"])
            if dtype.kind not in "biufc":
                raise TypeError(dtype)
            shape = tuple(int(s) for s in x["shape"])
            return np.frombuffer(buf.numpy().tobytes(), dtype=dtype).reshape(shape).copy()
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFormatError(f"bad $ndarray node: {exc}") from None

    def _npscalar(self, v, x):
        try:
            dtype = np.dtype(v)
            if dtype.kind not in "biufc":
                raise TypeError(dtype)
            return np.frombuffer(bytes.fromhex(x["hex"]), dtype=dtype)[0]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StateFormatError(f"bad $npscalar node: {exc}") from None

    def _dataclass(self, v, x):
        cls = _allowed().get(v) if isinstance(v, str) else None
        if cls is None:
            raise StateFormatError(
                f"the state holds a dataclass named {v!r}, which is not an allowed type "
                f"(allowed: {', '.join(sorted(_allowed()))})"
            )
        fields = x.get("fields")
        if not isinstance(fields, dict):
            raise StateFormatError(f"$dataclass {v} has no fields object")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise StateFormatError(f"saved {v} has field(s) {unknown} that this version of {v} does not have")
        values = {k: self.node(i) for k, i in fields.items()}
        try:
            obj = cls(**{k: val for k, val in values.items() if known[k].init})
        except (TypeError, ValueError) as exc:
            raise StateFormatError(f"cannot rebuild {v}: {exc}") from None
        for k, val in values.items():
            if not known[k].init:
                object.__setattr__(obj, k, val)
        return obj

    # the one table of what a state file may hold: tag -> reader(self, value, node)
    READERS = {
        "$float": _float,
        "$tuple": lambda self, v, x: tuple(self.node(i) for i in _list(v, "$tuple")),
        "$set": lambda self, v, x: {self.node(i) for i in _list(v, "$set")},
        "$frozenset": lambda self, v, x: frozenset(self.node(i) for i in _list(v, "$frozenset")),
        "$dict": _dict,
        "$items": lambda self, v, x: self._items(v, {}, "$items"),
        "$odict": lambda self, v, x: self._items(v, collections.OrderedDict(), "$odict"),
        "$tensor": _tensor,
        "$dtype": _dtype,
        "$ndarray": _ndarray,
        "$npscalar": _npscalar,
        "$dataclass": _dataclass,
    }


def _list(v, tag):
    if not isinstance(v, list):
        raise StateFormatError(f"{tag} must hold an array")
    return v


def decode(doc: dict, tensors: dict[str, torch.Tensor]):
    """The object `encode` was given. Raises StateFormatError for anything else."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "root" not in doc:
        raise StateFormatError(f"not a {FORMAT} document (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    try:
        return _Decoder(tensors).node(doc["root"])
    except RecursionError:
        raise StateFormatError("the state document is nested too deeply") from None


# --------------------------------------------------------------------------------- files
def save_state(obj, directory: Path) -> list[Path]:
    """Write `obj` as directory/state.json + directory/state.safetensors; returns both paths.
    The caller makes the write atomic (the checkpoint directory is renamed into place)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    doc, tensors = encode(obj)
    jpath, tpath = directory / JSON_NAME, directory / TENSORS_NAME
    save_file(tensors, str(tpath), metadata={"format": FORMAT})
    jpath.write_text(json.dumps(doc, allow_nan=False, separators=(",", ":")))
    return [jpath, tpath]


def read_document(path: Path) -> dict:
    """Parse a state.json (no tensor reading). Raises StateFormatError naming the file."""
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise StateFormatError(f"{path} is damaged or not a state file ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StateFormatError(f"{path} is not a {FORMAT} file")
    return doc


def load_state(directory: Path):
    """Read what `save_state` wrote. Raises StateFormatError naming the damaged file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    jpath, tpath = directory / JSON_NAME, directory / TENSORS_NAME
    doc = read_document(jpath)
    try:
        tensors = load_file(str(tpath))
    except (SafetensorError, OSError) as exc:
        raise StateFormatError(f"{tpath} is damaged or truncated ({exc})") from None
    try:
        return decode(doc, tensors)
    except StateFormatError as exc:
        raise StateFormatError(f"{jpath}: {exc}") from None
