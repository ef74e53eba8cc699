"""LEAF's Shakespeare built from Project Gutenberg's text of the plays (nothing downloads).

LEAF (Caldas et al. 2018, github.com/TalwalkarLab/leaf, ``data/shakespeare/preprocess``) makes
one client of every speaking role in every play of Gutenberg's complete works and one sample of
every 80-character window of the role's lines, predicting the character after it. This module
reads the plays' text and builds those clients (``fedjax-dp data convert gutenberg_shakespeare
SRC DST``; :mod:`fedjax_dp.data.convert` writes them as a stacked population). SRC is one of:

* **the complete works in one file** (LEAF's source, Gutenberg etext 100 of 1994): a play
  starts at a line ``by William Shakespeare`` (its title the nearest non-blank line above); a
  speaker's line is ``  NAME. text`` (two spaces, the name in letters and spaces, a period, a
  space), its continuation lines are indented by four spaces or more. The Comedy of Errors is
  indented differently: its speaker lines start in the first column and every following
  non-blank line continues the speech; a speaker "name" ``ACT ...`` / ``SCENE ...`` there is a
  heading. Gutenberg's ``<<...>>`` notices between the plays and everything after ``End of``
  the Project Gutenberg text are dropped.
* **a folder of per-play texts** (the layout of ``shksprdata/texts/*_gut.txt`` in the
  ``shakespeare`` 0.6 source distribution, also Gutenberg's): every ``*.txt`` file is one
  play, its title its first non-blank line. The front matter (title, author, the list of
  persons) ends at the first heading (``ACT I.``, ``SCENE I.``, ``PROLOGUE``, ``INDUCTION``);
  a speaker's name stands on its own line (``HAMLET.``, ``Ber.``, ``FIRST LORD.``, ``QUINCE``,
  maybe followed by a bracketed direction), at the start of a block (after a blank line or a
  stage direction); the lines after it, across blank lines, are the speech, until the next
  speaker or heading. A name not in capitals must start two blocks in the play (so that a
  one-word verse line after a stage direction is not taken for a speaker). ``THE END`` ends
  the play.

In both layouts stage directions are dropped: a ``[...]`` span (on one line or over several),
a block or a continuation line starting with ``Enter``, ``Re-enter``, ``Exit``, ``Exeunt`` or
``Manet``; act and scene headings end the current speech. Then LEAF's rules:

1. A text without an act or scene heading, or with fewer than two roles (the sonnets, the
   poems, a file that is not a play), is dropped; a role of two lines or fewer is dropped.
   Names are upper-cased (LEAF's normalisation); the client id is LEAF's ``<PLAY>_<ROLE>``
   with spaces made ``_`` and then every run of characters other than letters, digits and
   ``_`` made ``_`` (``HAMLET__PRINCE_OF_DENMARK_HAM``; two roles with one id are one client).
2. A role's text is its lines, each followed by a space, with every run of two or more spaces
   made one (LEAF's ``shake_utils``); a text of L characters gives ``max(0, L - T)`` samples,
   window i the characters ``[i, i + T)`` predicting character ``i + T`` (T = 80). A role with
   no sample is dropped. As a next-token record (the library's form, as ``leaf_shakespeare``):
   ``x = ids(text[i : i + T])``, ``y = ids(text[i + 1 : i + T + 1])``, ``[T]`` int32 each.
3. The vocabulary is LEAF's 80 characters (:data:`LEAF_CHARS`, ``models/utils/
   language_utils.py``'s ``ALL_LETTERS``) as ids 1..80; any other character is OOV (81); BOS 82
   and EOS 83 are reserved (the task's vocab_size is 84).
4. The train / test split (LEAF's ``split_data.py``): ``split="sample"`` (``-t sample``) keeps
   every client and gives it its first ``max(1, int(f n))`` samples for training (1 of 2) and
   its samples from ``max(1, int(f n)) + T - 1`` on for testing, so that no test window
   overlaps a training window by more than a character; a client with fewer than two samples,
   or none left for the test, is dropped. ``split="user"`` (``-t user``) draws
   ``int(f N)`` training clients uniformly (``split_seed``) and gives the others, all their
   samples, to the test. ``f`` is ``train_fraction`` (0.8 by default, LEAF's full-size
   command ``-t sample --tf 0.8``; LEAF's script default is 0.9).
5. ``window_stride`` S (this library's option; LEAF's is 1): after the split, every client
   keeps the windows ``start, start + S, ...`` of each of its ranges. ``S = T`` gives
   non-overlapping windows, every character predicted once (TFF's cutting of its snippets into
   pieces), 80 times fewer records than LEAF's: the size the benchmark runs use
   (docs/benchmarks/shakespeare.md). The split is LEAF's in every case.

:attr:`Shakespeare.statistics` is what the conversion prints (``fedjax-dp data convert``'s
summary): texts, plays, roles (kept and dropped), users and samples as LEAF counts them (before
the split), samples per user (quantiles, mean, std), the same per split, and the characters
outside the vocabulary.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from fedjax_dp.data import vocab as vocab_lib
from fedjax_dp.data.client_reader import ClientReader

#: LEAF's Shakespeare characters (``ALL_LETTERS``; ids 1..80 in this order)
LEAF_CHARS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
              "abcdefghijklmnopqrstuvwxyz}")
LEAF_VOCAB = vocab_lib.Vocab(tuple(LEAF_CHARS))
#: the split of LEAF's ``split_data.py``: per client's samples, or by client
SPLITS = ("sample", "user")
TRAIN_FRACTION = 0.8
#: LEAF drops a role of this many lines or fewer
MAX_DROPPED_LINES = 2
#: one text file is at most this long (the complete works are 5.5 MB)
MAX_TEXT_BYTES = 64 << 20
#: a folder holds at most this many texts
MAX_TEXTS = 2000
AUTHOR_LINE = "by William Shakespeare"
COMEDY_OF_ERRORS = "THE COMEDY OF ERRORS"

_DIRECTION = re.compile(r"^(Enter|Re-enter|Reenter|Exit|Exeunt|Manet)\b")
_TRAILING_DIRECTION = re.compile(r"\s{4,}(Enter|Re-enter|Exit|Exeunt|Manet|Dies|Aside)\b.*$")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_SPACES = re.compile(r" {2,}")
_NOT_WORD = re.compile(r"\W+")
# the complete works (LEAF's layout)
_SPEAKER = re.compile(r"^  ([A-Za-z][A-Za-z ]*)\. (.*)$")
_CONTINUATION = re.compile(r"^    (.*)$")
_COE_SPEAKER = re.compile(r"^([A-Za-z][A-Za-z ]*)\. (.*)$")
# per-play texts
_HEADING = re.compile(r"^(?:(?:ACT|SCENE)\s+[IVXL0-9]+\b"
                      r"|(?:THE\s+)?(?:PROLOGUE|INDUCTION|EPILOGUE)\.?$|[IVXL]+\.?$)",
                      re.IGNORECASE)
_NUMERAL = re.compile(r"^[IVXL]+\.?$")
_END = re.compile(r"^(?:THE END|FINIS)\.?$")
_CONNECTORS = {"and", "of", "the", "&", "de", "la", "le", "du", "to", "in"}
_NAME_WORD = re.compile(r"^(?:\d+|[A-Z][A-Za-z'\-]*\.?)$")


@dataclasses.dataclass
class Play:
    """One play: its title and, per role (upper-cased name, in order of first speech), the
    role's lines in order."""

    title: str
    roles: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    headings: int = 0

    def add(self, role: str, line: str) -> None:
        line = line.strip()
        if line:
            self.roles.setdefault(role, []).append(line)


