"""Readers of the published federated datasets (TFF HDF5, LEAF JSON) and their tokenisers, on
small generated files with the real layouts (tests/federated_fixtures.py)."""
import json

import numpy as np
import pytest

from federated_fixtures import write_emnist, write_leaf, write_tff
from fedjax_dp.data import leaf_json, tff_hdf5
from fedjax_dp.data import vocab as V


def _all(reader, split):
    return {cid: (x, y) for cid, x, y in reader.clients(split)}


# ---- tokenisers -------------------------------------------------------------------------------

def test_shakespeare_vocab_ids_are_tffs():
    v = V.SHAKESPEARE
    assert (v.size, v.pad_id, v.oov_id, v.bos_id, v.eos_id) == (90, 0, 87, 88, 89)
    # TFF: CHAR_VOCAB[i] -> i + 1 (0 is pad), any other byte -> the one OOV id
    assert V.char_ids("d").tolist() == [1] and V.char_ids("\r").tolist() == [86]
    assert V.char_ids("~").tolist() == [87]
    assert V.char_ids("é").tolist() == [87, 87]          # two UTF-8 bytes, each OOV


def test_char_windows_wrap_pad_and_shift():
    x, y = V.char_windows("dh", seq_len=4)               # [bos d h eos] + 1 pad = one window
    assert x.tolist() == [[88, 1, 2, 89]] and y.tolist() == [[1, 2, 89, 0]]
    s = "d" * 9                                          # 11 ids -> 3 windows of 5
    x, y = V.char_windows(s, seq_len=4)
    assert x.shape == (3, 4) == y.shape == (V.num_char_windows(9, 4), 4)
    flat = np.concatenate([np.c_[x, y[:, -1:]]]).reshape(-1)
    assert flat[:11].tolist() == [88] + [1] * 9 + [89] and not flat[11:].any()
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])   # y is x shifted by one


def test_word_sequence_bos_eos_truncation_oov():
    v = V.Vocab(("a", "b"))
    assert (v.oov_id, v.bos_id, v.eos_id, v.size) == (3, 4, 5, 6)
    x, y = V.word_sequence("a zz b", v, seq_len=5)
    assert x.tolist() == [4, 1, 3, 2, 5] and y.tolist() == [1, 3, 2, 5, 0]
    x, y = V.word_sequence("a a a a a a a", v, seq_len=3)   # >= T words: truncated, no eos
    assert x.tolist() == [4, 1, 1] and y.tolist() == [1, 1, 1]


def test_vocab_file_with_counts_and_top_words(tmp_path):
    p = tmp_path / "stackoverflow.word_count"
    p.write_text("the 900\nto 800\ni 700\n")
    assert V.load_vocab(p, 2).tokens == ("the", "to")
    assert V.load_vocab(p, default=2).tokens == ("the", "to")     # no size: the default's
    assert V.load_vocab(p, default=10).tokens == ("the", "to", "i")
    with pytest.raises(ValueError, match="holds 3 tokens"):
        V.load_vocab(p, 5)
    import collections
    top = V.top_words(collections.Counter({"b": 2, "a": 2, "c": 5, "d": 1}), 3)
    assert top.tokens == ("c", "a", "b")                 # by count, ties by the word
    V.SHAKESPEARE.save(tmp_path / "v.txt")               # "\n" and "\r" tokens survive
    assert V.load_vocab(tmp_path / "v.txt").tokens == V.SHAKESPEARE.tokens


def test_sent140_split_line_is_leafs():
    assert V.split_line("I can't wait!! see u, ok") == ["I", "can't", "wait", "!", "!", "see",
                                                        "u", ",", "ok"]
    v = V.Vocab(("wait", "!"))
    assert V.sent140_ids("wait!! no", v, seq_len=5).tolist() == [1, 2, 2, 3, 0]


# ---- TFF HDF5 ----------------------------------------------------------------------------------

def test_tff_emnist_clients_counts_labels(tmp_path):
    rng = np.random.default_rng(0)
    write_emnist(tmp_path, rng, [3, 1, 4], [2, 1])
    r = tff_hdf5.EMNIST(tmp_path)
    ids = [c for c, _ in r.sizes("train")]
    assert ids == sorted(ids) and len(ids) == 3
    assert [n for _, n in r.sizes("train")] == [3, 1, 4]
    assert [n for _, n in r.sizes("test")] == [2, 1]
    import h5py
    with h5py.File(tmp_path / "fed_emnist_train.h5") as f:
        for cid, (x, y) in _all(r, "train").items():
            assert x.shape == (len(y), 28, 28, 1) and x.dtype == np.float32
            np.testing.assert_array_equal(x[..., 0], f[f"examples/{cid}/pixels"][()])
            np.testing.assert_array_equal(y, f[f"examples/{cid}/label"][()])
    assert r.num_classes == 62 and r.task is None
    r.close()
    assert tff_hdf5.EMNIST(tmp_path / "fed_emnist_train.h5").paths["test"] == \
        tmp_path / "fed_emnist_test.h5"                  # SRC may be the train file


