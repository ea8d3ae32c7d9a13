"""``pytorch_quantization.nn.modules.quant_rnn``: quantized LSTM layer and cell.

:class:`QuantLSTM` and :class:`QuantLSTMCell` take the arguments of ``torch.nn.LSTM`` /
``torch.nn.LSTMCell`` plus ``quant_desc_input`` / ``quant_desc_weight``, and have the same parameter
names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...), so ``state_dict`` moves between the float and
the quant module (the quantizers add ``_input_quantizers.<i>._amax`` / ``_weight_quantizers.<i>._amax``
for a layer, ``_input_quantizer._amax`` / ``_weight_quantizer._amax`` for a cell, once calibrated).

Per layer and direction ``i`` (``i = layer·D + direction``) and per step, ``_input_quantizers[i]``
quantizes the step input concatenated with the previous hidden state and ``_weight_quantizers[i]``
quantizes ``[weight_ih | weight_hh]`` (per row by default: ``QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW``).
The recurrence runs step by step in plain torch (:mod:`..._functions.quant_rnn`), on any device;
there is no cuDNN flat-weight path (``flatten_parameters`` is a no-op), which changes no value.

``QuantRNN``, ``GRU``, ``QuantRNNCell`` and ``GRUCell`` exist as upstream's do (not in ``__all__``):
the layers carry the same quantizers as the LSTM, the two cells are float cells without quantizers.
``proj_size > 0`` is refused, as upstream.

Example:
    >>> import torch
    >>> from qdq.compat.pytorch_quantization.nn.modules.quant_rnn import QuantLSTM
    >>> lstm = QuantLSTM(8, 16, num_layers=2)
    >>> len(lstm._input_quantizers), sorted(lstm.state_dict())[:2]
    (2, ['bias_hh_l0', 'bias_hh_l1'])
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn import Parameter
from torch.nn.utils.rnn import PackedSequence

from qdq.compat.pytorch_quantization import tensor_quant
from qdq.compat.pytorch_quantization.nn._functions import quant_rnn
from qdq.compat.pytorch_quantization.nn.modules import _utils

__all__ = ["LSTM", "LSTMCell", "QuantLSTM", "QuantLSTMCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _uniform_reset(module: nn.Module, hidden_size: int) -> None:
    """torch's RNN initialisation: every parameter ~ U(-1/√hidden, 1/√hidden), in order."""
    bound = 1.0 / math.sqrt(hidden_size)
    for p in module.parameters():
        p.data.uniform_(-bound, bound)


