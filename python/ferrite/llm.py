"""Text generation with GGUF language models on Ferrite.

A thin layer over the native `ferrite._ferrite.Llm`, which binds the Rust
`ferrite_llm::Llm`: the same program, generate loop, tokenizer (from the
`.gguf`'s own metadata), chat template, sampling and stop conditions as the
CLI's `ferrite generate`. The model runs with the GIL released.

    import ferrite.llm

    llm = ferrite.llm.load("SmolLM2-135M-Instruct.Q4_1.gguf", device="local-task",
                           context=2048)  # KV cache positions, allocated on the device now
    print(llm.chat("What is the capital of France?"))
    for piece in llm.stream("Once upon a time", max_tokens=32):
        print(piece, end="", flush=True)
    ids = llm.generate(llm.encode("The capital of France"), max_tokens=8)

Prompts are text (`str`) or token ids (a sequence of ints, used as given:
no BOS is added). `generate` returns the same kind as its prompt: text for
text, ids for ids; `details=True` returns a `Completion` with both and the
timings. Sampling: `temperature=0` (the default) is greedy; otherwise
`top_k` (0: all), `top_p` (1: all) and `seed` choose. Generation ends at
the end-of-sequence token (unless `ignore_eos`), after `max_tokens`, or
where the text first contains one of `stop` (the text returned ends before
it).

Bad input raises: a `.gguf` that does not exist `FileNotFoundError`; a
malformed file, one whose tensors do not match the program, an empty
prompt, a prompt past `context_length`, an id outside the vocabulary or a
sampling value out of range `ValueError`.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Optional, Sequence, Union, overload

from . import _ferrite

__all__ = ["Completion", "Llm", "Stream", "load"]

Prompt = Union[str, Sequence[int]]
Message = Union[dict, tuple]
Messages = Union[str, Sequence[Message]]
PathLike = Union[str, bytes, "os.PathLike[str]"]


@dataclass(frozen=True)
class Completion:
    """One finished generation."""

    text: str
    """The generated text (special tokens skipped; cut before a stop string)."""
    ids: list
    """The generated token ids (without the end-of-sequence token)."""
    finish_reason: str
    """'eos', 'length' (max_tokens), 'stop' (a stop string) or 'cancelled'."""
    prompt_tokens: int
    time_to_first_token: float
    """Seconds from the call to the first token: prefill and its choice."""
    decode_seconds: float
    decode_steps: int

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_steps else 0.0


class Stream:
    """An iterator over the text pieces of a generation as they are made
    (each piece is the text its token completes; tokens ending mid-character
    yield nothing until the character is whole). The model runs on a worker
    thread; `close()` (or dropping the stream) stops it after the token in
    flight. After the iteration `completion` holds the whole generation."""

    def __init__(self, native: _ferrite.LlmStream):
        self._native = native

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        return next(self._native)

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def ids(self) -> list:
        """Ids generated so far."""
        return self._native.ids

    @property
    def text(self) -> str:
        """Text generated so far."""
        return self._native.text

    @property
    def completion(self) -> Optional[Completion]:
        """The finished generation, or None while it runs (or once closed
        before its end)."""
        d = self._native.result()
        return Completion(**d) if d is not None else None


def _messages(messages: Messages) -> list:
    """(role, content) pairs from a str (one user message), dicts with
    'role' and 'content' (OpenAI style) or (role, content) pairs."""
    if isinstance(messages, str):
        return [("user", messages)]
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            try:
                role, content = m["role"], m["content"]
            except KeyError as e:
                raise ValueError(f"message {i} has no {e.args[0]!r}") from None
        elif isinstance(m, (tuple, list)) and len(m) == 2:
            role, content = m
        else:
            raise TypeError(f"message {i} must be a dict with 'role' and 'content' or a (role, content) pair")
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"message {i}: role and content must be str")
        out.append((role, content))
    if not out:
        raise ValueError("no messages")
    return out


def _check_ints(name: str, value: Any, low: int) -> int:
    """An int (or an integer-like object such as a numpy integer; not a
    bool or a float) of at least `low`."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    value = operator.index(value)
    if value < low:
        raise ValueError(f"{name} must be >= {low}, not {value}")
    return value


