"""Sequence tasks end to end through the CLI: ``fedjax-dp data convert`` of a Shakespeare-format
and a StackOverflow-format fixture (TFF's HDF5 layouts, generated), then ``fedjax-dp run``:
DP-FedAvg next-character prediction with ``char_lstm`` and FedAvg next-word prediction with
``word_lstm`` (tiny sizes), with per-token accuracies in result.json and its history."""
import json

import numpy as np

from fedjax_dp.experiments import cli
from fedjax_dp.models import tasks

from federated_fixtures import write_tff


def _run(tmp_path, fmt, src, convert_args, model, algorithm):
    dst = tmp_path / "pop"
    assert cli.main(["data", "convert", fmt, str(src), str(dst), *convert_args, "--quiet"]) == 0
    counts = np.load(dst / "counts.npy")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""seed = 0
[data]
dataset = "stacked:{dst}"
num_agents = {len(counts)}
[model]
name = "{model[0]}"
options = {model[1]}
[train]
steps = 2
batch_size = 2
learning_rate = 0.5
[algorithm]
{algorithm}
[privacy]
delta = 1e-5
accountants = ["rdp"]
[run]
eval_every = 2
compilation_cache = "off"
""")
    assert cli.main(["run", str(cfg), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    return dst, result


def _check_token_metrics(dst, result):
    """The per-token metrics are token counts over the published test split: each accuracy
    times its token count (computed here from y_test and task.json) is a whole number of hits,
    and the token sets nest (real >= no OOV >= no OOV or EOS)."""
    task = tasks.load(dst)
    assert isinstance(task, tasks.NextToken)
    with np.load(dst / "server.npz") as z:
        y = z["y_test"]
    real = y != task.pad_id
    no_oov = real & ~np.isin(y, task.oov_ids)
    no_eos = no_oov & (y != task.eos_id)
    assert result["test_num_tokens"] == int(real.sum()) > int(no_eos.sum()) > 0
    for key, m in (("test_accuracy", real), ("test_accuracy_no_oov", no_oov),
                   ("test_accuracy_no_oov_or_eos", no_eos)):
        hits = result[key] * m.sum()
        assert 0.0 <= result[key] <= 1.0 and abs(hits - round(hits)) < 1e-6, key
    last = result["history"][-1]
    assert {"test_accuracy", "test_accuracy_no_oov", "test_accuracy_no_oov_or_eos",
            "test_num_tokens"} <= set(last)
    return task


def _snippet(rng):
    """A line following the rule c -> the next letter of 'abcdefgh' (and a space after 'h')."""
    start, length = int(rng.integers(0, 9)), int(rng.integers(5, 30))
    return "".join("abcdefgh "[(start + k) % 9] for k in range(length)).encode()


def test_next_character_dp_fedavg_through_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    src.mkdir()
    for split, sizes in (("train", (5, 3, 4, 6)), ("test", (3, 2))):
        write_tff(src / f"shakespeare_{split}.h5",
                  {f"ROLE_{c}": {"snippets": [_snippet(rng) + (b"~" if c == 1 else b"")
                                              for _ in range(n)]}
                   for c, n in enumerate(sizes)})
    dst, result = _run(tmp_path, "tff_shakespeare", src, ["--seq-len", "20"],
                       ("char_lstm", '{embed_dim = 3, hidden = 6, layers = 1}'),
                       'name = "dp_fedavg"\nrounds = 4\nsampling_rate = 1.0\nclip_norm = 1.0\n'
                       'noise_multiplier = 0.5')
    task = _check_token_metrics(dst, result)
    assert task.vocab_size == 90 and result["config"]["model"]["name"] == "char_lstm"
    assert result["privacy"][0]["unit"] == "agent" and result["privacy"][0]["epsilon"] > 0


def test_next_word_fedavg_through_the_cli(tmp_path):
    rng = np.random.default_rng(1)
    words = ["w%d" % i for i in range(8)]
    src = tmp_path / "src"
    src.mkdir()

    def sentences(n):
        return [" ".join(words[(s + k) % 8] for k in range(int(rng.integers(2, 8)))).encode()
                for s in rng.integers(0, 8, n)]

    for split, sizes in (("train", (4, 6, 3)), ("test", (5, 4))):
        write_tff(src / f"stackoverflow_{split}.h5",
                  {str(100 + c): {"tokens": sentences(n)} for c, n in enumerate(sizes)})
    dst, result = _run(tmp_path, "tff_stackoverflow", src, ["--vocab-size", "5"],
                       ("word_lstm", '{embed_dim = 4, hidden = 6, projection = 4}'),
                       'name = "fedavg"\nrounds = 4')
    task = _check_token_metrics(dst, result)
    assert task.vocab_size == 5 + 4 and len(task.oov_ids) == 1     # 5 words, pad, oov, bos, eos