def _strip_directions(s: str, in_bracket: bool) -> tuple[str, bool]:
    """``(s without its [...] directions, whether a direction is still open at its end)``:
    ``{`` typed for ``[`` is one too, and the text before a ``]`` whose ``[`` was lost is part of
    the direction it closes."""
    s = s.replace("{", "[")
    out: list[str] = []
    i = 0
    while i < len(s):
        if in_bracket:
            j = s.find("]", i)
            if j < 0:
                break
            i, in_bracket = j + 1, False
            continue
        j, k = s.find("[", i), s.find("]", i)
        if k >= 0 and (j < 0 or k < j):           # "...]" with its "[" lost
            out, i = [], k + 1
            continue
        if j < 0:
            out.append(s[i:])
            break
        out.append(s[i:j])
        i, in_bracket = j + 1, True
    return " ".join("".join(out).split()), in_bracket


def _clean(line: str) -> str:
    """A spoken line without its directions: a right-aligned trailing one and ``[...]``."""
    return _strip_directions(_TRAILING_DIRECTION.sub("", line), False)[0]


def _role_name(name: str) -> str:
    return " ".join(name.upper().rstrip(".").split())


def _is_heading_name(name: str) -> bool:
    return name.startswith(("ACT ", "SCENE")) or name in ("ACT", "SCENE")


