"""The model stage: an ELMo biLM as files and as computation.

* :mod:`~elmo_cache.model.options`: ``options.json`` (the architecture);
* :mod:`~elmo_cache.model.weights`: the official weight file, read and written;
* :mod:`~elmo_cache.model.chars`: character ids as the original computes them;
* :mod:`~elmo_cache.model.efml`: ELMoForManyLangs (HIT-SCIR) model directories, mapped onto the biLM;
* :mod:`~elmo_cache.model.formats`: a resolved model's files read in their format (bilm-tf or ELMoForManyLangs);
* :mod:`~elmo_cache.model.bilm`: the char-CNN and biLSTM in PyTorch;
* :mod:`~elmo_cache.model.hub`: model names (bundled, published, directories) resolved to files;
* :mod:`~elmo_cache.model.identity`: whether two models compute the same vectors;
* :mod:`~elmo_cache.model.random_model`: random models in the official layout (tests, benchmarks);
* ``bundled/``: the model shipped with the package (package data).
"""
