"""Download a Llama checkpoint from the Hugging Face Hub: only the files the engine reads, into the standard cache.

    plan = repo_download_plan("TinyLlama/TinyLlama-1.1B-Chat-v1.0")   # [(filename, bytes), ...] before starting
    folder = download_repo("TinyLlama/TinyLlama-1.1B-Chat-v1.0", progress=print)

Only config/tokenizer JSON files and *.safetensors are fetched (never pickle .bin files, ONNX exports, GGUFs or
other formats a repository may also hold). Files go to the usual cache (~/.cache/huggingface/hub, or $HF_HOME), so
a second load is offline, and `transformers` would find the same files.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from engine.errors import ModelError

try:
    from huggingface_hub import HfApi, hf_hub_download
except ImportError:  # pragma: no cover - huggingface_hub is in requirements.txt
    HfApi = hf_hub_download = None

Progress = Callable[[float, str], None]

METADATA_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json")
_SHARD_RE = re.compile(r"^model-\d+-of-\d+\.safetensors$")
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def _no_progress(fraction: float, message: str) -> None:
    pass


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as the Hub shows sizes)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable


def is_repo_id(source: str) -> bool:
    """'owner/name' as the Hub spells repository ids."""
    return bool(_REPO_ID_RE.match(source)) and ".." not in source


def select_files(repo_id: str, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """From a repository listing [(path, bytes)], the files the engine needs, in download order."""
    root = {name: size for name, size in files if "/" not in name}  # top-level files only
    if "config.json" not in root:
        raise ModelError(f"{repo_id} has no config.json at its top level; it is not a Transformers model repository")
    if "model.safetensors" in root:
        weights = ["model.safetensors"]
    elif "model.safetensors.index.json" in root:
        weights = sorted(n for n in root if _SHARD_RE.match(n))
    else:
        weights = sorted(n for n in root if n.endswith(".safetensors"))
    if not weights:
        pickles = sorted(n for n in root if n.endswith((".bin", ".pt", ".pth")))
        why = (f"only PyTorch pickle weights ({', '.join(pickles[:3])}), which this engine never loads because "
               f"opening them can run arbitrary code" if pickles else "no .safetensors weights")
        raise ModelError(f"{repo_id} has {why}; choose a repository that publishes model.safetensors")
    names = [n for n in METADATA_FILES if n in root] + weights
    return [(n, int(root[n] or 0)) for n in names]


def _hub_error(repo_id: str, e: Exception) -> ModelError:
    """Turn huggingface_hub / network exceptions into one clear ModelError."""
    from huggingface_hub import errors as hub_errors

    if isinstance(e, hub_errors.GatedRepoError):
        return ModelError(f"{repo_id} is gated: accept its license on huggingface.co and log in with "
                          f"`hf auth login`, then try again")
    if isinstance(e, hub_errors.RepositoryNotFoundError):
        return ModelError(f"repository {repo_id!r} was not found on the Hugging Face Hub (check the spelling "
                          f"'owner/name'; private repositories need `hf auth login`)")
    if isinstance(e, hub_errors.HFValidationError):
        return ModelError(f"{repo_id!r} is not a valid Hugging Face repository id ('owner/name')")
    if isinstance(e, hub_errors.RevisionNotFoundError):
        return ModelError(f"{repo_id}: revision not found on the Hub")
    offline = isinstance(e, (hub_errors.OfflineModeIsEnabled, hub_errors.LocalEntryNotFoundError))
    if not offline and isinstance(e, hub_errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        return ModelError(f"the Hugging Face Hub answered HTTP {status} for {repo_id} ({e}); try again later")
    network_module = type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3")
    if offline or network_module or isinstance(e, (ConnectionError, TimeoutError, OSError)):
        return ModelError(f"cannot reach the Hugging Face Hub to fetch {repo_id} ({type(e).__name__}: {e}) and it "
                          f"is not in the local cache. Check your internet connection (and that HF_HUB_OFFLINE is "
                          f"not set), or download the model elsewhere and pass its folder path")
    return ModelError(f"could not fetch {repo_id} from the Hugging Face Hub ({type(e).__name__}: {e})")


def repo_download_plan(repo_id: str) -> list[tuple[str, int]]:
    """[(filename, bytes)] that `download_repo` would fetch. Needs the network (one metadata request)."""
    if not is_repo_id(repo_id):
        raise ModelError(f"{repo_id!r} is not a Hugging Face repository id; expected 'owner/name'")
    if HfApi is None:
        raise ModelError("huggingface_hub is not installed: run `pip install -r requirements.txt`")
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception as e:
        raise _hub_error(repo_id, e) from None
    files = [(s.rfilename, int(getattr(s, "size", 0) or 0)) for s in (info.siblings or [])]
    return select_files(repo_id, files)


def cached_repo_folder(repo_id: str) -> Path | None:
    """The cached snapshot folder of `repo_id` if config.json and its weights are all there, else None."""
    if hf_hub_download is None:
        return None
    try:
        folder = Path(hf_hub_download(repo_id, "config.json", local_files_only=True)).parent
    except Exception:
        return None
    if (folder / "model.safetensors").is_file():
        return folder
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except Exception:
            return None
        return folder if all((folder / s).is_file() for s in shards) else None
    return folder if any(folder.glob("*.safetensors")) else None


# ============================================================================================ will it fit?
STORED_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}    # bytes per weight as a checkpoint stores them
FIT_HEADROOM = 0.9               # a load may take at most this share of the memory (or disk) free


def float32_bytes(plan: list[tuple[str, int]], stored_dtype: str | None) -> float:
    """Bytes the weights take once the engine holds them in float32: the safetensors files' size scaled from
    their stored dtype (config.json's torch_dtype; unknown is taken as 16-bit, the Hub's usual)."""
    stored = sum(size for name, size in plan if name.endswith(".safetensors"))
    return stored * 4 / STORED_BYTES.get(str(stored_dtype or "").lower(), 2)


def stored_dtype(repo_id: str, folder: Path | None = None) -> str | None:
    """config.json's torch_dtype (from `folder`, else fetched: a few kB); None where it does not say."""
    import json
    try:
        path = folder / "config.json" if folder is not None else Path(hf_hub_download(repo_id, "config.json"))
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except Exception as e:
        raise _hub_error(repo_id, e) from None
    dtype = doc.get("torch_dtype") or doc.get("dtype")
    return str(dtype) if dtype else None


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder (~/.cache/huggingface/hub, or as HF_HOME / HF_HUB_CACHE say)."""
    from huggingface_hub import constants
    return str(constants.HF_HUB_CACHE)


def hub_cache_bytes(folder: str | Path | None = None) -> int:
    """What the Hugging Face cache holds now, in bytes (regular files only: its snapshot links are not counted
    twice)."""
    import os
    if folder is None:
        folder = hub_cache_dir()
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                try:
                    total += os.path.getsize(p)
                except OSError:
                    pass
    return total


def check_download_fits(repo_id: str, *, download_bytes: float, weights_float32_bytes: float, copies: int,
                        free_memory: float | None, cache_bytes: float, cache_cap: float,
                        free_disk: float | None) -> None:
    """Refuse (ModelError, one line saying which limit and the numbers) a Hub model before anything is fetched:
    - memory: `copies` float32 copies of its weights (the app and its engine server each hold one) must fit in
      FIT_HEADROOM of the memory free;
    - disk: the cache after the download must stay within `cache_cap`, and the download within FIT_HEADROOM
      of the disk free. A model already cached (`download_bytes` 0) is only checked for memory."""
    need = copies * weights_float32_bytes
    if free_memory is not None and need > FIT_HEADROOM * free_memory:
        raise ModelError(f"{repo_id} would take about {need / 1e9:,.2f} GB of memory ({copies} × "
                         f"{weights_float32_bytes / 1e9:,.2f} GB of float32 weights: "
                         f"{'the app and its engine server each hold a copy' if copies > 1 else 'one copy'}), "
                         f"but only {free_memory / 1e9:,.2f} GB is free; nothing was downloaded. Pick a smaller "
                         f"model")
    if download_bytes <= 0:
        return
    if cache_bytes + download_bytes > cache_cap:
        raise ModelError(f"{repo_id} is a {download_bytes / 1e9:,.2f} GB download; the model cache already holds "
                         f"{cache_bytes / 1e9:,.2f} GB and may hold at most {cache_cap / 1e9:,.2f} GB "
                         f"(INFERENCE_LAB_HUB_DISK_MAX_GB); nothing was downloaded. Free the cache "
                         f"(huggingface-cli delete-cache) or raise the cap")
    if free_disk is not None and download_bytes > FIT_HEADROOM * free_disk:
        raise ModelError(f"{repo_id} is a {download_bytes / 1e9:,.2f} GB download, but only "
                         f"{free_disk / 1e9:,.2f} GB of disk is free; nothing was downloaded")


def download_repo(repo_id: str, progress: Progress | None = None) -> Path:
    """Fetch what the engine needs from `repo_id` into the HF cache; return the snapshot folder.

    progress(fraction, message) is told the total size before the first byte is fetched. Offline, a complete
    cached copy is used; otherwise ModelError says what to do."""
    progress = progress or _no_progress
    try:
        plan = repo_download_plan(repo_id)
    except ModelError as e:
        cached = cached_repo_folder(repo_id) if "cannot reach" in str(e) else None
        if cached is None:
            raise
        progress(1.0, f"offline: using the cached copy of {repo_id}")
        return cached
    total = sum(size for _, size in plan) or 1
    progress(0.0, f"downloading {repo_id}: {len(plan)} files, {human_bytes(total)} in total")
    done, folder = 0, None
    for name, size in plan:
        progress(done / total, f"downloading {name} ({human_bytes(size)}), {human_bytes(done)} of "
                               f"{human_bytes(total)} done")
        try:
            path = Path(hf_hub_download(repo_id, name))
        except Exception as e:
            raise _hub_error(repo_id, e) from None
        if name == "config.json":
            folder = path.parent
        done += size
    progress(1.0, f"downloaded {repo_id} ({human_bytes(total)})")
    assert folder is not None  # select_files guarantees config.json
    return folder