def test_tff_cifar100_scales_images_and_keeps_fine_labels(tmp_path):
    rng = np.random.default_rng(1)
    def clients(ids, n):
        return {c: {"image": rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8),
                    "label": rng.integers(0, 100, n).astype(np.int64),
                    "coarse_label": rng.integers(0, 20, n).astype(np.int64)} for c in ids}
    train, test = clients(["0", "1", "10"], 2), clients(["0", "7"], 3)
    write_tff(tmp_path / "fed_cifar100_train.h5", train)
    write_tff(tmp_path / "fed_cifar100_test.h5", test)
    r = tff_hdf5.CIFAR100(tmp_path)
    got = _all(r, "test")
    assert list(got) == ["0", "7"]                        # test clients are their own ids
    for cid, (x, y) in got.items():
        np.testing.assert_allclose(x, test[cid]["image"] / 255.0, rtol=1e-6)
        np.testing.assert_array_equal(y, test[cid]["label"])
    assert [c for c, _ in r.sizes("train")] == ["0", "1", "10"]   # string order, as TFF


def test_tff_shakespeare_snippets_to_windows(tmp_path):
    train = {"ALL_S_WELL_KING": {"snippets": [b"dh", b"d" * 200]},
             "HAMLET": {"snippets": [b"To be"]}}
    write_tff(tmp_path / "shakespeare_train.h5", train)
    write_tff(tmp_path / "shakespeare_test.h5", {"HAMLET": {"snippets": [b"or not"]}})
    r = tff_hdf5.Shakespeare(tmp_path)
    sizes = dict(r.sizes("train"))
    assert sizes == {"ALL_S_WELL_KING": 1 + 3, "HAMLET": 1}   # ceil((n+2)/81) per snippet
    x, y = _all(r, "train")["ALL_S_WELL_KING"]
    assert x.shape == y.shape == (4, 80) and x.dtype == np.int32
    assert x[0, :4].tolist() == [88, 1, 2, 89] and y[0, :3].tolist() == [1, 2, 89]
    assert r.task == {"kind": "next_token", "vocab_size": 90, "pad_id": 0, "oov_ids": [87],
                      "bos_id": 88, "eos_id": 89}


def test_tff_stackoverflow_vocab_counts_clients_not_occurrences(tmp_path):
    train = {"1": {"tokens": [b"a a a a", b"b"], "title": [b"t", b"t"]},
             "2": {"tokens": [b"b c"], "title": [b"t"]},
             "3": {"tokens": [b"c d"], "title": [b"t"]}}
    write_tff(tmp_path / "stackoverflow_train.h5", train)
    write_tff(tmp_path / "stackoverflow_test.h5", {"9": {"tokens": [b"a b zz"],
                                                         "title": [b"t"]}})
    r = tff_hdf5.StackOverflow(tmp_path, vocab_size=2)
    r.prepare()
    # users per word: b 2, c 2, a 1, d 1 -> top 2 = b, c (a is frequent in ONE client only)
    assert r.vocab.tokens == ("b", "c") and r.num_classes == 6
    x, y = _all(r, "test")["9"]
    assert x.shape == (1, 20)
    assert x[0, :5].tolist() == [4, 3, 1, 3, 5]          # bos a(oov) b zz(oov) eos
    assert r.task["oov_ids"] == [3] and r.task["eos_id"] == 5
    (tmp_path / "words").write_text("zz 9\nb 1\n")                # a word_count file
    r = tff_hdf5.StackOverflow(tmp_path, vocab_file=tmp_path / "words")
    r.prepare()
    assert r.vocab.tokens == ("zz", "b")
    x, _ = _all(r, "test")["9"]
    assert x[0, :5].tolist() == [4, 3, 2, 1, 5]          # bos a(oov) b zz eos