# --------------------------------------------------------------------------- the complete works

def _end_of_text(line: str) -> bool:
    u = line.strip().upper()
    return u.startswith("END OF") and any(w in u for w in ("GUTENBERG", "ETEXT", "EBOOK"))


def parse_complete_works(text: str) -> list[Play]:
    """The texts of Gutenberg's complete works in one file (LEAF's layout; module docstring),
    each starting at ``by William Shakespeare``; a text without an act or scene heading (the
    sonnets, a poem) has no role."""
    lines = text.splitlines()
    plays: list[Play] = []
    play: Play | None = None
    speaker: str | None = None
    comedy = notice = False
    for i, line in enumerate(lines):
        if _end_of_text(line):
            break
        if notice or line.lstrip().startswith("<<"):
            notice = ">>" not in line
            speaker = None
            continue
        if AUTHOR_LINE in line:
            above = [s.strip() for s in lines[max(0, i - 7):i] if s.strip()]
            play = Play(above[-1] if above else f"PLAY {len(plays) + 1}")
            plays.append(play)
            comedy = play.title.upper() == COMEDY_OF_ERRORS
            speaker = None
            continue
        if play is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if (comedy or indent < 4) and _HEADING.match(line.strip()):
            play.headings += 1
            speaker = None
            continue
        m = (_COE_SPEAKER if comedy else _SPEAKER).match(line)
        if m and _DIRECTION.match(m.group(1)):    # "Enter DUKE. ...": a direction
            continue
        if m:
            name = _role_name(m.group(1))
            if _is_heading_name(name):
                play.headings += 1
                speaker = None
                continue
            speaker = name
            play.roles.setdefault(speaker, [])
            rest = _clean(m.group(2))
            if rest and not _DIRECTION.match(rest):
                play.add(speaker, rest)
            continue
        if speaker is None:
            continue
        if comedy:
            cont = line
        else:
            m = _CONTINUATION.match(line)
            if m is None:                         # a line in the first columns: not speech
                continue
            cont = m.group(1)
        cont = _clean(cont)
        if cont and not _DIRECTION.match(cont):
            play.add(speaker, cont)
    for p in plays:
        p.roles = {r: ls for r, ls in p.roles.items() if ls} if p.headings else {}
    return plays


# --------------------------------------------------------------------------- one play per file

def _speaker_name(s: str) -> str | None:
    """The name on a speaker's own line (``HAMLET.``, ``Ber.``, ``1 Priest.``, ``Ros. and
    Guil.``, ``PERICLES. [Aside.]``), or None."""
    s = _BRACKETS.sub("", s).strip()
    if not s or len(s) > 40 or _HEADING.match(s) or _END.match(s) or _DIRECTION.match(s):
        return None
    words = s.split(" ")
    if not all(_NAME_WORD.match(w) or w in _CONNECTORS for w in words):
        return None
    if words[0] in _CONNECTORS or all(w in _CONNECTORS for w in words):
        return None
    return _role_name(s)


def _capitals(s: str) -> bool:
    letters = [w for w in _BRACKETS.sub("", s).split() if w not in _CONNECTORS]
    return all(w.upper() == w for w in letters)


def _speaker_names(body: list[str]) -> set[str]:
    """The names that start a block of the play (after a blank line or a whole direction):
    every one written in capitals, and the others that start two blocks or more."""
    starts: collections.Counter = collections.Counter()
    in_capitals: set[str] = set()
    block_start = True
    for s in (ln.strip() for ln in body):
        if not s:
            block_start = True
            continue
        if block_start:
            name = _speaker_name(s)
            if name is not None:
                starts[name] += 1
                if _capitals(s):
                    in_capitals.add(name)
        block_start = s.startswith("[") and s.endswith("]")
    return {n for n, k in starts.items() if n in in_capitals or k >= 2}


