"""scripts/bundled_model/ngram_baselines.py: unigram / Kneser-Ney perplexity baselines."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bundled_model" / "ngram_baselines.py"


def _load():
    spec = importlib.util.spec_from_file_location("ngram_baselines", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


nb = _load()
models = sys.modules["_ngram_models"]  # the script's models module, imported beside it
BOS, EOS, UNK = models.BOS_ID, models.EOS_ID, models.UNK_ID


def make_vocab(words):
    return nb.Vocab(["<S>", "</S>", "<UNK>", *words])


def corpus_of(vocab, sentences):
    return nb.encode_lines(sentences, vocab)


def random_corpus(rng, n_sent, seen_words):
    """A Markov-ish text over the first ``seen_words`` words: skewed, with some repetition."""
    trans = rng.dirichlet(np.full(seen_words, 0.05), size=seen_words)
    out = []
    for _ in range(n_sent):
        w = int(rng.integers(seen_words))
        sent = [w]
        for _ in range(int(rng.integers(0, 8))):
            w = int(rng.choice(seen_words, p=trans[w]))
            sent.append(w)
        out.append(" ".join(f"w{i}" for i in sent))
    return out


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(130)]  # w120..w129 never occur in training
    vocab = make_vocab(words)
    # w100..w119: rare words seen after 1..4 distinct words, so unigram continuation counts of
    # 1, 2, 3 and 4 all occur and the order-1 discounts are estimated, not the fallback.
    rare = [f"w{i} w{100 + j}" for j in range(20) for i in range(j % 4 + 1)]
    train_lines = random_corpus(rng, 400, 100) + rare + ["w0 oov1 w1", "oov2"]
    held_lines = random_corpus(rng, 60, 100) + ["w3 w105", "w110 w2"] + ["w127 w3 oov3", "w128 w129"]
    return vocab, corpus_of(vocab, train_lines), corpus_of(vocab, held_lines)


# ---- an independent, slow, dict-based interpolated modified Kneser-Ney --------------------------


def reference_kn(sentences, vocab_size, order):
    raw = {order: Counter()}
    for s in sentences:
        seq = [BOS] * (order - 1) + list(s) + [EOS]
        for i in range(order - 1, len(seq)):
            raw[order][tuple(seq[i - order + 1 : i + 1])] += 1
    adj = {order: dict(raw[order])}
    for k in range(order - 1, 0, -1):
        raw[k], cont = Counter(), Counter()
        for g, c in raw[k + 1].items():
            raw[k][g[1:]] += c
            cont[g[1:]] += 1
        adj[k] = {g: (raw[k][g] if k > 1 and g[0] == BOS else cont[g]) for g in raw[k]}
    disc = {}
    for k in adj:
        n = Counter(min(c, 5) for c in adj[k].values())
        n1, n2, n3, n4 = n[1], n[2], n[3], n[4]
        d = None
        if min(n1, n2, n3, n4) > 0:
            y = n1 / (n1 + 2 * n2)
            d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
            if not all(0 < x <= r for r, x in zip((1, 2, 3), d)):
                d = None
        disc[k] = (0.0, *(d or (0.5, 1.0, 1.5)))
    by_hist = {k: {} for k in adj}
    for k in adj:
        for g, c in adj[k].items():
            by_hist[k].setdefault(g[:-1], {})[g[-1]] = c

    def p(k, hist, w):
        if k == 0:
            return 1.0 / (vocab_size - 1)
        h = tuple(hist[len(hist) - (k - 1) :]) if k > 1 else ()
        entries = by_hist[k].get(h)
        if not entries:
            return p(k - 1, hist, w)
        total = sum(entries.values())
        gamma = sum(disc[k][min(c, 3)] for c in entries.values())
        c = entries.get(w, 0)
        return (max(c - disc[k][min(c, 3)], 0) + gamma * p(k - 1, hist, w)) / total

    return p


def sentences_of(corpus):
    bounds = np.concatenate([[0], np.cumsum(corpus.lengths)])
    return [corpus.ids[a:b].tolist() for a, b in itertools.pairwise(bounds)]


# ---- tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", [1, 2, 3])
def test_distributions_sum_to_one(toy, order):
    vocab, train, _ = toy
    model = nb.KneserNey.fit(train, len(vocab), order)
    ids = vocab.ids
    contexts = [
        (BOS, BOS),  # sentence start
        (BOS, ids["w0"]),  # seen start
        (ids["w0"], ids["w1"]),  # likely seen
        (ids["w3"], ids["w7"]),
        (ids["w126"], ids["w3"]),  # unseen history, seen last word
        (ids["w3"], ids["w127"]),  # last word never in training
        (ids["w128"], ids["w129"]),  # nothing seen
        (UNK, UNK),
        (ids["w1"], UNK),
    ]
    seen_some = False
    for ctx in contexts:
        p = model.distribution(ctx)
        assert p.shape == (len(vocab),)
        assert p[BOS] == 0.0
        assert np.all(p[1:] > 0), ctx
        assert abs(p.sum() - 1.0) < 1e-9, (ctx, p.sum())
        if order > 1 and model.levels[-1].hist.size:
            hkey = 0
            for tok in ctx[len(ctx) - (order - 1) :]:
                hkey = hkey * len(vocab) + tok
            seen_some |= bool(np.isin(hkey, model.levels[-1].hist))
    assert order == 1 or seen_some  # the highest order is exercised, not only back-off


def test_matches_dict_reference(toy):
    vocab, train, held = toy
    v = len(vocab)
    for order in (2, 3):
        model = nb.KneserNey.fit(train, v, order)
        assert not any(level.fallback for level in model.levels), "toy corpus too small to test estimation"
        assert not model.unigram_fallback
        ref = reference_kn(sentences_of(train), v, order)
        stream, targets = held.padded(order)
        hist = np.stack([stream[targets - b] for b in range(order - 1, 0, -1)], axis=1)
        got = model.prob(hist, stream[targets])
        want = [ref(order, hist[i].tolist(), int(stream[t])) for i, t in enumerate(targets)]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        assert np.allclose(np.exp(model.logprobs(held)), got, rtol=1e-12)
        # distribution() agrees with prob() row by row
        for i in range(0, targets.size, 17):
            dist = model.distribution(hist[i].tolist())
            assert dist[stream[targets[i]]] == pytest.approx(got[i], rel=1e-12)


def test_perplexity_toy_repetitive():
    vocab = make_vocab(["the", "cat", "sat", "on", "mat", "dog", "ran", "in", "park"])
    lines = ["the cat sat on the mat", "the dog ran in the park"] * 50
    train = corpus_of(vocab, lines)
    held = corpus_of(vocab, ["the cat sat on the mat", "the dog ran in the park", "the cat ran in the park"])
    res = nb.evaluate(train, held, vocab)
    ppl = {k: m["perplexity"] for k, m in res["models"].items()}
    assert all(math.isfinite(x) and x >= 1 for x in ppl.values()), ppl
    assert ppl["kn_trigram"] < ppl["unigram"] / 2, ppl
    assert ppl["kn_bigram"] < ppl["unigram"], ppl
    assert res["heldout"]["predictions"] == 3 * 7 == res["models"]["kn_trigram"]["predictions"]
    # add-one unigram by hand: 100 sentences, 600 tokens + 100 </S>; support = V - 1 = 11
    uni = nb.UnigramAddOne(train, len(vocab))
    assert uni.p[vocab.ids["the"]] == pytest.approx((200 + 1) / (700 + 11))
    assert uni.p[UNK] == pytest.approx(1 / 711)
    assert uni.p.sum() == pytest.approx(1.0, abs=1e-12)


def test_oov_mapping(tmp_path):
    (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\na\nb\n", encoding="utf-8")
    vocab = nb.Vocab.from_file(tmp_path / "vocab.txt")
    assert len(vocab) == 5
    c = corpus_of(vocab, ["a zzz b", "", "<S> <UNK> b q", "   "])
    assert c.ids.tolist() == [3, UNK, 4, UNK, UNK, 4, UNK]
    assert c.lengths.tolist() == [3, 4]
    assert c.oov_tokens == 3  # zzz, <S>, q (a literal <UNK> is in the vocabulary)
    assert c.empty_lines == 2
    assert c.num_predictions == 9
    stream, targets = c.padded(3)
    assert stream.tolist() == [BOS, BOS, 3, UNK, 4, EOS, BOS, BOS, UNK, UNK, 4, UNK, EOS]
    assert stream[targets].tolist() == [3, UNK, 4, EOS, UNK, UNK, 4, UNK, EOS]
    stats = nb._corpus_stats(c)
    assert stats["oov_rate"] == pytest.approx(3 / 7)
    with pytest.raises(ValueError):
        nb.Vocab(["</S>", "<S>", "<UNK>", "a"])


def test_discounts_by_hand():
    d, fb = models.kn_discounts(10, 4, 2, 1)  # Y = 10/18
    assert not fb
    assert d == pytest.approx((5 / 9, 7 / 6, 17 / 9))
    assert models.kn_discounts(5, 0, 1, 1) == (models.FALLBACK_DISCOUNTS, True)
    assert models.kn_discounts(1, 1, 10, 1)[1]  # D2 = 2 - 3 (1/3) 10 < 0: fallback
    assert models.kn_discounts(7, 3, 2, 1)[0][0] == pytest.approx(7 / 13)  # D1 = Y

    # One-word sentences: a x1, b x2, c x3, d x4. Bigram counts (<S> w) = (w </S>) = 1, 2, 3, 4,
    # so n1..n4 = 2 each: Y = 1/3, D1 = 1/3, D2 = 1, D3+ = 5/3.
    vocab = make_vocab(["a", "b", "c", "d"])
    train = corpus_of(vocab, ["a"] + ["b"] * 2 + ["c"] * 3 + ["d"] * 4)
    bi = nb.KneserNey.fit(train, len(vocab), 2)
    (level,) = bi.levels
    assert level.count_of_counts == (2, 2, 2, 2)
    assert level.discounts[1:] == pytest.approx([1 / 3, 1, 5 / 3])
    # Unigram continuation counts: a, b, c, d each after <S> only (1); </S> after 4 words (4).
    assert bi.unigram_count_of_counts == (4, 0, 0, 1)
    assert bi.unigram_fallback  # n2 = 0
    p1_d = (1 - 0.5 + (4 * 0.5 + 1.5) / 6) / 8  # 6 = V - 1 predictable words, 8 = sum of counts
    assert bi.p1[vocab.ids["d"]] == pytest.approx(p1_d)
    gamma = 1 / 3 + 1 + 5 / 3 + 5 / 3
    want = (4 - 5 / 3 + gamma * p1_d) / 10
    assert bi.prob([[BOS]], [vocab.ids["d"]])[0] == pytest.approx(want)

    # Trigram: continuation vs. raw counts at order 2. Sentences "a b", "c b", "a b".
    tri = nb.KneserNey.fit(corpus_of(vocab, ["a b", "c b", "a b"]), len(vocab), 3)
    v = len(vocab)
    a, b, c = vocab.ids["a"], vocab.ids["b"], vocab.ids["c"]
    bigram = dict(zip(tri.levels[0].keys.tolist(), tri.levels[0].counts.tolist()))
    assert bigram == {
        BOS * v + a: 2,  # begins with <S>: raw count
        BOS * v + c: 1,
        a * v + b: 1,  # only ever after <S>: one left extension
        c * v + b: 1,
        b * v + EOS: 2,  # after a and after c
    }
    trigram = dict(zip(tri.levels[1].keys.tolist(), tri.levels[1].counts.tolist()))
    assert trigram[(BOS * v + BOS) * v + a] == 2 and trigram[(a * v + b) * v + EOS] == 2
    assert sum(trigram.values()) == 3 * 3  # n + 1 predictions per sentence


def test_cli_json(tmp_path, capsys):
    (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nx\ny\nz\n", encoding="utf-8")
    (tmp_path / "train.txt").write_text("x y z\nx y\ny z x\n" * 5, encoding="utf-8")
    (tmp_path / "heldout.txt").write_text("x y z\nq x\n", encoding="utf-8")
    out = tmp_path / "out" / "b.json"
    argv = ["--train", str(tmp_path / "train.txt"), "--heldout", str(tmp_path / "heldout.txt")]
    assert nb.main([*argv, "--vocab", str(tmp_path / "vocab.txt"), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["heldout"]["predictions"] == 4 + 3
    assert res["heldout"]["oov_rate"] == pytest.approx(1 / 5)
    assert set(res["models"]) == {"unigram", "kn_bigram", "kn_trigram"}
    assert "perplexity" in capsys.readouterr().out
