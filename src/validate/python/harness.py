# reshard's loader harness, prepended to every loader script.
#
# Protocol with `reshard validate --loader python:NAME`:
#   argv: PATH DEVICE NAME
#   1. import the libraries (`need`) and prepare what the load needs (resolve
#      the model class, so lazy imports happen before the baseline);
#   2. write the line RESHARD-READY on stderr and wait for one line on stdin:
#      reshard samples the baseline and puts the commit limit on us then;
#   3. load, and write exactly one JSON line on stdout, the only thing this
#      process writes there (the libraries' prints are sent to stderr).
import sys

# `python -c` puts its working folder first on sys.path. reshard starts us in
# a private empty folder, and drops that entry before any other import, so
# no file of a model folder (a `safetensors.py`, a `json.py`) can shadow a
# library. PYTHONPATH is kept (no -I).
if not getattr(sys.flags, "safe_path", False) and sys.path:
    del sys.path[0]
sys.path[:] = [p for p in sys.path if p not in ("", ".")]

import importlib
import json
import os
import time

_STDOUT = sys.stdout
sys.stdout = sys.stderr
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
VERSIONS = {}
PATH, DEVICE, NAME = sys.argv[1], sys.argv[2], sys.argv[3]


def emit(obj):
    obj["versions"] = VERSIONS
    _STDOUT.write(json.dumps(obj) + "\n")
    _STDOUT.flush()


def need(module, package):
    """Imports `module`, or reports that `package` is to be installed."""
    try:
        m = importlib.import_module(module)
    except ImportError as e:
        emit({"outcome": "missing", "module": module, "install": package, "detail": str(e)})
        sys.exit(3)
    VERSIONS[package] = str(getattr(m, "__version__", "unknown"))
    return m


def fail(stage, e):
    text = "%s: %s" % (type(e).__name__, e)
    low = text.lower()
    oom = isinstance(e, MemoryError) or any(
        s in low
        for s in ("can't allocate", "cannot allocate memory", "out of memory", "os error 12", "enomem")
    )
    emit({"outcome": "out_of_memory" if oom else "failed", "stage": stage, "error": text[:2000]})
    sys.exit(0)


def describe(obj):
    """Tensors and bytes the loaded object holds, each storage once."""
    torch = sys.modules["torch"]
    seen, tensors, nbytes = set(), 0, 0
    modules = obj if isinstance(obj, list) else [obj]
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            key = (t.device.type, t.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            tensors += 1
            nbytes += t.numel() * t.element_size()
    return {"tensors": tensors, "bytes": nbytes}


def main(prepare, load):
    try:
        state = prepare()
    except Exception as e:
        fail("prepare", e)
    sys.stderr.write("\nRESHARD-READY\n")
    sys.stderr.flush()
    sys.stdin.readline()
    started = time.perf_counter()
    try:
        loaded = load(state)
        info = describe(loaded)
    except Exception as e:
        fail("load", e)
    info["outcome"] = "loaded"
    info["seconds"] = time.perf_counter() - started
    emit(info)


def config_json(folder):
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def transformers_class(transformers, folder):
    """The class config.json names (resolving transformers' lazy import of
    its modeling module now), or AutoModel."""
    archs = config_json(folder).get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs else None
    return cls if cls is not None else transformers.AutoModel
