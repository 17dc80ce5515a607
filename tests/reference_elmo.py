"""A slow, plain ELMo written straight from the equations, to check the fast encoder.

Independent of elmo_cache's loader and model: it reads the weight file itself, works
in float64 NumPy, one sentence and one timestep at a time, in TensorFlow's gate
order, and counts how often the cell and projection clips fire.
"""

from __future__ import annotations

import json

import h5py
import numpy as np


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def char_ids(token: str, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, 260, dtype=np.int64)
    if token in ("<S>", "</S>"):
        ids[:3] = [258, 256 if token == "<S>" else 257, 259]
    else:
        data = list(token.encode("utf-8", "ignore")[: max_chars - 2])
        ids[0] = 258
        ids[1 : 1 + len(data)] = data
        ids[1 + len(data)] = 259
    return ids + 1


class ReferenceElmo:
    def __init__(self, options_file, weight_file):
        with open(options_file) as f:
            self.opt = json.load(f)
        with h5py.File(weight_file, "r") as f:
            self.w = {name: f[name][()].astype(np.float64) for name in _all_datasets(f)}
        self.cell_clips = 0
        self.proj_clips = 0

    def token_vector(self, token: str) -> np.ndarray:
        cnn = self.opt["char_cnn"]
        table = np.vstack([np.zeros((1, cnn["embedding"]["dim"])), self.w["char_embed"]])
        x = table[char_ids(token, cnn["max_characters_per_token"])]  # (50, C)
        act = np.tanh if cnn["activation"] == "tanh" else (lambda v: np.maximum(v, 0))
        features = []
        for i, (width, num) in enumerate(cnn["filters"]):
            kernel = self.w[f"CNN/W_cnn_{i}"][0]  # (width, C, num)
            best = np.full(num, -np.inf)
            for start in range(x.shape[0] - width + 1):
                value = np.einsum("wc,wcn->n", x[start : start + width], kernel) + self.w[f"CNN/b_cnn_{i}"]
                best = np.maximum(best, value)
            features.append(act(best))
        h = np.concatenate(features)
        for k in range(cnn["n_highway"]):
            g = _sigmoid(h @ self.w[f"CNN_high_{k}/W_carry"] + self.w[f"CNN_high_{k}/b_carry"])
            t = np.maximum(h @ self.w[f"CNN_high_{k}/W_transform"] + self.w[f"CNN_high_{k}/b_transform"], 0)
            h = g * t + (1 - g) * h
        return h @ self.w["CNN_proj/W_proj"] + self.w["CNN_proj/b_proj"]

    def _cell(self, direction, layer, x, h, c):
        lstm = self.opt["lstm"]
        prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
        z = np.concatenate([x, h]) @ self.w[f"{prefix}/W_0"] + self.w[f"{prefix}/B"]
        i, j, f, o = np.split(z, 4)
        c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
        clip = lstm.get("cell_clip")
        if clip is not None:
            self.cell_clips += int((np.abs(c) > clip).sum())
            c = np.clip(c, -clip, clip)
        m = (_sigmoid(o) * np.tanh(c)) @ self.w[f"{prefix}/W_P_0"]
        clip = lstm.get("proj_clip")
        if clip is not None:
            self.proj_clips += int((np.abs(m) > clip).sum())
            m = np.clip(m, -clip, clip)
        return m, c

    def embed(self, tokens: list[str], state: dict | None = None) -> np.ndarray:
        """(3, len(tokens), 2P) in float64. ``state``: ``{(layer, direction): (h, c)}`` to start from
        (zeros where absent), updated in place with the final states, as a row that carries state."""
        lstm = self.opt["lstm"]
        p, d = lstm["projection_dim"], lstm["dim"]
        seq = ["<S>", *tokens, "</S>"]
        emb = np.stack([self.token_vector(t) for t in seq])
        layers = [np.concatenate([emb, emb], axis=1)]
        inputs = {0: emb, 1: emb[::-1]}
        for layer in range(lstm["n_layers"]):
            outs = {}
            for direction in (0, 1):
                h, c = np.zeros(p), np.zeros(d)
                if state is not None:
                    h, c = state.get((layer, direction), (h, c))
                out = []
                for x in inputs[direction]:
                    h, c = self._cell(direction, layer, x, h, c)
                    y = h + x if layer > 0 and lstm.get("use_skip_connections") else h
                    out.append(y)
                if state is not None:
                    state[(layer, direction)] = (h, c)
                outs[direction] = np.stack(out)
            inputs = outs
            layers.append(np.concatenate([outs[0], outs[1][::-1]], axis=1))
        return np.stack(layers)[:, 1:-1]


def _all_datasets(f):
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names
