"""Vocabularies and tokenisers of the federated text benchmarks, as TensorFlow Federated builds them.

Both vocabularies reserve id 0 for padding and put their special ids after the words (as
``tff.simulation.baselines``' preprocessing does)::

    Shakespeare characters:  pad 0 | the 86 characters of CHAR_VOCAB 1..86 | oov 87 | bos 88 | eos 89
    StackOverflow words:     pad 0 | the top V words 1..V | oov V+1 | bos V+2 | eos V+3

Shakespeare (:func:`char_windows`): a snippet's bytes become ids, wrapped as
``[bos] + ids + [eos]``, zero-padded to a multiple of ``T + 1`` and cut into windows of ``T + 1``
ids; each window w gives one record ``x = w[:-1]``, ``y = w[1:]`` (T = 80, McMahan et al. 2017).

StackOverflow (:func:`word_sequence`): a sentence's space-separated words, truncated to T, become
ids; ``eos`` is appended when fewer than T words remain and ``bos`` is prepended; the T + 1 ids are
zero-padded and give one record ``x = s[:-1]``, ``y = s[1:]`` (T = 20, Reddi et al. 2021).

Sent140 (:func:`sent140_ids`): LEAF's ``split_line`` (words ``[\\w']+`` and the punctuation
``.,!?;``) of the tweet's text, the first T = 25 words as ids of a word vocabulary, zero-padded (one
label per tweet)."""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

#: TFF's Shakespeare character vocabulary (86 characters; the order fixes the ids 1..86).
CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]"
              "!%)-159\r")
#: Sequence lengths of the published tasks.
SHAKESPEARE_T = 80
STACKOVERFLOW_T = 20
SENT140_T = 25
#: StackOverflow's default vocabulary size (the 10,000 most frequent words).
STACKOVERFLOW_VOCAB = 10_000

_WORD_RE = re.compile(r"[\w']+|[.,!?;]")


@dataclasses.dataclass(frozen=True)
class Vocab:
    """A token vocabulary: ``tokens[i]`` has id ``i + 1`` (0 is padding), then one OOV id, then
    the begin / end of sentence ids.

    ids: pad = 0, tokens 1..V, oov = V + 1, bos = V + 2, eos = V + 3; ``size`` = V + 4.
    """

    tokens: tuple[str, ...]

    def __post_init__(self):
        if len(self.tokens) == 0:
            raise ValueError("a vocabulary needs at least one token, got none")
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("the vocabulary's tokens must be distinct (a token listed twice)")

    pad_id = 0                                    # a class constant, not a field

    @property
    def oov_id(self) -> int:
        return len(self.tokens) + 1

    @property
    def bos_id(self) -> int:
        return len(self.tokens) + 2

    @property
    def eos_id(self) -> int:
        return len(self.tokens) + 3

    @property
    def size(self) -> int:
        """Number of ids (the model's output vocabulary): V + 4."""
        return len(self.tokens) + 4

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """token -> id."""
        return {t: i + 1 for i, t in enumerate(self.tokens)}

    def ids(self, tokens: Iterable[str]) -> np.ndarray:
        """``[len(tokens)]`` int32 ids (OOV for a token not in the vocabulary)."""
        index, oov = self.index, self.oov_id
        return np.fromiter((index.get(t, oov) for t in tokens), np.int32)

    def task_dict(self) -> dict:
        """The next-token task of this vocabulary (``fedjax_dp.models.tasks.from_dict``'s form)."""
        return {"kind": "next_token", "vocab_size": self.size, "pad_id": 0,
                "oov_ids": [self.oov_id], "bos_id": self.bos_id, "eos_id": self.eos_id}

    def save(self, path) -> None:
        """One token per line (ids 1..V in order); a space, newline, carriage return or backslash
        in a token is written escaped (``\\s``, ``\\n``, ``\\r``, ``\\\\``)."""
        Path(path).write_text("".join(_escape(t) + "\n" for t in self.tokens), encoding="utf-8")


def _escape(token: str) -> str:
    return (token.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            .replace(" ", "\\s"))


def _unescape(text: str) -> str:
    special = {"n": "\n", "r": "\r", "s": " "}
    return re.sub(r"\\(.)", lambda m: special.get(m.group(1), m.group(1)), text)


#: The Shakespeare character vocabulary (size 90: pad 0, characters 1..86, oov 87, bos 88, eos 89).
SHAKESPEARE = Vocab(tuple(CHAR_VOCAB))


#: a vocabulary file is at most this long
MAX_VOCAB_BYTES = 1 << 30


