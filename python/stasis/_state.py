"""Turning a training state (nested dicts, lists and tuples of torch
tensors, NumPy arrays and small Python values) into named buffers plus a
JSON description of its structure, and back.

The description is a tree kept in the checkpoint's manifest:
  {"dict": [[key, node], ...]}   keys are str or int, in order
  {"list": [node, ...]}, {"tuple": [node, ...]}
  {"v": None | bool | int | str}, {"f": float} (or "nan", "inf", "-inf")
  {"np_scalar": dtype.str, "v": value}
  {"tensor": name, "lib": "torch" | "numpy", "dtype": stasis dtype,
   "type": torch dtype name or NumPy dtype.str, "shape": [...], "device": "cpu" | "cuda:N"}
A tensor's name is its key path, each key percent-encoded, joined by "/"
(int keys start with "#")."""

import math
import string

_SAFE = set(string.ascii_letters + string.digits + "_.-")

_TORCH_DTYPES = {
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
}

_NUMPY_KINDS = {  # (kind, itemsize) -> stasis dtype
    ("b", 1): "bool", ("i", 1): "int8", ("u", 1): "uint8", ("i", 2): "int16", ("u", 2): "uint16",
    ("i", 4): "int32", ("u", 4): "uint32", ("i", 8): "int64", ("u", 8): "uint64",
    ("f", 2): "fp16", ("f", 4): "fp32", ("f", 8): "fp64", ("c", 8): "complex64", ("c", 16): "complex128",
}


def _torch():
    import sys
    return sys.modules.get("torch")


def _numpy():
    import sys
    return sys.modules.get("numpy")


def is_torch_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_numpy_array(x):
    np = _numpy()
    return np is not None and isinstance(x, np.ndarray)


def path_text(path):
    """state['a'][3]: how a key path is named in errors."""
    return "state" + "".join(f"[{k!r}]" for k in path)


def _encode_key(k):
    if isinstance(k, int):
        return "#" + str(k)
    if k and k.strip(".") == "":
        return "%2E" * len(k)
    if k == "":
        return "%"
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in k)


def tensor_name(path):
    try:
        name = "/".join(_encode_key(k) for k in path) or "_"
    except UnicodeEncodeError:
        raise TypeError(f"{path_text(path)}: a key is not valid Unicode text") from None
    if len(name) > _MAX_NAME:
        raise TypeError(f"{path_text(path)}: the key path is too long ({len(name)} bytes encoded, at most {_MAX_NAME})")
    return name


_MAX_NAME = 4096  # the store's limit on an entry's name


class Leaf:
    """A buffer to save: its name, and the object whose memory holds it."""

    __slots__ = ("name", "dtype", "shape", "obj", "device", "nbytes", "path")

    def __init__(self, name, dtype, shape, obj, device, nbytes, path):
        self.name, self.dtype, self.shape, self.obj = name, dtype, shape, obj
        self.device, self.nbytes, self.path = device, nbytes, path

    def pointer(self):
        """(host address, device address)."""
        if self.nbytes == 0:
            return None, 0
        if is_torch_tensor(self.obj):
            if self.obj.is_cuda:
                return None, self.obj.data_ptr()
            return self.obj.data_ptr(), 0
        return self.obj.ctypes.data, 0


def _torch_leaf(t, path):
    torch = _torch()
    name = str(t.dtype).replace("torch.", "")
    dtype = _TORCH_DTYPES.get(name)
    if dtype is None:
        raise TypeError(f"{path_text(path)}: torch dtype {t.dtype} is not supported")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{path_text(path)}: tensors on {t.device} are not supported (cpu or cuda)")
    if t.layout != torch.strided:
        raise TypeError(f"{path_text(path)}: {t.layout} tensors are not supported (dense tensors only)")
    data = t.detach().resolve_conj().resolve_neg()  # lazily conjugated or negated views: their values
    if not data.is_contiguous():
        data = data.contiguous()
    device = "cpu" if data.device.type == "cpu" else f"cuda:{data.device.index}"
    shape = list(data.shape)
    node = {"tensor": tensor_name(path), "lib": "torch", "dtype": dtype, "type": name, "shape": shape, "device": device}
    return node, Leaf(node["tensor"], dtype, shape, data, device, data.numel() * data.element_size(), path)


def _numpy_leaf(a, path):
    np = _numpy()
    dtype = _NUMPY_KINDS.get((a.dtype.kind, a.dtype.itemsize))
    if dtype is None or a.dtype.fields is not None:
        raise TypeError(f"{path_text(path)}: NumPy dtype {a.dtype} is not supported")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    shape = list(a.shape)
    node = {"tensor": tensor_name(path), "lib": "numpy", "dtype": dtype, "type": a.dtype.str, "shape": shape, "device": "cpu"}
    return node, Leaf(node["tensor"], dtype, shape, a, "cpu", a.nbytes, path)


def _float_node(x):
    if math.isnan(x):
        return {"f": "nan"}
    if math.isinf(x):
        return {"f": "inf" if x > 0 else "-inf"}
    return {"f": x}


