"""Text in and out: the model's HF `tokenizers` tokenizer, its chat template (rendered with jinja2
the way transformers does), and streaming detokenization that never emits half a character."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ..errors import BadInput

INCOMPLETE = "\ufffd"  # what a byte-level decoder yields for an unfinished UTF-8 sequence
NUM_CONTEXT_TOKENS = 5  # prompt tokens decoded before the first output token, so spacing is right


def unicode_problem(text: str) -> str | None:
    """Why a str cannot be tokenized: a lone surrogate, from JSON's "\\ud800" or from bytes that are
    not UTF-8 in a command line argument (Python keeps them as surrogates); None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"character {exc.start} ({text[exc.start]!r}) is not valid Unicode (bytes that are not UTF-8, or "
                "a lone surrogate)")
    return None


def _special_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


class TextCodec:
    def __init__(self, tokenizer_json: str, config: dict | None = None, source: str = "tokenizer"):
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions
            raise BadInput(f"{source}: not a tokenizer.json: {str(exc).splitlines()[0]}") from None
        config = config or {}
        self.chat_template = config.get("chat_template")
        if isinstance(self.chat_template, list):  # several named templates: take the default one
            self.chat_template = next((t["template"] for t in self.chat_template if t.get("name") == "default"), None)
        self.bos_token = _special_text(config.get("bos_token"))
        self.eos_token = _special_text(config.get("eos_token"))

    @classmethod
    def from_folder(cls, folder: str | Path) -> "TextCodec":
        """tokenizer.json plus, when present, tokenizer_config.json (chat template, special tokens)."""
        folder = Path(folder)
        path, config_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
        if not path.is_file():
            raise BadInput(f"{folder}: no tokenizer.json")
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        return cls(path.read_text(encoding="utf-8"), config, str(path))

    @classmethod
    def for_runner(cls, runner) -> "TextCodec | None":
        """The tokenizer a decoder plan carries (runner.tokenizer_json, runner.chat_template), if any."""
        tokenizer_json = getattr(runner, "tokenizer_json", None)
        if not tokenizer_json:
            return None
        codec = cls(bytes(tokenizer_json).decode("utf-8"), {"chat_template": getattr(runner, "chat_template", None)},
                    "the plan's tokenizer")
        eos_ids = runner.spec.eos_token_ids
        codec.eos_token = codec.eos_token or (codec.tokenizer.id_to_token(eos_ids[0]) if eos_ids else None)
        return codec

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        problem = unicode_problem(text)
        if problem:  # the tokenizer would raise a TypeError
            raise BadInput(f"text to encode: {problem}")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation; the template already holds BOS and the role markers,
        so encode it with add_special_tokens=False."""
        if not self.chat_template:
            raise BadInput("this model has no chat template")
        template = _compile_template(self.chat_template)
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except Exception as exc:  # noqa: BLE001 - the template is the model's code: its failures are its input's
            from jinja2.exceptions import TemplateError

            what = str(exc) if isinstance(exc, TemplateError) else f"{type(exc).__name__}: {exc}"
            raise BadInput(f"the model's chat template refuses the conversation: {what}") from None

    def encode_prompt(self, prompt: str) -> list[int]:
        """A user prompt as the model expects it: through the chat template when there is one."""
        if self.chat_template:
            return self.encode(self.render_chat([{"role": "user", "content": prompt}]), add_special_tokens=False)
        return self.encode(prompt)


def _compile_template(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise BadInput(f"chat template: {exc}") from None


class StreamDetokenizer:
    """Turns one sequence's tokens into text pieces as they come. It decodes a short window
    [prefix_offset, end) and emits only what grew past [prefix_offset, read_offset); a piece
    that ends in U+FFFD (half a character so far) is held back until the next token completes it.
    With stop strings, the text ends before the first one to appear and `is_stopped` turns true."""

    def __init__(self, codec: TextCodec, prompt_ids: list[int], stop: tuple[str, ...] = ()):
        self.codec, self.stop = codec, stop
        self.token_ids = list(prompt_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""
        self.is_stopped = False

    def push(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        return self._emit(self._advance(final=False))

    def flush(self) -> str:
        return "" if self.is_stopped else self._emit(self._advance(final=True))

    def _advance(self, final: bool) -> str:
        prefix_text = self.codec.decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self.codec.decode(self.token_ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or (new_text.endswith(INCOMPLETE) and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return new_text[len(prefix_text):]

    def _emit(self, piece: str) -> str:
        if not piece or self.is_stopped:
            return ""
        start = len(self.text)
        self.text += piece
        # a stop string may straddle the previous piece and this one
        found = [i for i in (self.text.find(s, max(0, start - len(s) + 1)) for s in self.stop) if i >= 0]
        if found:
            self.text, self.is_stopped = self.text[:min(found)], True
        return self.text[start:]
