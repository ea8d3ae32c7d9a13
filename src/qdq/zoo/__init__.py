"""Built-in, fully offline models and data for demos and tests.

Submodules are imported on demand so that ``import qdq.zoo`` stays cheap:

* :mod:`qdq.zoo.fashion_mnist` — Fashion-MNIST (from the ``dataset-fashion-mnist`` Debian package)
  and a small pretrained ResNet (``ResNetish``, ~78k parameters, ~92% test accuracy).

Example:
    >>> from qdq.zoo import fashion_mnist
    >>> model = fashion_mnist.load_pretrained()
"""

from __future__ import annotations

__all__: list[str] = []