class QuantRNNBase(nn.Module, _utils.QuantMixin):
    """A multi-layer, optionally bidirectional recurrence with one input and one weight quantizer per
    layer and direction (``_input_quantizers``, ``_weight_quantizers``: ModuleLists).

    Args:
        mode: ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``.
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional: as
            ``torch.nn.LSTM``.
        proj_size: must be 0.
        **kwargs: ``quant_desc_input``, ``quant_desc_weight`` (class defaults otherwise).

    Raises:
        ValueError: ``dropout`` outside [0, 1] or not a number; ``proj_size`` other than 0.
        TypeError: another keyword argument.
    """

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0,
        bidirectional: bool = False,
        proj_size: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = dropout
        self.dropout_state: dict[str, Any] = {}
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, numbers.Number)
            or not 0 <= dropout <= 1
        ):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of an "
                "element being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero "
                f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                f"num_layers={num_layers}",
                stacklevel=2,
            )
        if proj_size < 0:
            raise ValueError(
                "proj_size should be a positive integer or zero to disable projections"
            )
        if proj_size > 0:
            raise ValueError("proj_size is not supported in pytorch-quantization yet")

        gate_size = _GATES.get(mode, 1) * hidden_size
        directions = 2 if bidirectional else 1
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(directions):
                in_size = input_size if layer == 0 else hidden_size * directions
                names = self._param_names(layer, direction)
                shapes = [
                    (gate_size, in_size),
                    (gate_size, hidden_size),
                    (gate_size,),
                    (gate_size,),
                ]
                for name, shape in zip(names, shapes[: len(names)], strict=True):
                    setattr(self, name, Parameter(torch.empty(shape)))
                self._all_weights.append(names)

        self.flatten_parameters()
        self.reset_parameters()
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight, num_layers=num_layers * directions)

    def _param_names(self, layer: int, direction: int) -> list[str]:
        suffix = "_reverse" if direction == 1 else ""
        names = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
        if self.bias:
            names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
        return names

    def flatten_parameters(self) -> None:
        """A no-op kept for upstream's API: there is no cuDNN flat-weight buffer here (the
        recurrence runs step by step in torch on any device)."""
        self._data_ptrs: list[int] = []

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/√hidden_size, 1/√hidden_size), as torch's RNNs."""
        _uniform_reset(self, self.hidden_size)

    def check_forward_args(
        self, input: torch.Tensor, hidden: Any, batch_sizes: torch.Tensor | None
    ) -> None:
        """Check the input rank and feature size and the hidden state's shape.

        Raises:
            RuntimeError: with torch's messages (``input must have 3 dimensions, got 2``, ...).
        """
        packed = batch_sizes is not None
        want_dim = 2 if packed else 3
        if input.dim() != want_dim:
            raise RuntimeError(f"input must have {want_dim} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(
                "input.size(-1) must be equal to input_size. "
                f"Expected {self.input_size}, got {input.size(-1)}"
            )
        if batch_sizes is not None:
            batch = int(batch_sizes[0])
        else:
            batch = input.size(0) if self.batch_first else input.size(1)
        directions = 2 if self.bidirectional else 1
        expected = (self.num_layers * directions, batch, self.hidden_size)
        if self.mode == "LSTM":
            checks = [(hidden[0], "Expected hidden[0] size {}, got {}"),
                      (hidden[1], "Expected hidden[1] size {}, got {}")]  # fmt: skip
        else:
            checks = [(hidden, "Expected hidden size {}, got {}")]
        for h, message in checks:
            if tuple(h.size()) != expected:
                raise RuntimeError(message.format(expected, tuple(h.size())))

    def forward(self, input: Any, hx: Any = None) -> tuple[Any, Any]:
        """Run the layers over ``input`` (a tensor, or a PackedSequence).

        Args:
            input: ``(seq, batch, input_size)`` (``(batch, seq, input_size)`` with ``batch_first``)
                or a :class:`~torch.nn.utils.rnn.PackedSequence`.
            hx: the initial hidden state (``(h0, c0)`` for the LSTM), zeros when None.

        Returns:
            ``(output, h_n)`` (``(output, (h_n, c_n))`` for the LSTM), shaped as torch's. A packed
            input built with ``enforce_sorted=False`` has ``hx`` and ``h_n`` in the caller's batch
            order, as ``torch.nn.LSTM`` (upstream ignores the permutation).
        """
        sorted_indices = unsorted_indices = None
        batch_sizes = None
        if isinstance(input, PackedSequence):
            input, batch_sizes, sorted_indices, unsorted_indices = input
            batch = int(batch_sizes[0])
        else:
            batch = input.size(0) if self.batch_first else input.size(1)
        if hx is None:
            directions = 2 if self.bidirectional else 1
            zeros = input.new_zeros(
                self.num_layers * directions, batch, self.hidden_size, requires_grad=False
            )
            hx = (zeros, zeros) if self.mode == "LSTM" else zeros
        elif sorted_indices is not None:
            hx = _permute_hidden(hx, sorted_indices)
        self.check_forward_args(input, hx, batch_sizes)
        run = quant_rnn.RNN(
            self.mode,
            self.input_size,
            self.hidden_size,
            num_layers=self.num_layers,
            batch_first=self.batch_first,
            dropout=self.dropout,
            train=self.training,
            bidirectional=self.bidirectional,
            dropout_state=self.dropout_state,
            variable_length=batch_sizes is not None,
        )
        output, hidden = run(
            input,
            self.all_weights,
            hx,
            batch_sizes,
            self._input_quantizers,
            self._weight_quantizers,
        )
        if batch_sizes is None:
            return output, hidden
        if unsorted_indices is not None:
            hidden = _permute_hidden(hidden, unsorted_indices)
        return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), hidden

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_data_ptrs", [])
        if "all_weights" in state:  # pickles of old torch RNNs kept the parameters themselves
            self._all_weights = state["all_weights"]
        if self._all_weights and isinstance(self._all_weights[0][0], str):
            return
        directions = 2 if self.bidirectional else 1
        self._all_weights = [
            self._param_names(layer, d)
            for layer in range(self.num_layers)
            for d in range(directions)
        ]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """The parameters per layer and direction: ``[[w_ih, w_hh, (b_ih, b_hh)], ...]``."""
        return [[getattr(self, name) for name in names] for names in self._all_weights]


def _permute_hidden(hx: Any, order: torch.Tensor) -> Any:
    if isinstance(hx, tuple):
        return tuple(h.index_select(1, order) for h in hx)
    return hx.index_select(1, order)


class QuantRNN(QuantRNNBase):
    """A multi-layer Elman RNN (``nonlinearity="tanh"`` or ``"relu"``) with quantizers.

    Raises:
        ValueError: ``proj_size`` given (LSTM only) or an unknown ``nonlinearity``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        modes = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}
        if nonlinearity not in modes:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'")
        super().__init__(modes[nonlinearity], *args, **kwargs)


class QuantLSTM(QuantRNNBase):
    """A multi-layer LSTM (``torch.nn.LSTM``'s arguments, ``proj_size`` 0) with quantizers.

    Example:
        >>> import torch
        >>> from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor
        >>> lstm = QuantLSTM(4, 6, quant_desc_input=QuantDescriptor(amax=3.0))
        >>> out, (h, c) = lstm(torch.randn(5, 2, 4))
        >>> tuple(out.shape), tuple(h.shape)
        ((5, 2, 6), (1, 2, 6))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)


