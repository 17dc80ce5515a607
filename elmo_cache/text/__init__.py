"""The text stage: corpora read line by line (:mod:`~elmo_cache.text.corpus`) and the tokenisation and
sentence hash every later stage agrees on (:mod:`~elmo_cache.text.tokenize`)."""