def parse_play(text: str, default_title: str = "PLAY") -> Play:
    """One play of the per-play layout (module docstring)."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    title = next((s.strip() for s in lines if s.strip()), default_title)
    play = Play(title)
    start = next((i for i, s in enumerate(lines) if _HEADING.match(s.strip())
                  and not _NUMERAL.match(s.strip())), None)
    if start is None:                             # no act, scene or prologue: not a play
        return play
    body = lines[start:]
    names = _speaker_names(body)
    speaker: str | None = None
    in_bracket = in_direction = False
    block_start = True
    for raw in body:
        s = raw.strip()
        if not in_bracket and _END.match(s):
            break
        if not s:
            block_start, in_direction = True, False
            continue
        was_in_bracket = in_bracket
        text, in_bracket = _strip_directions(s, in_bracket)
        if in_direction:                          # an unbracketed direction, to its blank line
            continue
        if not text:                              # a direction, whole
            block_start = True
            continue
        if not was_in_bracket and _HEADING.match(s):
            speaker, block_start = None, True
            continue
        if block_start and _DIRECTION.match(text):
            in_direction = "]" not in s           # "Enter ... him.]": its "[" lost
            continue
        if block_start and not was_in_bracket:
            name = _speaker_name(s)
            if name is not None and name in names:
                speaker = name
                play.roles.setdefault(speaker, [])
                block_start = False
                continue
        block_start = False
        if speaker is not None and not _DIRECTION.match(text):
            play.add(speaker, text)
    play.roles = {r: ls for r, ls in play.roles.items() if ls}
    return play


# --------------------------------------------------------------------------- reading SRC

def _decode(data: bytes) -> str:
    """A text as UTF-8 (a byte-order mark dropped), else as Latin-1 (Gutenberg's older files)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def read_plays(src) -> tuple[str, list[Path], list[Play]]:
    """``(layout, texts read, plays)`` of SRC: a file (the complete works) or a folder of
    ``*.txt`` plays (sorted by name). Files are read as data (regular files, a symlink in the
    folder only to a file inside it, at most :data:`MAX_TEXT_BYTES` each); a bad SRC is one
    line naming SRC."""
    from fedjax_dp.core import files
    src = Path(src).expanduser()
    what = ("Project Gutenberg's complete works of Shakespeare as one .txt file, or a folder of "
            "one .txt file per play")
    if src.is_dir():
        texts = sorted(p for p in src.glob("*.txt"))
        if not texts:
            raise ValueError(f"SRC {str(src)!r} holds no .txt file (it must be {what})")
        if len(texts) > MAX_TEXTS:
            raise ValueError(f"SRC {str(src)!r} holds {len(texts)} .txt files, more than "
                             f"{MAX_TEXTS}; it must be {what}")
        plays = [parse_play(_decode(files.read_bytes(p, max_bytes=MAX_TEXT_BYTES, root=src,
                                                     what="SRC text")),
                            default_title=p.stem.upper()) for p in texts]
        return "plays", texts, plays
    if src.is_file() or src.is_symlink():
        data = files.read_bytes(src, max_bytes=MAX_TEXT_BYTES, root="/",  # the file named
                                what="SRC")
        return "complete_works", [src], parse_complete_works(_decode(data))
    raise ValueError(f"SRC {str(src)!r} does not exist (it must be {what})")


# --------------------------------------------------------------------------- LEAF's clients

def client_id(play: str, role: str) -> str:
    """LEAF's user id of a role in a play (``play_and_character``)."""
    return _NOT_WORD.sub("_", f"{play}_{role}".replace(" ", "_"))


def role_text(lines: Iterable[str]) -> str:
    """A role's text as LEAF's windows read it: every line followed by a space, runs of two or
    more spaces made one."""
    return _SPACES.sub(" ", "".join(f"{line} " for line in lines))


def num_windows(length: int, seq_len: int = vocab_lib.SHAKESPEARE_T) -> int:
    """LEAF's number of samples of a text of ``length`` characters."""
    return max(0, length - seq_len)


def windows(text: str, seq_len: int = vocab_lib.SHAKESPEARE_T, vocab=LEAF_VOCAB
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, T], y [n, T])`` int32, ``n = max(0, len - T)``: window i is ``text[i : i + T]``,
    its targets ``text[i + 1 : i + T + 1]`` (the last one LEAF's label)."""
    n = num_windows(len(text), seq_len)
    if n == 0:
        return np.zeros((0, seq_len), np.int32), np.zeros((0, seq_len), np.int32)
    ids = vocab.ids(text)
    w = np.lib.stride_tricks.sliding_window_view(ids, seq_len + 1)[:n]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


@dataclasses.dataclass(frozen=True)
class Client:
    """One (play, role) client: its id, play, role, number of lines and text."""

    id: str
    play: str
    role: str
    lines: int
    text: str


def clients(plays: list[Play], seq_len: int = vocab_lib.SHAKESPEARE_T
            ) -> tuple[list[Client], dict]:
    """LEAF's clients of ``plays`` (rules 1-2 of the module docstring) and what was dropped."""
    kept: dict[str, tuple[str, str, list[str]]] = {}
    dropped = {"texts_without_roles": [], "roles_few_lines": 0, "roles_no_sample": 0}
    roles = 0
    for play in plays:
        if len(play.roles) < 2:
            dropped["texts_without_roles"].append(play.title)
            continue
        for role, lines in play.roles.items():
            roles += 1
            if len(lines) <= MAX_DROPPED_LINES:
                dropped["roles_few_lines"] += 1
                continue
            cid = client_id(play.title, role)
            if cid in kept:
                kept[cid][2].extend(lines)
            else:
                kept[cid] = (play.title, role, list(lines))
    out = []
    for cid, (title, role, lines) in kept.items():
        text = role_text(lines)
        if num_windows(len(text), seq_len) == 0:
            dropped["roles_no_sample"] += 1
            continue
        out.append(Client(cid, title, role, len(lines), text))
    dropped["roles"] = roles
    return out, dropped


def split_clients(sizes: list[int], split: str, train_fraction: float, seq_len: int,
                  seed: int = 0) -> list[tuple[tuple[int, int] | None, tuple[int, int] | None]]:
    """Per client: ``(train window range, test window range)`` (``(start, stop)`` or None when
    the client is not in that split) under LEAF's split (rule 4 of the module docstring)."""
    out: list = []
    if split == "user":
        k = int(train_fraction * len(sizes))
        train = np.zeros(len(sizes), bool)
        train[np.random.default_rng(seed).choice(len(sizes), size=k, replace=False)] = True
        return [((0, n), None) if t else (None, (0, n)) for n, t in zip(sizes, train)]
    for n in sizes:
        if n < 2:
            out.append((None, None))
            continue
        k = 1 if n == 2 else max(1, int(train_fraction * n))
        lo = k + seq_len - 1
        out.append(((0, k), (lo, n)) if lo < n else (None, None))
    return out


def _quantiles(counts) -> dict:
    c = np.asarray(counts, np.float64)
    if c.size == 0:
        return {}
    q = np.percentile(c, [0, 10, 25, 50, 75, 90, 100])
    q = [round(float(v), 1) for v in q]
    return {"min": int(q[0]), "p10": q[1], "p25": q[2], "median": q[3], "p75": q[4],
            "p90": q[5], "max": int(q[6]),
            "mean": round(float(c.mean()), 2), "std": round(float(c.std()), 2)}


def _check_options(split: str, train_fraction, split_seed) -> tuple[str, float, int]:
    if split not in SPLITS:
        raise ValueError(f"--split must be one of {list(SPLITS)}, got {split!r}")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) or \
            not 0 < float(train_fraction) < 1:
        raise ValueError(f"--train-fraction must be a number in (0, 1), got {train_fraction!r}")
    if split_seed is None:
        return split, float(train_fraction), 0
    if split != "user":
        raise ValueError(f"--split-seed draws --split user's training clients; with --split "
                         f"{split} (every client's first samples) it would change nothing")
    if isinstance(split_seed, bool) or not isinstance(split_seed, (int, np.integer)) or \
            split_seed < 0:
        raise ValueError(f"--split-seed must be an integer >= 0, got {split_seed!r}")
    return split, float(train_fraction), int(split_seed)


