"""Segmented Chinese end to end (issue 20, item 5): an ELMoForManyLangs-format Chinese model, a word-segmented
corpus, the build through the CLI, lookups by text and by token list, and the server started from the cache
alone (it finds the model the cache names)."""

from __future__ import annotations

import urllib.parse

import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.cli.main import cli
from elmo_cache.server import Settings, create_app, load_resources
from elmo_cache.verify.checks import verify
from tests.efml_fixtures import write_model
from tests.server_helpers import close, decode, decode_item, run, settings

# Word-segmented Chinese as the Chinese ELMo pipelines feed it: words separated by spaces, full-width
# punctuation, characters the model's char.dic lacks (OOV), a word longer than the character limit.
SEGMENTED = [
    "我们 是 中文 。",
    "中文 好 ！",
    "我们 喜欢 学习 中文",
    "",
    "他们 是 我们 的 朋友 。",
    "中华人民共和国中央人民政府 成立",
]


@pytest.fixture(params=["lines", "tsv"])
def built(request, tmp_path):
    model = write_model(tmp_path / "zh-model")
    corpus = tmp_path / f"zh.{request.param}"
    lines = SEGMENTED if request.param == "lines" else [line.replace(" ", "\t") for line in SEGMENTED]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "zh.zarr"
    args = ["build", str(corpus), "-o", str(output), "--model", str(model), "--device", "cpu", "--no-progress"]
    result = CliRunner().invoke(cli, [*args, "--input-format", request.param, "--layers", "1,2"])
    assert result.exit_code == 0, result.output
    return model, output


def test_segmented_chinese_builds_and_answers_by_text_and_by_tokens(built):
    model, output = built
    encoder = Encoder.load(model, device="cpu")
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(SEGMENTED)
        assert [cache.tokens(i) for i in range(len(cache))] == [line.split() for line in SEGMENTED]
        for i, line in enumerate(SEGMENTED):
            assert cache.find(line) == i and cache.find(line.split()) == i
            if line:
                close(cache.get(line), encoder.embed_sentence(line.split())[1:])
        assert cache.get("我们是中文。") is None  # unsegmented text is another sentence
    assert verify(output, sample=2).ok


def test_segmented_chinese_is_served_from_the_cache_and_live(built):
    model, output = built
    cache = elmo_cache.open(output)
    encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is not None and encoder.directory == model.resolve()
    app = create_app(settings(), encoder=encoder, cache=cache)
    query = urllib.parse.urlencode({"sentence": SEGMENTED[0]})

    async def scenario(client):
        one = await client.get(f"/embed?{query}")
        many = await client.post("/embed", json={"sentences": [["中文", "好", "！"], "我们 学习 中文"]})
        return one, many

    one, many = run(app, scenario)
    assert one.status_code == 200 and one.json()["source"] == "cache"
    np.testing.assert_array_equal(decode(one), cache.get(SEGMENTED[0]))
    results = many.json()["results"]
    assert [r["source"] for r in results] == ["cache", "live"]
    close(decode_item(results[1]), encoder.embed_sentence(["我们", "学习", "中文"])[1:])
    cache.close()
