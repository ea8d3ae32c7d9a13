"""``pytorch_quantization.nn.modules._utils``: the mixins that give quant modules their quantizers.

A quant module is a torch module class (``nn.Conv2d``, ``nn.Linear``, ``nn.MaxPool2d``, ...) with
one of these mixins after it in its bases: :class:`QuantMixin` (input and weight quantizers) or
:class:`QuantInputMixin` (input only). Its ``__init__`` takes the descriptors from its keyword
arguments with :func:`pop_quant_desc_in_kwargs` (falling back to the class defaults) and calls
``init_quantizer``. The class defaults are per class; ``set_default_quant_desc_*`` changes them for
the modules built afterwards (global mutable state, as upstream).
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

from torch import nn

from qdq.compat.pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer
from qdq.compat.pytorch_quantization.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor

__all__ = ["QuantInputMixin", "QuantMixin", "pop_quant_desc_in_kwargs"]

_log = logging.getLogger(__name__)


def _checked_default(value: object) -> Any:
    """A private copy of a descriptor to become a class default.

    Raises:
        ValueError: ``value`` is not a QuantDescriptor.
    """
    if not isinstance(value, QuantDescriptor):
        raise ValueError(f"{value!r} is not an instance of QuantDescriptor!")
    return copy.deepcopy(value)


def _check_called_from_init(module: object) -> None:
    """Raises TypeError unless the caller of ``init_quantizer`` is an ``__init__`` (as upstream)."""
    if sys._getframe(2).f_code.co_name != "__init__":
        raise TypeError(
            f"{type(module).__name__}.init_quantizer should be only called by __init__ of "
            "quantized module."
        )


def _check_fake(*descs: QuantDescriptor) -> None:
    for desc in descs:
        if not desc.fake_quant:
            raise ValueError("Only fake quantization is supported!")


class QuantMixin:
    """Input and weight quantizers (``_input_quantizer``, ``_weight_quantizer``) of a weighted
    module: Conv, ConvTranspose, Linear."""

    default_quant_desc_input: Any = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: Any = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Use (a copy of) ``value`` for the inputs of this class's modules built from now on.

        Raises:
            ValueError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_input = _checked_default(value)

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Use (a copy of) ``value`` for the weights of this class's modules built from now on.

        Raises:
            ValueError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_weight = _checked_default(value)

    def init_quantizer(
        self,
        quant_desc_input: QuantDescriptor,
        quant_desc_weight: QuantDescriptor,
        num_layers: int | None = None,
    ) -> None:
        """Create the quantizers (``num_layers``: ``_input_quantizers``/``_weight_quantizers``
        ModuleLists of that length, for recurrent layers).

        Raises:
            TypeError: called from anywhere but the module's ``__init__``.
            ValueError: a descriptor with ``fake_quant=False`` ("Only fake quantization is
                supported!").
        """
        _check_called_from_init(self)
        this: Any = self
        this._fake_quant = True
        _check_fake(quant_desc_input, quant_desc_weight)
        _log.debug(
            "%s: input %s bits axis %s, weight %s bits axis %s", type(self).__name__,
            quant_desc_input.num_bits, quant_desc_input.axis,
            quant_desc_weight.num_bits, quant_desc_weight.axis,
        )  # fmt: skip
        if num_layers is None:
            this._input_quantizer = TensorQuantizer(quant_desc_input)
            this._weight_quantizer = TensorQuantizer(quant_desc_weight)
        else:
            this._input_quantizers = nn.ModuleList(
                [TensorQuantizer(quant_desc_input) for _ in range(num_layers)]
            )
            this._weight_quantizers = nn.ModuleList(
                [TensorQuantizer(quant_desc_weight) for _ in range(num_layers)]
            )

    @property
    def input_quantizer(self) -> TensorQuantizer:
        q: TensorQuantizer = self._input_quantizer  # type: ignore[attr-defined]
        return q

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        q: TensorQuantizer = self._weight_quantizer  # type: ignore[attr-defined]
        return q


class QuantInputMixin:
    """An input quantizer (``_input_quantizer``) for a module without weights (pooling, norm)."""

    default_quant_desc_input: Any = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Use (a copy of) ``value`` for the inputs of this class's modules built from now on.

        Raises:
            ValueError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_input = _checked_default(value)

    def init_quantizer(self, quant_desc_input: QuantDescriptor) -> None:
        """Create ``_input_quantizer``.

        Raises:
            TypeError: called from anywhere but the module's ``__init__``.
            ValueError: ``fake_quant=False``.
        """
        _check_called_from_init(self)
        this: Any = self
        this._fake_quant = True
        _check_fake(quant_desc_input)
        this._input_quantizer = TensorQuantizer(quant_desc_input)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        q: TensorQuantizer = self._input_quantizer  # type: ignore[attr-defined]
        return q


def pop_quant_desc_in_kwargs(quant_cls: type, input_only: bool = False, **kwargs: Any) -> Any:
    """Take ``quant_desc_input`` (and, unless ``input_only``, ``quant_desc_weight``) out of
    ``kwargs``, defaulting to ``quant_cls``'s class defaults.

    Returns:
        the input descriptor (``input_only``), else ``(input descriptor, weight descriptor)``.

    Raises:
        TypeError: anything else left in ``kwargs`` ("Unused keys: ...").

    Example:
        >>> from qdq.compat.pytorch_quantization import nn as quant_nn
        >>> pop_quant_desc_in_kwargs(quant_nn.QuantMaxPool2d, input_only=True).num_bits
        8
    """
    defaults: Any = quant_cls
    quant_desc_input = kwargs.pop("quant_desc_input", defaults.default_quant_desc_input)
    if input_only:
        if kwargs:
            raise TypeError(f"Unused keys: {kwargs.keys()}")
        return quant_desc_input
    quant_desc_weight = kwargs.pop("quant_desc_weight", defaults.default_quant_desc_weight)
    if kwargs:
        raise TypeError(f"Unused keys: {kwargs.keys()}")
    return quant_desc_input, quant_desc_weight