def test_tff_bad_layouts_are_named(tmp_path):
    import h5py
    with pytest.raises(ValueError, match="does not exist"):
        tff_hdf5.EMNIST(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="fed_emnist_train.h5"):
        tff_hdf5.EMNIST(tmp_path)
    with h5py.File(tmp_path / "fed_emnist_train.h5", "w") as f:
        f["data/x"] = np.zeros(3)
    (tmp_path / "fed_emnist_test.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="no top-level group 'examples'"):
        tff_hdf5.EMNIST(tmp_path)
    rng = np.random.default_rng(0)
    write_emnist(tmp_path, rng, [2], [1])
    write_tff(tmp_path / "fed_emnist_test.h5", {"a": {"pixels": np.zeros((1, 28, 28))}})
    with pytest.raises(ValueError, match=r"has no \['label'\]"):
        tff_hdf5.EMNIST(tmp_path)
    write_emnist(tmp_path, rng, [2], [1])
    r = tff_hdf5.EMNIST(tmp_path / "fed_emnist_train.h5", only_digits=True)   # 62 classes
    with pytest.raises(ValueError, match=r"labels outside \[0, 10\)"):
        dict((c, 1) for c, _, _ in r.clients("train"))


# ---- LEAF JSON ---------------------------------------------------------------------------------

def test_leaf_femnist_shards_users_counts(tmp_path):
    rng = np.random.default_rng(2)
    def user(n):
        return rng.random((n, 784)).round(3).tolist(), rng.integers(0, 62, n).tolist()
    shards = [{"f_0": user(2), "f_1": user(1)}, {"f_2": user(3)}]
    write_leaf(tmp_path, "train", shards)
    write_leaf(tmp_path, "test", [{"f_0": user(1), "f_2": user(1)}])
    r = leaf_json.FEMNIST(tmp_path)
    assert list(r.sizes("train")) == [("f_0", 2), ("f_1", 1), ("f_2", 3)]
    got = _all(r, "train")
    for shard in shards:
        for u, (xs, ys) in shard.items():
            np.testing.assert_allclose(got[u][0].reshape(-1, 784), np.asarray(xs), rtol=1e-6)
            assert got[u][0].shape[1:] == (28, 28, 1) and got[u][1].tolist() == ys
    assert [u for u, _ in r.sizes("test")] == ["f_0", "f_2"]


def test_leaf_shakespeare_next_char_per_position(tmp_path):
    s = "dhlptx" * 13 + "dh"                              # 80 characters
    write_leaf(tmp_path, "train", [{"ROMEO": ([s], ["@"])}])
    write_leaf(tmp_path, "test", [{"ROMEO": ([s], ["}"])}])   # '}' is LEAF's, not TFF's: OOV
    r = leaf_json.Shakespeare(tmp_path)
    (x, y), = _all(r, "train").values()
    assert x[0].tolist() == V.char_ids(s).tolist()
    assert y[0].tolist() == V.char_ids(s[1:] + "@").tolist() and y[0, -1] == 7
    (x, y), = _all(r, "test").values()
    assert y[0, -1] == V.SHAKESPEARE.oov_id


def test_leaf_sent140_words_and_labels(tmp_path):
    def tweet(text):
        return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text]
    write_leaf(tmp_path, "train", [{"u1": ([tweet("good good day"), tweet("bad day")], [1, 0])},
                                   {"u2": ([tweet("good")], [1])}])
    write_leaf(tmp_path, "test", [{"u1": ([tweet("a good day")], [1])}])
    r = leaf_json.Sent140(tmp_path, vocab_size=2)
    r.prepare()
    assert r.vocab.tokens == ("good", "day")             # occurrences: good 3, day 2, bad 1
    x, y = _all(r, "train")["u1"]
    assert x.dtype == np.float32 and x.shape == (2, 25)
    assert x[0, :4].tolist() == [1, 1, 2, 0] and x[1, :2].tolist() == [3, 2]
    assert y.tolist() == [1, 0] and r.num_classes == 2 and r.task is None


def test_leaf_bad_layouts_are_named(tmp_path):
    with pytest.raises(ValueError, match="train/ folder"):
        leaf_json.FEMNIST(tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    with pytest.raises(ValueError, match="holds no .json shard"):
        leaf_json.FEMNIST(tmp_path)
    (tmp_path / "train" / "a.json").write_text(json.dumps({"users": ["u"], "user_data": {}}))
    (tmp_path / "test" / "a.json").write_text("{")
    r = leaf_json.FEMNIST(tmp_path)
    with pytest.raises(ValueError, match="needs the keys"):
        list(r.sizes("train"))
    with pytest.raises(ValueError, match="not valid JSON"):
        list(r.sizes("test"))
    write_leaf(tmp_path, "train", [{"u": ([[0.0] * 784], [0, 1])}])
    (tmp_path / "train" / "a.json").unlink()
    with pytest.raises(ValueError, match="num_samples 2 but 1 x"):
        list(leaf_json.FEMNIST(tmp_path).sizes("train"))
    write_leaf(tmp_path, "train", [{"u": ([[0.0] * 783], [0])}])
    with pytest.raises(ValueError, match="user 'u': x must be rows of 784"):
        list(leaf_json.FEMNIST(tmp_path).clients("train"))