def load_vocab(path, size: int | None = None, *, default: int | None = None) -> Vocab:
    """The first ``size`` tokens of a vocabulary file, one token per line (``size`` None: the
    first ``default`` tokens, or all when the file holds fewer or ``default`` is None).

    A line may carry a count after the token (``word 1234``, the format of TFF's
    ``stackoverflow.word_count``): only its first field is the token, so the file's order (most
    frequent first) gives the ids. Escapes as :meth:`Vocab.save` writes them; blank lines are
    skipped."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--vocab {str(p)!r} is not a file (a vocabulary: one token per line)")
    from fedjax_dp.core import files
    text = files.read_bytes(p, max_bytes=MAX_VOCAB_BYTES, root="/",  # the file named: followed
                            what="--vocab").decode("utf-8")
    tokens = []
    for line in text.split("\n"):
        field = line.split(" ")[0]
        if not field:
            continue
        tokens.append(_unescape(field))
        if size is not None and len(tokens) >= size:
            break
    if size is None and default is not None:
        tokens = tokens[:default]
    if size is not None and len(tokens) < size:
        raise ValueError(f"--vocab {str(p)!r} holds {len(tokens)} tokens but --vocab-size "
                         f"{size} were asked")
    return Vocab(tuple(tokens))


def choose_vocab(vocab_file, vocab_size: int | None,
                 counts: Callable[[], collections.Counter]) -> Vocab:
    """A word vocabulary: the first ``vocab_size`` words of ``vocab_file`` when given, else the
    ``vocab_size`` most frequent of ``counts()`` (default size :data:`STACKOVERFLOW_VOCAB` in
    both cases; the file may hold fewer)."""
    if vocab_file is not None:
        return load_vocab(vocab_file, vocab_size, default=STACKOVERFLOW_VOCAB)
    return top_words(counts(), vocab_size or STACKOVERFLOW_VOCAB)


def set_next_token(reader, seq_len: int, vocab: Vocab | None = None) -> None:
    """Make a federated reader's records next-token sequences of ``seq_len`` ids: ``x, y [T]``
    int32; with ``vocab``, also its number of classes (``vocab.size``), vocabulary and task."""
    reader.seq_len = seq_len
    reader.feature_shape = reader.label_shape = (seq_len,)
    reader.x_dtype = np.int32
    if vocab is not None:
        reader.vocab, reader.num_classes, reader.task = vocab, vocab.size, vocab.task_dict()


def stack_sequences(pairs: list[tuple[np.ndarray, np.ndarray]], seq_len: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One client's records ``(x [n, T], y [n, T])`` from per-text ``(x, y)`` pairs of shape
    ``[k, T]`` or ``[T]`` (a text's records, in order); an empty client gives ``[0, T]``."""
    if not pairs:
        return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
    return (np.concatenate([np.reshape(p[0], (-1, seq_len)) for p in pairs]),
            np.concatenate([np.reshape(p[1], (-1, seq_len)) for p in pairs]))


def top_words(counts: collections.Counter, size: int) -> Vocab:
    """The ``size`` most frequent words of ``counts`` (ties broken by the word, so the vocabulary
    does not depend on the order the counts were made in)."""
    if size < 1:
        raise ValueError(f"--vocab-size must be >= 1, got {size}")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
    if not ranked:
        raise ValueError("no words to build a vocabulary from (empty training data)")
    return Vocab(tuple(w for w, _ in ranked))


def char_ids(snippet: str | bytes, vocab: Vocab = SHAKESPEARE) -> np.ndarray:
    """A snippet's ids, one per byte (TFF splits the UTF-8 bytes; a non-ASCII byte is OOV)."""
    if isinstance(snippet, str):
        snippet = snippet.encode("utf-8")
    return vocab.ids(chr(b) for b in snippet)


def char_windows(snippet: str | bytes, seq_len: int = SHAKESPEARE_T,
                 vocab: Vocab = SHAKESPEARE) -> tuple[np.ndarray, np.ndarray]:
    """TFF's Shakespeare records of one snippet: ``(x [k, T], y [k, T])`` int32 with
    ``k = ceil((len + 2) / (T + 1))``: ``[bos] + ids + [eos]`` zero-padded to ``k (T + 1)`` ids,
    window j = ids[j (T+1) : (j+1)(T+1)], ``x_j = w_j[:-1]``, ``y_j = w_j[1:]``."""
    ids = np.concatenate([[vocab.bos_id], char_ids(snippet, vocab), [vocab.eos_id]])
    k = -(-len(ids) // (seq_len + 1))
    w = np.zeros(k * (seq_len + 1), np.int32)
    w[:len(ids)] = ids
    w = w.reshape(k, seq_len + 1)
    return w[:, :-1].copy(), w[:, 1:].copy()


def num_char_windows(snippet_length: int, seq_len: int = SHAKESPEARE_T) -> int:
    """Number of records :func:`char_windows` makes of a snippet of this many bytes."""
    return -(-(snippet_length + 2) // (seq_len + 1))


def words(sentence: str | bytes) -> list[str]:
    """StackOverflow's words: the sentence split on spaces (as ``tf.strings.split(sep=" ")``,
    except that the empty strings between repeated spaces are dropped)."""
    if isinstance(sentence, bytes):
        sentence = sentence.decode("utf-8", errors="replace")
    return [w for w in sentence.split(" ") if w]


def word_sequence(sentence: str | bytes, vocab: Vocab, seq_len: int = STACKOVERFLOW_T
                  ) -> tuple[np.ndarray, np.ndarray]:
    """TFF's StackOverflow record of one sentence: ``(x [T], y [T])`` int32 (module docstring)."""
    ids = vocab.ids(words(sentence)[:seq_len])
    if len(ids) < seq_len:
        ids = np.append(ids, vocab.eos_id)
    s = np.zeros(seq_len + 1, np.int32)
    s[0] = vocab.bos_id
    s[1:1 + len(ids)] = ids
    return s[:-1].copy(), s[1:].copy()


def split_line(text: str) -> list[str]:
    """LEAF's Sent140 words: ``[\\w']+`` runs and the punctuation ``.,!?;``."""
    return _WORD_RE.findall(text)


def sent140_ids(text: str, vocab: Vocab, seq_len: int = SENT140_T) -> np.ndarray:
    """``[T]`` int32: the ids of the first T words of ``text`` (OOV outside the vocabulary),
    zero-padded."""
    ids = vocab.ids(split_line(text)[:seq_len])
    out = np.zeros(seq_len, np.int32)
    out[:len(ids)] = ids
    return out
