"""What one row of a cache holds, whatever the container: the layers or fixed mix kept
(``selection``), the pooled sentence vector (``pooling``) and how a row's floats are stored
(``quantize``: float32/float16 and int8; ``pq``: product quantisation, pq and opq)."""
