"""``QuantDescriptor``: how a tensor is quantized (``pytorch_quantization.tensor_quant``'s class).

The descriptor is a read-only bag of settings with upstream's field names, defaults, checks and
messages. ``amax`` is kept as upstream keeps it: a float32 :class:`numpy.ndarray` (0-d for a
number, 1-d or more for a list), so ``desc.amax == np.float32(0.7)`` holds.

Two places are kinder than upstream and say so:

* :meth:`ScaledQuantDescriptor.dict` also carries ``calib_method`` and ``narrow_range`` when they
  are not the defaults (upstream drops them, so a round trip through ``dict()``/YAML lost them);
* :meth:`~ScaledQuantDescriptor.to_yaml`/:meth:`~ScaledQuantDescriptor.from_yaml` accept an int
  ``axis`` (upstream calls ``list(axis)`` and fails), and ``==`` compares multi-element amax
  arrays (upstream's ``__dict__`` comparison raises "truth value ... is ambiguous").
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = [
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QuantDescriptor",
    "ScaledQuantDescriptor",
]

_log = logging.getLogger("pytorch_quantization")

#: The only tuple ``num_bits`` takes: FP8 E4M3 (4 exponent bits, 3 mantissa bits).
E4M3 = (4, 3)


class ScaledQuantDescriptor:
    """How a tensor is quantized: width, scale granularity, amax and range options.

    Args:
        num_bits: an int (integer quantization with that many bits; 0 is accepted with an error
            log, every value then quantizes to 0) or the tuple ``(4, 3)`` (FP8 E4M3). Default 8.
        name: an optional string shown by ``str()``.

    Keyword Args:
        fake_quant: quantize-dequantize (``True``, default) or return integer codes.
        axis: ``None`` (one amax for the tensor), an int or a tuple of ints: the axes that keep
            their own amax (``0`` on a KCRS weight is per output channel).
        amax: a float, list or ndarray; stored as a float32 ndarray.
        learn_amax: make amax a trainable parameter (``axis`` must then be ``None``).
        scale_amax: a number amax is multiplied by (experiments).
        calib_method: ``"max"`` (default) or ``"histogram"``.
        unsigned: quantize to ``[0, 2**num_bits - 1]``.
        narrow_range: signed range ``[-(2**(n-1) - 1), 2**(n-1) - 1]`` (no ``-2**(n-1)``).

    Raises:
        ValueError: a negative ``num_bits``.
        TypeError: another ``num_bits`` type, a ``name`` that is not a string, an ``amax`` that is
            not a float/list/ndarray, ``axis`` together with ``learn_amax``, or unknown keywords
            ("Unused keys: ...").

    Example:
        >>> d = QuantDescriptor(num_bits=8, axis=(0,), amax=[1.5, 2.0])
        >>> d.axis, d.amax.dtype, d.dict()["amax"]
        ((0,), dtype('float32'), [1.5, 2.0])
        >>> str(QuantDescriptor(unsigned=True))
        'QuantDescriptor(unsigned 8bit fake axis= per-tensor)'
    """

    def __init__(self, num_bits: int | tuple[int, int] = 8, name: str | None = None, **kwargs: Any):
        if isinstance(num_bits, int):
            if num_bits < 0:
                raise ValueError(f"num_bits must be > 0, not {num_bits}.")
            if num_bits == 0:
                _log.error("num_bits is 0: every value quantizes to 0 (only useful for debugging).")
        elif num_bits != E4M3:
            raise TypeError(
                f"num_bits must be a postive integer or tuple (4,3), not {type(num_bits)}."
            )
        self._num_bits = num_bits
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string or None, not {type(name)}.")
        self._name = name

        self._fake_quant = kwargs.pop("fake_quant", True)
        self._axis = kwargs.pop("axis", None)
        self._learn_amax = kwargs.pop("learn_amax", False)
        if self._learn_amax and self._axis is not None:
            raise TypeError(
                f"axis is ignored and must be None when learn_amax is true, got {type(self._axis)}."
            )
        amax = kwargs.pop("amax", None)
        if amax is not None and not isinstance(amax, (float, list, np.ndarray)):
            raise TypeError(f"amax must be float, list or ndarray, not {type(amax)}")
        self._amax = None if amax is None else np.array(amax, dtype=np.float32)
        self._scale_amax = kwargs.pop("scale_amax", None)
        self._calib_method = kwargs.pop("calib_method", "max")
        self._unsigned = kwargs.pop("unsigned", False)
        self._narrow_range = kwargs.pop("narrow_range", False)
        if kwargs:
            raise TypeError(f"Unused keys: {kwargs.keys()}")

    num_bits = property(lambda self: self._num_bits, doc="int bits, or (4, 3) for E4M3.")
    name = property(lambda self: self._name, doc="The optional name.")
    fake_quant = property(lambda self: self._fake_quant, doc="Quantize-dequantize or codes.")
    axis = property(lambda self: self._axis, doc="None, an int or a tuple of kept axes.")
    amax = property(lambda self: self._amax, doc="None or a float32 ndarray.")
    learn_amax = property(lambda self: self._learn_amax, doc="amax is a trainable parameter.")
    scale_amax = property(lambda self: self._scale_amax, doc="None or amax's multiplier.")
    calib_method = property(lambda self: self._calib_method, doc='"max" or "histogram".')
    unsigned = property(lambda self: self._unsigned, doc="Unsigned integer range.")
    narrow_range = property(lambda self: self._narrow_range, doc="Symmetric signed range.")

    def __str__(self) -> str:
        """Upstream's one-line summary, e.g. ``QuantDescriptor(8bit fake axis=0)``."""
        s = f"{self._name}: " if self._name is not None else "QuantDescriptor"
        s += f"({'unsigned ' if self._unsigned else ''}{self._num_bits}bit"
        s += " fake" if self._fake_quant else " real"
        s += f" axis={self._axis if self._axis is not None else ' per-tensor'}"
        if self._amax is not None:
            s += f" amax={self._amax} full_range"
        if self._learn_amax:
            s += " learn_amax"
        if self._scale_amax:
            s += f" scale_amax={self._scale_amax}"
        return s + ")"

    def __eq__(self, rhs: object) -> bool:
        """Equal when every setting is (amax compared value by value, shape included)."""
        if not isinstance(rhs, ScaledQuantDescriptor):
            return NotImplemented
        mine, theirs = dict(self.__dict__), dict(rhs.__dict__)
        a, b = mine.pop("_amax"), theirs.pop("_amax")
        if (a is None) != (b is None):
            return False
        if a is not None and not (a.shape == b.shape and np.array_equal(a, b)):
            return False
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]  # mutable-looking and unhashable, as upstream

    def dict(self) -> dict[str, Any]:
        """The settings that differ from the defaults (``num_bits`` and ``name`` always).

        ``QuantDescriptor(**d.dict()) == d`` for every descriptor. ``amax`` is a plain float or
        list (``ndarray.tolist()``).
        """
        out: dict[str, Any] = {"num_bits": self._num_bits, "name": self._name}
        if not self._fake_quant:
            out["fake_quant"] = self._fake_quant
        if self._axis is not None:
            out["axis"] = self._axis
        if self._amax is not None:
            out["amax"] = self._amax.tolist()
        if self._scale_amax is not None:
            out["scale_amax"] = self._scale_amax
        if self._learn_amax:
            out["learn_amax"] = self._learn_amax
        if self._unsigned:
            out["unsigned"] = self._unsigned
        if self._narrow_range:
            out["narrow_range"] = self._narrow_range
        if self._calib_method != "max":
            out["calib_method"] = self._calib_method
        return out

    def to_yaml(self) -> str:
        """:meth:`dict` as YAML (a tuple ``axis`` written as a list, keys sorted, width 120).

        Raises:
            ImportError: PyYAML is not installed.
        """
        yaml = _import_yaml()
        obj = self.dict()
        if isinstance(obj.get("axis"), tuple):
            obj["axis"] = list(obj["axis"])
        if isinstance(obj.get("num_bits"), tuple):
            obj["num_bits"] = list(obj["num_bits"])
        text: str = yaml.dump(obj, width=120)
        return text

    @classmethod
    def from_yaml(cls, yaml_str: str) -> ScaledQuantDescriptor:
        """The descriptor :meth:`to_yaml` wrote (a list ``axis`` becomes a tuple again).

        Raises:
            ImportError: PyYAML is not installed.
        """
        obj = _import_yaml().safe_load(yaml_str)
        if isinstance(obj.get("axis"), list):
            obj["axis"] = tuple(obj["axis"])
        if isinstance(obj.get("num_bits"), list):
            obj["num_bits"] = tuple(obj["num_bits"])
        return cls(**obj)


def _import_yaml() -> Any:
    try:
        import yaml
    except ImportError as err:  # pragma: no cover - PyYAML ships with torch's usual stacks
        raise ImportError(
            "QuantDescriptor.to_yaml/from_yaml need PyYAML: pip install pyyaml"
        ) from err
    return yaml


#: Upstream's public name for :class:`ScaledQuantDescriptor`.
QuantDescriptor = ScaledQuantDescriptor

QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
# ConvTranspose weights are (C_in, C_out/groups, k...): the output channels are axis 1.
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
