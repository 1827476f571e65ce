"""Text: tokenizer.json loading, chat templates, streaming detokenization of split UTF-8."""

import json

import pytest

from infc.compiler.errors import BadInput
from infc.compiler.runtime.fake_runner import FakeRunner, byte_tokenizer_json
from infc.compiler.runtime.text import StreamDetokenizer, TextCodec

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def codec():
    return TextCodec(byte_tokenizer_json(), {"chat_template": CHATML, "eos_token": "<|eos|>"})


def stream(codec, prompt, token_ids):
    detokenizer = StreamDetokenizer(codec, prompt)
    return [detokenizer.push(t) for t in token_ids] + [detokenizer.flush()]


def test_encode_decode_round_trip(codec):
    text = "Paris, Zürich — 東京 🙂"
    assert codec.decode(codec.encode(text)) == text
    assert codec.vocab_size == 257


def test_streaming_never_emits_half_a_character(codec):
    text = "aé東🙂b"  # 1, 2, 3 and 4 byte characters
    pieces = stream(codec, codec.encode("x"), codec.encode(text))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[:6] == ["a", "", "é", "", "", "東"]


def test_flush_emits_what_an_unfinished_character_held_back(codec):
    pieces = stream(codec, [], codec.encode("ok") + codec.encode("🙂")[:2])
    assert pieces[:2] == ["o", "k"] and pieces[-1] == "\ufffd"


def test_special_tokens_are_skipped(codec):
    assert "".join(stream(codec, [], codec.encode("hi") + [256])) == "hi"


def test_chat_template_renders_like_transformers(codec):
    text = codec.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert codec.encode_prompt("hi") == codec.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_template_errors_and_missing_template(codec):
    broken = TextCodec(byte_tokenizer_json(), {"chat_template": "{% if %}"})
    with pytest.raises(BadInput, match="chat template"):
        broken.render_chat([{"role": "user", "content": "x"}])
    plain = TextCodec(byte_tokenizer_json())
    assert plain.encode_prompt("hi") == plain.encode("hi")
    with pytest.raises(BadInput, match="no chat template"):
        plain.render_chat([])


def test_template_may_raise(codec):
    strict = TextCodec(byte_tokenizer_json(), {"chat_template": "{{ raise_exception('system role not supported') }}"})
    with pytest.raises(BadInput, match="chat template refuses the conversation: system role not supported$"):
        strict.render_chat([{"role": "system", "content": "x"}])
    # a template that fails as Python (an internal error of `infc run --prompt` before): the model's input
    broken = TextCodec(byte_tokenizer_json(), {"chat_template": "{{ messages[0]['content'] + 3 }}"})
    with pytest.raises(BadInput, match=r"refuses the conversation: TypeError: can only concatenate str"):
        broken.encode_prompt("hi")


def test_from_folder_reads_the_config(tmp_path):
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": {"content": "<s>"}, "eos_token": "<|eos|>"}))
    codec = TextCodec.from_folder(tmp_path)
    assert codec.bos_token == "<s>" and codec.chat_template == CHATML


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(BadInput, match="no tokenizer.json"):
        TextCodec.from_folder(tmp_path)
    with pytest.raises(BadInput, match="not a tokenizer.json"):
        TextCodec("{not json", {}, "t.json")


def test_codec_for_a_runner():
    codec = TextCodec.for_runner(FakeRunner())
    assert codec.eos_token == "<|eos|>" and codec.chat_template
    assert TextCodec.for_runner(FakeRunner(has_tokenizer=False)) is None
