"""The batch encoder: token lists in, the biLM's three layers out (``encoder``); where each batch's
LSTM state starts (``lstm_states``); the per-batch word cache (``word_cache``); the device and
precision it runs in (``hardware``).
"""

from elmo_cache.encoder.encoder import Encoder

__all__ = ["Encoder"]