class Llm:
    """A model loaded on a device; see the module's documentation."""

    def __init__(self, native: _ferrite.Llm):
        self._native = native

    @property
    def context_length(self) -> int:
        """Positions the KV cache holds: prompt plus generated tokens."""
        return self._native.context_length

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._native.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self._native.vocab_size

    @property
    def gguf_path(self) -> str:
        return self._native.gguf_path

    @property
    def device(self) -> str:
        return self._native.device

    def __repr__(self) -> str:
        return repr(self._native)

    def encode(self, text: str) -> list:
        """Token ids of `text` with the `.gguf`'s tokenizer (special tokens
        written in the text are matched; no BOS is added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        return self._native.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens skipped."""
        return self._native.decode(self._ids(ids))

    def chat_prompt(self, messages: Messages) -> list:
        """Token ids of `messages` through the `.gguf`'s chat template, the
        assistant's turn opened."""
        return self._native.chat_prompt(_messages(messages))

    def _ids(self, prompt: Any) -> list:
        if isinstance(prompt, (str, bytes)):
            raise TypeError("token ids must be a sequence of ints")
        try:
            return [_check_ints("a token id", i, 0) for i in prompt]
        except TypeError as e:
            raise TypeError(f"a prompt is a str or a sequence of int token ids ({e})") from None

    def _prompt(self, prompt: Prompt) -> tuple:
        if isinstance(prompt, str):
            return self.encode(prompt), False
        return self._ids(prompt), True

    @staticmethod
    def _options(max_tokens, temperature, top_k, top_p, seed, stop, ignore_eos) -> tuple:
        if isinstance(stop, str):
            stop = [stop]
        stop = list(stop or [])
        if not all(isinstance(s, str) for s in stop):
            raise TypeError("stop must be a str or a sequence of str")
        return (
            _check_ints("max_tokens", max_tokens, 0),
            float(temperature),
            _check_ints("top_k", top_k, 0),
            float(top_p),
            _check_ints("seed", seed, 0),
            stop,
            bool(ignore_eos),
        )

    @overload
    def generate(self, prompt: str, max_tokens: int = ..., temperature: float = ..., top_k: int = ...,
                 top_p: float = ..., seed: int = ..., stop: Union[str, Sequence[str], None] = ...,
                 ignore_eos: bool = ..., details: Literal[False] = ...) -> str: ...
    @overload
    def generate(self, prompt: Sequence[int], max_tokens: int = ..., temperature: float = ..., top_k: int = ...,
                 top_p: float = ..., seed: int = ..., stop: Union[str, Sequence[str], None] = ...,
                 ignore_eos: bool = ..., details: Literal[False] = ...) -> list: ...
    @overload
    def generate(self, prompt: Prompt, max_tokens: int = ..., temperature: float = ..., top_k: int = ...,
                 top_p: float = ..., seed: int = ..., stop: Union[str, Sequence[str], None] = ...,
                 ignore_eos: bool = ..., *, details: Literal[True]) -> Completion: ...

    def generate(self, prompt, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=None,
                 ignore_eos=False, details=False):
        """Generates after `prompt`; returns the text for a text prompt, the
        ids for an id prompt, or a `Completion` with `details=True`."""
        ids, ids_out = self._prompt(prompt)
        d = self._native.generate(ids, *self._options(max_tokens, temperature, top_k, top_p, seed, stop,
                                                       ignore_eos))
        c = Completion(**d)
        if details:
            return c
        return c.ids if ids_out else c.text

    def stream(self, prompt: Prompt, max_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, stop: Union[str, Sequence[str], None] = None,
               ignore_eos: bool = False) -> Stream:
        """As `generate`, as an iterator of text pieces. A bad prompt raises
        here (the call waits for the first token)."""
        ids, _ = self._prompt(prompt)
        native = self._native.stream(ids, *self._options(max_tokens, temperature, top_k, top_p, seed, stop,
                                                          ignore_eos))
        return Stream(native)

    @overload
    def chat(self, messages: Messages, *, stream: Literal[False] = ..., **options: Any) -> str: ...
    @overload
    def chat(self, messages: Messages, *, stream: Literal[True], **options: Any) -> Stream: ...

    def chat(self, messages, *, stream=False, **options):
        """The assistant's answer to `messages` (a str is one user message;
        else dicts with 'role' and 'content', or (role, content) pairs)
        through the `.gguf`'s chat template: its text, or with
        `stream=True` a `Stream` of its pieces. `options` are `generate`'s."""
        ids = self.chat_prompt(messages)
        if stream:
            return self.stream(ids, **options)
        return self.generate(ids, details=True, **options).text


DEFAULT_CONTEXT = 2048


def load(gguf: PathLike, device: str = "local-task", *, program: Optional[PathLike] = None,
         context: int = DEFAULT_CONTEXT) -> Llm:
    """Loads the `.gguf` (SmolLM2-135M's architecture: the file is checked
    against the program) on `device` ('local-sync', 'local-task',
    'local-task://?workers=N', 'cuda' with a cuda `program`). `program` is a
    `.vmfb` with the same entry points instead of the built-in one (e.g.
    build/llm/smollm2-cuda.vmfb from examples/llm/build_cuda.py). `context`
    is the KV cache's capacity in positions (prompt plus generated tokens,
    1..8192), allocated on the device now (45 KiB a position); a generation
    that would pass it raises `ValueError`."""
    context = _check_ints("context", context, 1)
    return Llm(_ferrite.Llm.load(gguf, device, program, context))
