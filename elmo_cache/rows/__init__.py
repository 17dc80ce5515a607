"""What one row of a cache holds, whatever the container: the layers or fixed mix kept
(``selection``), the pooled sentence vector (``pooling``) and how a row's floats are stored
(``codecs``: the row codec protocol, its registry and the float codecs; ``quantize``: int8;
``pq``: product quantisation, pq and opq, trained by ``pq_training``)."""