class GRU(QuantRNNBase):
    """A multi-layer GRU with the same quantizers as :class:`QuantLSTM` (upstream's name)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("GRU", *args, **kwargs)


class QuantRNNCellBase(nn.Module, _utils.QuantMixin):
    """Shared checks and repr of the cells."""

    default_quant_desc_weight = tensor_quant.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    input_size: int
    hidden_size: int

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if "bias" in self.__dict__ and self.__dict__["bias"] is not True:
            s += f", bias={self.__dict__['bias']}"
        if "nonlinearity" in self.__dict__ and self.__dict__["nonlinearity"] != "tanh":
            s += f", nonlinearity={self.__dict__['nonlinearity']}"
        return s

    def check_forward_input(self, input: torch.Tensor) -> None:
        """Raises: RuntimeError: ``input.size(1)`` is not ``input_size``."""
        if input.size(1) != self.input_size:
            raise RuntimeError(
                f"input has inconsistent input_size: got {input.size(1)}, expected {self.input_size}"
            )

    def check_forward_hidden(
        self, input: torch.Tensor, hx: torch.Tensor, hidden_label: str = ""
    ) -> None:
        """Raises: RuntimeError: ``hx``'s batch or hidden size does not fit."""
        if input.size(0) != hx.size(0):
            raise RuntimeError(
                f"Input batch size {input.size(0)} doesn't match hidden{hidden_label} batch size "
                f"{hx.size(0)}"
            )
        if hx.size(1) != self.hidden_size:
            raise RuntimeError(
                f"hidden{hidden_label} has inconsistent hidden_size: got {hx.size(1)}, expected "
                f"{self.hidden_size}"
            )

    def _cell_params(self, gates: int, bias: bool) -> None:
        self.weight_ih = Parameter(torch.empty(gates * self.hidden_size, self.input_size))
        self.weight_hh = Parameter(torch.empty(gates * self.hidden_size, self.hidden_size))
        self.bias_ih: Parameter | None
        self.bias_hh: Parameter | None
        if bias:
            self.bias_ih = Parameter(torch.empty(gates * self.hidden_size))
            self.bias_hh = Parameter(torch.empty(gates * self.hidden_size))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/√hidden_size, 1/√hidden_size), as torch's cells."""
        _uniform_reset(self, self.hidden_size)


class QuantRNNCell(QuantRNNCellBase):
    """An Elman cell (``torch.nn.RNNCell``'s arguments); float, without quantizers, as upstream."""

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh"
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.nonlinearity = nonlinearity
        self._cell_params(1, bias)
        self.reset_parameters()

    def forward(self, input: torch.Tensor, hx: torch.Tensor | None = None) -> torch.Tensor:
        """One step; ``hx`` zeros when None.

        Raises:
            RuntimeError: shapes that do not fit, or an unknown ``nonlinearity``.
        """
        self.check_forward_input(input)
        if hx is None:
            hx = input.new_zeros(input.size(0), self.hidden_size, requires_grad=False)
        self.check_forward_hidden(input, hx)
        cells = {"tanh": quant_rnn.RNNTanhCell, "relu": quant_rnn.RNNReLUCell}
        if self.nonlinearity not in cells:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        step = cells[self.nonlinearity]
        return step(input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)


class QuantLSTMCell(QuantRNNCellBase):
    """An LSTM cell (``torch.nn.LSTMCell``'s arguments) with ``_input_quantizer`` on ``[x | h]``
    and ``_weight_quantizer`` on ``[weight_ih | weight_hh]``.

    Example:
        >>> import torch
        >>> cell = QuantLSTMCell(4, 6)
        >>> h, c = cell(torch.randn(3, 4))
        >>> tuple(h.shape), sorted(cell.state_dict())
        ((3, 6), ['bias_hh', 'bias_ih', 'weight_hh', 'weight_ih'])
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs: Any) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self._cell_params(4, bias)
        self.reset_parameters()
        quant_desc_input, quant_desc_weight = _utils.pop_quant_desc_in_kwargs(type(self), **kwargs)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step; ``hx = (h, c)``, zeros when None. Returns ``(h', c')``.

        Raises:
            RuntimeError: shapes that do not fit.
        """
        self.check_forward_input(input)
        if hx is None:
            zeros = input.new_zeros(input.size(0), self.hidden_size, requires_grad=False)
            hx = (zeros, zeros)
        self.check_forward_hidden(input, hx[0], "[0]")
        self.check_forward_hidden(input, hx[1], "[1]")
        return quant_rnn.LSTMCell(
            input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh,
            self.input_quantizer, self.weight_quantizer,
        )  # fmt: skip


class GRUCell(QuantRNNCellBase):
    """A GRU cell (``torch.nn.GRUCell``'s arguments); float, without quantizers, as upstream."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self._cell_params(3, bias)
        self.reset_parameters()

    def forward(self, input: torch.Tensor, hx: torch.Tensor | None = None) -> torch.Tensor:
        """One step; ``hx`` zeros when None."""
        self.check_forward_input(input)
        if hx is None:
            hx = input.new_zeros(input.size(0), self.hidden_size, requires_grad=False)
        self.check_forward_hidden(input, hx)
        return quant_rnn.GRUCell(
            input, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh
        )


LSTM = QuantLSTM
LSTMCell = QuantLSTMCell