class Shakespeare(ClientReader):
    """LEAF's Shakespeare from Gutenberg's text (module docstring) as a
    :class:`fedjax_dp.data.client_reader.ClientReader`: ``x, y [T]`` int32 next-character
    records over LEAF's vocabulary."""

    def __init__(self, src, *, seq_len: int = vocab_lib.SHAKESPEARE_T, split: str = "sample",
                 train_fraction: float = TRAIN_FRACTION, split_seed: int | None = None,
                 window_stride: int = 1):
        self.name = "gutenberg_shakespeare"
        self.split, self.train_fraction, self.split_seed = _check_options(
            split, train_fraction, split_seed)
        if isinstance(window_stride, bool) or not isinstance(window_stride, (int, np.integer)) \
                or window_stride < 1:
            raise ValueError(f"--window-stride must be an integer >= 1, got {window_stride!r}")
        self.window_stride = int(window_stride)
        vocab_lib.set_next_token(self, seq_len, LEAF_VOCAB)
        self.layout, self.texts, plays = read_plays(src)
        src = Path(src).expanduser()
        self.paths = {"train": src, "test": src}
        self.all_clients, dropped = clients(plays, seq_len)
        if not self.all_clients:
            raise ValueError(f"SRC {str(src)!r}: no play with a speaking role found in "
                             f"{len(self.texts)} text(s) (read as the "
                             f"{'per-play' if self.layout == 'plays' else 'complete works'} "
                             f"layout; see fedjax_dp.data.gutenberg)")
        sizes = [num_windows(len(c.text), seq_len) for c in self.all_clients]
        self.ranges = split_clients(sizes, self.split, self.train_fraction, seq_len,
                                    self.split_seed)
        for split_name, j in (("train", 0), ("test", 1)):
            if not any(r[j] for r in self.ranges):
                need = ("" if self.split == "user" else f"; a client needs more than "
                        f"{seq_len - 1} samples after its training ones")
                raise ValueError(f"--train-fraction {self.train_fraction} with --split "
                                 f"{self.split} leaves no {split_name} client among the "
                                 f"{len(sizes)}{need}")
        self.statistics = self._statistics(plays, dropped, sizes)

    def _statistics(self, plays, dropped, sizes) -> dict:
        chars = collections.Counter()
        for c in self.all_clients:
            chars.update(c.text)
        oov = {ch: n for ch, n in sorted(chars.items()) if ch not in LEAF_VOCAB.index}
        per = {}
        for split_name, j in (("train", 0), ("test", 1)):
            n = [self._strided(r[j]) for r in self.ranges if r[j]]
            per[split_name] = {"clients": len(n), "samples": int(sum(n)),
                               "samples_per_client": _quantiles(n)}
        kept_plays = sorted({c.play for c in self.all_clients})
        return {"layout": self.layout, "texts": len(self.texts),
                "plays": len(kept_plays), "texts_dropped": dropped["texts_without_roles"],
                "roles": dropped["roles"], "roles_dropped_two_lines_or_fewer":
                    dropped["roles_few_lines"], "roles_dropped_no_sample":
                    dropped["roles_no_sample"],
                "users": len(self.all_clients), "samples": int(sum(sizes)),
                "lines": int(sum(c.lines for c in self.all_clients)),
                "characters": int(sum(len(c.text) for c in self.all_clients)),
                "samples_per_user": _quantiles(sizes),
                "split": {"kind": self.split, "train_fraction": self.train_fraction,
                          "window_stride": self.window_stride,
                          "seed": self.split_seed if self.split == "user" else None, **per},
                "characters_outside_vocabulary": {repr(k)[1:-1]: v for k, v in oov.items()}}

    def _strided(self, window_range: tuple[int, int]) -> int:
        """The number of windows ``start, start + S, ... < stop`` (rule 5)."""
        start, stop = window_range
        return len(range(start, stop, self.window_stride))

    def sizes(self, split: str) -> Iterator[tuple[str, int]]:
        j = 0 if split == "train" else 1
        for c, r in zip(self.all_clients, self.ranges):
            if r[j]:
                yield c.id, self._strided(r[j])

    def clients(self, split: str) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        j = 0 if split == "train" else 1
        for c, r in zip(self.all_clients, self.ranges):
            if r[j]:
                x, y = windows(c.text, self.seq_len, self.vocab)
                part = slice(r[j][0], r[j][1], self.window_stride)
                yield c.id, np.ascontiguousarray(x[part]), np.ascontiguousarray(y[part])
