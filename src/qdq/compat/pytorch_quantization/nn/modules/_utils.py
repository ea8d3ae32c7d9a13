"""``pytorch_quantization.nn.modules._utils``: the quantization mixins of the quant modules."""

from __future__ import annotations

import copy
import logging
from typing import Any, Literal, overload

import torch
from torch import nn

from qdq.compat.pytorch_quantization.nn.modules.tensor_quantizer import TensorQuantizer
from qdq.compat.pytorch_quantization.tensor_quant import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor

__all__ = ["QuantInputMixin", "QuantMixin", "pop_quant_desc_in_kwargs"]

_log = logging.getLogger("qdq.compat")


def _check_desc(value: object, what: str) -> QuantDescriptor:
    if not isinstance(value, QuantDescriptor):
        raise ValueError(f"{what} must be a QuantDescriptor, got {type(value).__name__}")
    if not value.fake_quant:
        raise ValueError(f"{what}: only fake quantization is supported (fake_quant=False)")
    return value


class QuantMixin:
    """Input and weight quantizers for a weighted module (Conv, ConvTranspose, Linear).

    Class defaults are descriptors (immutable); ``set_default_quant_desc_*`` replaces them for a
    class and the modules built after it.
    """

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Set the input descriptor of modules of this class built from now on.

        Raises:
            ValueError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_input = copy.deepcopy(_check_desc(value, "quant_desc_input"))

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Set the weight descriptor of modules of this class built from now on."""
        cls.default_quant_desc_weight = copy.deepcopy(_check_desc(value, "quant_desc_weight"))

    def init_quantizer(
        self,
        quant_desc_input: QuantDescriptor,
        quant_desc_weight: QuantDescriptor,
        num_layers: int | None = None,
    ) -> None:
        """Create ``_input_quantizer`` and ``_weight_quantizer`` (``num_layers``: ModuleLists).

        Raises:
            ValueError: a descriptor that is not a fake-quant QuantDescriptor.
        """
        _check_desc(quant_desc_input, "quant_desc_input")
        _check_desc(quant_desc_weight, "quant_desc_weight")
        _log.debug(
            "%s: input %d bits %s, weight %d bits %s", type(self).__name__,
            quant_desc_input.num_bits, quant_desc_input.axis,
            quant_desc_weight.num_bits, quant_desc_weight.axis,
        )  # fmt: skip
        this: Any = self
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

    def _quant(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantized input and the quantized ``self.weight``."""
        this: Any = self
        return this._input_quantizer(inputs), this._weight_quantizer(this.weight)


class QuantInputMixin:
    """An input quantizer for an unweighted module (pooling)."""

    default_quant_desc_input: QuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Set the input descriptor of modules of this class built from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_check_desc(value, "quant_desc_input"))

    def init_quantizer(self, quant_desc_input: QuantDescriptor) -> None:
        """Create ``_input_quantizer``."""
        _check_desc(quant_desc_input, "quant_desc_input")
        this: Any = self
        this._input_quantizer = TensorQuantizer(quant_desc_input)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        q: TensorQuantizer = self._input_quantizer  # type: ignore[attr-defined]
        return q


@overload
def pop_quant_desc_in_kwargs(
    quant_cls: type, input_only: Literal[True], **kwargs: Any
) -> QuantDescriptor: ...


@overload
def pop_quant_desc_in_kwargs(
    quant_cls: type, input_only: Literal[False] = ..., **kwargs: Any
) -> tuple[QuantDescriptor, QuantDescriptor]: ...


def pop_quant_desc_in_kwargs(
    quant_cls: type, input_only: bool = False, **kwargs: Any
) -> QuantDescriptor | tuple[QuantDescriptor, QuantDescriptor]:
    """Take ``quant_desc_input`` (and ``quant_desc_weight``) from ``kwargs``, defaulting to the
    class defaults; anything else left in ``kwargs`` is an error (upstream's signature).

    Raises:
        TypeError: unused keyword arguments.

    Example:
        >>> from qdq.compat.pytorch_quantization import nn as quant_nn
        >>> pop_quant_desc_in_kwargs(quant_nn.QuantMaxPool2d, input_only=True).num_bits
        8
    """
    quant_desc_input = kwargs.pop("quant_desc_input", quant_cls.default_quant_desc_input)  # type: ignore[attr-defined]
    quant_desc_weight = None
    if not input_only:
        quant_desc_weight = kwargs.pop("quant_desc_weight", quant_cls.default_quant_desc_weight)  # type: ignore[attr-defined]
    if kwargs:
        raise TypeError(f"unused keyword arguments: {sorted(kwargs)}")
    if quant_desc_weight is None:
        return quant_desc_input
    return quant_desc_input, quant_desc_weight