def _identity(x):
    """What makes two tensors or arrays the same buffer, seen the same way:
    saved once, they load back as one object (tied weights stay tied)."""
    if is_torch_tensor(x):
        return ("torch", str(x.device), x.data_ptr(), str(x.dtype), tuple(x.shape), tuple(x.stride()), x.storage_offset())
    return ("numpy", x.__array_interface__["data"][0], x.dtype.str, x.shape, x.strides)


def flatten(state):
    """Returns (tree, leaves) for a state; TypeError names the key path of
    the first object it cannot keep. An object met twice (the same tensor
    under two keys) is saved once; both nodes name it."""
    leaves = []
    seen_buffers = {}
    np = _numpy()

    def tensor(x, path, make):
        key = _identity(x)
        if key in seen_buffers:
            return dict(seen_buffers[key])
        node, leaf = make(x, path)
        leaves.append(leaf)
        if leaf.nbytes:  # empty ones may all share one address
            seen_buffers[key] = node
        return node

    def walk(x, path):
        if np is not None and isinstance(x, np.generic):  # before float: np.float64 is one
            return numpy_scalar(x, path)
        if x is None or isinstance(x, (bool, str)):
            return {"v": x}
        if isinstance(x, int):
            return {"v": int(x)}
        if isinstance(x, float):
            return _float_node(float(x))
        if is_torch_tensor(x):
            return tensor(x, path, _torch_leaf)
        if np is not None and isinstance(x, np.ndarray):
            return tensor(x, path, _numpy_leaf)
        return container(x, path)

    def numpy_scalar(x, path):
        if x.dtype.kind not in "biufc" or (x.dtype.kind in "fc" and x.dtype.itemsize > {"f": 8, "c": 16}[x.dtype.kind]):
            raise TypeError(f"{path_text(path)}: NumPy scalars of dtype {x.dtype} are not supported")
        v = x.item()
        if isinstance(v, complex):
            v = [v.real, v.imag]
        elif isinstance(v, float) and not math.isfinite(v):
            v = _float_node(v)["f"]
        return {"np_scalar": x.dtype.str, "v": v}

    def container(x, path):
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise TypeError(f"{path_text(path)}: key {k!r} of type {type(k).__name__} "
                                    "is not supported (str or int keys)")
                items.append([k, walk(v, path + [k])])
            return {"dict": items}
        if isinstance(x, (list, tuple)):
            kind = "list" if isinstance(x, list) else "tuple"
            return {kind: [walk(v, path + [i]) for i, v in enumerate(x)]}
        raise TypeError(f"{path_text(path)}: objects of type {type(x).__module__}.{type(x).__name__} "
                        "cannot be saved (tensors, NumPy arrays, dicts, lists, tuples, "
                        "None, bool, int, float, str)")

    tree = walk(state, [])
    seen = {}
    for leaf in leaves:
        if leaf.name in seen:
            raise TypeError(f"{path_text(leaf.path)} and {path_text(seen[leaf.name])} get the same name {leaf.name}")
        seen[leaf.name] = leaf.path
    return tree, leaves


def _float_value(v):
    return float(v) if isinstance(v, str) else v


def _tensor_nodes(tree, path, out):
    """Collects (path, node) for every tensor of a tree."""
    if "tensor" in tree:
        out.append((path, tree))
    elif "dict" in tree:
        for k, v in tree["dict"]:
            _tensor_nodes(v, path + [k], out)
    else:
        for kind in ("list", "tuple"):
            if kind in tree:
                for i, v in enumerate(tree[kind]):
                    _tensor_nodes(v, path + [i], out)
    return out


def tensor_nodes(tree):
    return _tensor_nodes(tree, [], [])


def build(tree, tensor_of, path=None):
    """Rebuilds the state of a tree; tensor_of(node, key path) gives each
    tensor."""
    np = _numpy()
    path = path or []
    if "v" in tree and "np_scalar" not in tree:
        return tree["v"]
    if "f" in tree:
        return _float_value(tree["f"])
    if "np_scalar" in tree:
        v = tree["v"]
        if isinstance(v, list):
            v = complex(*v)
        elif isinstance(v, str):
            v = float(v)
        return np.dtype(tree["np_scalar"]).type(v)
    if "tensor" in tree:
        return tensor_of(tree, path)
    if "dict" in tree:
        return {k: build(v, tensor_of, path + [k]) for k, v in tree["dict"]}
    if "list" in tree:
        return [build(v, tensor_of, path + [i]) for i, v in enumerate(tree["list"])]
    if "tuple" in tree:
        return tuple(build(v, tensor_of, path + [i]) for i, v in enumerate(tree["tuple"]))
    raise ValueError(f"unknown node in the checkpoint's state description: {sorted(tree)}")


def tensor_paths(x, path=None):
    """The key paths of the tensors and arrays in a state."""
    path = path or []
    if is_torch_tensor(x) or is_numpy_array(x):
        return [path]
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in tensor_paths(v, path + [k])]
    if isinstance(x, (list, tuple)):
        return [p for i, v in enumerate(x) for p in tensor_paths(v, path + [i])]
    return []


def lookup(into, path):
    """The object at path in into, or raises KeyError/IndexError/TypeError."""
    x = into
    for k in path:
        x = x[k]
    return x
