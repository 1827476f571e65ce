"""The engine cache: built plans stored under a content-addressed key, and every miss explained.

Key = sha256 over the model bytes (external data included), the normalized profile, the build
options, the target fingerprint, the infc version and infc's source (code_digest). Each entry keeps those components beside the
plan, so a miss can say which one changed since the last build of the same model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

from .atomic import atomic_path, write_text_atomic
from .autotune.machine_load import busy_load
from .target import fingerprint_id

COMPONENTS = ("model", "profile", "options", "target", "infc_version", "infc_code")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the infc package (pyproject maps it to the repo root)
CODE_FOLDERS = ("compiler", "profiles")  # what a build reads besides the model: its code and default profiles


@functools.cache  # hashed once a process
def code_digest() -> str:
    """sha256 over infc's own source (and onnxruntime's version, which the vendor tactics and islands
    run): an install from a checkout keeps its version number while the code under it changes, and
    a plan built by other code is not what this key promises."""
    import onnxruntime  # noqa: PLC0415

    digest = hashlib.sha256(f"onnxruntime={onnxruntime.__version__}".encode())
    files = [PACKAGE_ROOT / "__init__.py"] + sorted(
        path for folder in CODE_FOLDERS for path in (PACKAGE_ROOT / folder).rglob("*")
        if path.suffix in (".py", ".cu", ".cuh", ".yaml") and "__pycache__" not in path.parts)
    for path in files:
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode())
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("INFC_CACHE_DIR") or Path.cwd() / "cache")


def model_digest(path: Path) -> str:
    """sha256 of the model file and every external data file it references."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    try:
        model = onnx.load(str(path), load_external_data=False)
        locations = sorted({e.value for t in onnx.external_data_helper._get_all_tensors(model)
                            for e in t.external_data if e.key == "location"})
    except Exception:  # noqa: BLE001 - the loader reports bad models; here we only hash
        locations = []
    for location in locations:
        data_path = path.parent / location
        digest.update(location.encode())
        if data_path.is_file():
            with open(data_path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


@dataclass
class CacheLookup:
    key: str
    hit: bool
    plan_path: Path
    reason: str  # why it missed (or "hit")


class EngineCache:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.engines = self.folder / "engines"

    def components(self, model_path: Path, profile_digest: str, options: dict, fingerprint: dict, version: str) -> dict:
        return {"model": model_digest(model_path), "profile": profile_digest,
                "options": hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest(),
                "target": hashlib.sha256(fingerprint_id(fingerprint).encode()).hexdigest(), "infc_version": version,
                "infc_code": code_digest()}

    @staticmethod
    def key_of(components: dict) -> str:
        return hashlib.sha256(json.dumps({k: components[k] for k in COMPONENTS}, sort_keys=True).encode()).hexdigest()[:32]

    def lookup(self, model_path: Path, components: dict) -> CacheLookup:
        key = self.key_of(components)
        plan = self.engines / f"{key}.plan"
        if plan.is_file() and (self.engines / f"{key}.json").is_file():
            tuned_busy = _record(self.engines / f"{key}.json").get("busy_load")
            if tuned_busy is None or busy_load() is not None:
                return CacheLookup(key, True, plan, "hit")
            return CacheLookup(key, False, plan, f"the cached plan was tuned on a busy machine (1-minute load "
                                                 f"{tuned_busy:g}); tuning again on this quiet one")
        return CacheLookup(key, False, plan, self._why_missed(model_path, components))

    def _why_missed(self, model_path: Path, components: dict) -> str:
        same_model = [e for e in self.entries() if e.get("model_name") == model_path.name]
        if not same_model:
            return "no earlier build of this model in the cache"
        latest = max(same_model, key=lambda e: e.get("created", 0))
        changed = [k for k in COMPONENTS if latest.get("components", {}).get(k) != components[k]]
        return "changed since the last build of this model: " + ", ".join(changed) if changed else "entry incomplete"

    def store(self, key: str, built_plan: Path, model_path: Path, components: dict, extra: dict) -> Path:
        """Atomic: parallel builds of one key each rename a complete file into place."""
        self.engines.mkdir(parents=True, exist_ok=True)
        target = self.engines / f"{key}.plan"
        with atomic_path(target) as tmp:
            shutil.copyfile(built_plan, tmp)
        record = {"key": key, "model_name": model_path.name, "model_path": str(model_path), "components": components,
                  "created": time.time(), **extra}
        _write_json_atomic(self.engines / f"{key}.json", record)
        return target

    def entries(self) -> list[dict]:
        if not self.engines.is_dir():
            return []
        found = []
        for meta in sorted(self.engines.glob("*.json")):
            record = _record(meta)
            if not record:  # unreadable: not listed
                continue
            plan = self.engines / f"{record.get('key')}.plan"
            record["plan_bytes"] = plan.stat().st_size if plan.is_file() else 0
            found.append(record)
        return found

    def clear(self) -> int:
        removed = 0
        if self.engines.is_dir():
            for item in self.engines.iterdir():
                item.unlink()
                removed += item.suffix == ".plan"
        timing = self.folder / "timing_cache.json"
        if timing.is_file():
            timing.unlink()
        return removed


def _record(path: Path) -> dict:
    """An entry's record; an unreadable one reads as empty (the plan beside it is still served)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))
