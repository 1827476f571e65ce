"""What a decoder's folder says besides its graph: the tokenizer, the chat template, the EOS ids.

The model's own metadata comes first (scripts/export_smollm2.py writes chat_template and
eos_token_ids there). Exports that keep them in files beside model.onnx, as Hugging Face folders and
onnxruntime-genai's model builder do, are read from these, in this order:

    chat template   chat_template.jinja, tokenizer_config.json "chat_template" (a string, or a list of
                    named templates: "default")
    EOS ids         genai_config.json model.eos_token_id, generation_config.json eos_token_id,
                    config.json eos_token_id (an id or a list)
"""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATE_FILES = ("chat_template.jinja",)
EOS_FILES = (("genai_config.json", ("model", "eos_token_id")), ("generation_config.json", ("eos_token_id",)),
             ("config.json", ("eos_token_id",)))


def tokenizer_json(model_path: Path) -> bytes | None:
    path = model_path.parent / "tokenizer.json"
    return path.read_bytes() if path.is_file() else None


def _json(path: Path) -> dict | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or not JSON: this file says nothing
    return document if isinstance(document, dict) else None


def chat_template(model_path: Path) -> str | None:
    folder = model_path.parent
    for name in TEMPLATE_FILES:
        if (folder / name).is_file():
            return (folder / name).read_text(encoding="utf-8")
    template = (_json(folder / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) and template.strip() else None


def eos_token_ids(model_path: Path) -> list[int]:
    for name, keys in EOS_FILES:
        value = _json(model_path.parent / name)
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        ids = value if isinstance(value, list) else [value]
        if value is not None and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return [int(i) for i in ids]
    return []
