"""``pytorch_quantization.nn._functions.quant_rnn``: the recurrences of the quant RNN modules.

Plain torch, step by step (no cuDNN kernel), so every step of every layer can quantize what it
multiplies. The quantization of one LSTM step is upstream's: the input quantizer sees the step input
and the previous hidden state **concatenated** (one scale for both, as one fused GEMM would see
them), the weight quantizer sees ``[w_ih | w_hh]`` concatenated along the input dimension; biases
and the cell state stay float. Only the LSTM is quantized upstream (its ``__all__`` names
``LSTMCell`` and ``RNN``); the Elman and GRU cells here take the same optional quantizers so
``QuantRNN`` and ``GRU`` run (upstream's crash on an unexpected keyword).

The builders return closures with upstream's call conventions:

* ``Recurrent(cell)(input, hidden, weights, batch_sizes, input_quantizer, weight_quantizer)``
  → ``(hidden, output)`` over a padded ``(seq, batch, feature)`` input;
* ``VariableRecurrent``/``VariableRecurrentReverse`` the same over packed data;
* ``StackedRNN(directions, num_layers, lstm, dropout, train)(input, hidden, weights, batch_sizes,
  input_quantizers, weight_quantizers)`` → ``(hidden, output)``;
* ``RNN(mode, input_size, hidden_size, ...)(input, weights, hidden, batch_sizes,
  input_quantizers, weight_quantizers)`` → ``(output, hidden)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import functional as F

__all__ = ["RNN", "LSTMCell"]

Hidden = Any  # a tensor, or (h, c) for the LSTM
StepFn = Callable[..., Any]


def _quantize_fused(
    input: torch.Tensor,
    hx: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    input_quantizer: Callable[[torch.Tensor], torch.Tensor] | None,
    weight_quantizer: Callable[[torch.Tensor], torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``[input | hx]`` with one quantizer and ``[w_ih | w_hh]`` with the other, then split
    back; a missing quantizer leaves its pair as it is."""
    if input_quantizer is not None:
        both = input_quantizer(torch.cat([input, hx], 1))
        input, hx = both.split([input.size(1), hx.size(1)], 1)
    if weight_quantizer is not None:
        both = weight_quantizer(torch.cat([w_ih, w_hh], 1))
        w_ih, w_hh = both.split([w_ih.size(1), w_hh.size(1)], 1)
    return input, hx, w_ih, w_hh


def RNNReLUCell(  # noqa: N802 (upstream's name)
    input: torch.Tensor,
    hidden: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
    input_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    weight_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One Elman step with ReLU: ``relu(x·w_ihᵀ + b_ih + h·w_hhᵀ + b_hh)``."""
    x, h, w_ih, w_hh = _quantize_fused(input, hidden, w_ih, w_hh, input_quantizer, weight_quantizer)
    return F.relu(F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh))


def RNNTanhCell(  # noqa: N802 (upstream's name)
    input: torch.Tensor,
    hidden: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
    input_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    weight_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One Elman step with tanh: ``tanh(x·w_ihᵀ + b_ih + h·w_hhᵀ + b_hh)``."""
    x, h, w_ih, w_hh = _quantize_fused(input, hidden, w_ih, w_hh, input_quantizer, weight_quantizer)
    return torch.tanh(F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh))


def LSTMCell(  # noqa: N802 (upstream's name)
    input: torch.Tensor,
    hidden: tuple[torch.Tensor, torch.Tensor],
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
    input_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    weight_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One quantized LSTM step (torch's gate order: input, forget, cell, output).

    Args:
        input: ``(batch, input_size)``.
        hidden: ``(h, c)``, each ``(batch, hidden_size)``; only ``h`` is quantized.
        w_ih, w_hh: ``(4·hidden, input_size)`` and ``(4·hidden, hidden_size)``.
        b_ih, b_hh: ``(4·hidden,)`` or None; never quantized.
        input_quantizer: applied once to ``[input | h]`` (one scale for both GEMM operands).
        weight_quantizer: applied once to ``[w_ih | w_hh]`` (per row: the 4·hidden gate rows).

    Returns:
        ``(h', c')``.
    """
    hx, cx = hidden
    x, h, w_ih, w_hh = _quantize_fused(input, hx, w_ih, w_hh, input_quantizer, weight_quantizer)
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, 1)
    in_gate = torch.sigmoid(in_gate)
    forget_gate = torch.sigmoid(forget_gate)
    cell_gate = torch.tanh(cell_gate)
    out_gate = torch.sigmoid(out_gate)
    cy = (forget_gate * cx) + (in_gate * cell_gate)
    hy = out_gate * torch.tanh(cy)
    return hy, cy


def GRUCell(  # noqa: N802 (upstream's name)
    input: torch.Tensor,
    hidden: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None = None,
    b_hh: torch.Tensor | None = None,
    input_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
    weight_quantizer: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One GRU step (torch's gate order: reset, update, new)."""
    x, h, w_ih, w_hh = _quantize_fused(input, hidden, w_ih, w_hh, input_quantizer, weight_quantizer)
    x_r, x_z, x_n = F.linear(x, w_ih, b_ih).chunk(3, 1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, 1)
    reset = torch.sigmoid(x_r + h_r)
    update = torch.sigmoid(x_z + h_z)
    new = torch.tanh(x_n + reset * h_n)
    return new + update * (hidden - new)


def _step(
    cell: StepFn, x: torch.Tensor, hidden: Hidden, weight: Sequence[torch.Tensor], iq: Any, wq: Any
) -> Hidden:
    return cell(x, hidden, *weight, input_quantizer=iq, weight_quantizer=wq)


def _last_h(hidden: Hidden) -> torch.Tensor:
    """The step output: ``h`` of an LSTM's ``(h, c)``, the hidden tensor otherwise."""
    return hidden[0] if isinstance(hidden, tuple) else hidden


def Recurrent(inner: StepFn, reverse: bool = False) -> Callable[..., tuple[Hidden, torch.Tensor]]:  # noqa: N802
    """One direction of one layer over a padded ``(seq, batch, feature)`` input.

    Returns:
        ``forward(input, hidden, weight, batch_sizes, input_quantizer, weight_quantizer)`` →
        ``(last hidden, outputs (seq, batch, hidden))``; ``reverse`` walks the sequence backwards
        and returns the outputs in input order.
    """

    def forward(
        input: torch.Tensor,
        hidden: Hidden,
        weight: Sequence[torch.Tensor],
        batch_sizes: Any,
        input_quantizer: Any,
        weight_quantizer: Any,
    ) -> tuple[Hidden, torch.Tensor]:
        order = range(input.size(0) - 1, -1, -1) if reverse else range(input.size(0))
        outputs: list[torch.Tensor] = [input.new_empty(0)] * input.size(0)
        for t in order:
            hidden = _step(inner, input[t], hidden, weight, input_quantizer, weight_quantizer)
            outputs[t] = _last_h(hidden)
        return hidden, torch.stack(outputs, 0)

    return forward


def variable_recurrent_factory(
    inner: StepFn, reverse: bool = False
) -> Callable[..., tuple[Hidden, torch.Tensor]]:
    """:func:`VariableRecurrentReverse` when ``reverse`` else :func:`VariableRecurrent`."""
    return VariableRecurrentReverse(inner) if reverse else VariableRecurrent(inner)


def _as_tuple(hidden: Hidden) -> tuple[tuple[torch.Tensor, ...], bool]:
    return (hidden, False) if isinstance(hidden, tuple) else ((hidden,), True)


def VariableRecurrent(inner: StepFn) -> Callable[..., tuple[Hidden, torch.Tensor]]:  # noqa: N802
    """One forward direction over packed data (``batch_sizes`` non-increasing, as
    :class:`~torch.nn.utils.rnn.PackedSequence` stores them).

    A sequence that ends keeps its hidden state from its last step; the returned hidden state has
    ``batch_sizes[0]`` rows in batch order. The output is packed like the input.
    """

    def forward(
        input: torch.Tensor,
        hidden: Hidden,
        weight: Sequence[torch.Tensor],
        batch_sizes: Any,
        input_quantizer: Any,
        weight_quantizer: Any,
    ) -> tuple[Hidden, torch.Tensor]:
        state, flat = _as_tuple(hidden)
        finished: list[tuple[torch.Tensor, ...]] = []  # rows of sequences that ended, last first
        outputs: list[torch.Tensor] = []
        offset = 0
        active = int(batch_sizes[0])
        for size in (int(b) for b in batch_sizes):
            if size < active:
                finished.append(tuple(h[size:active] for h in state))
                state = tuple(h[:size] for h in state)
                active = size
            x = input[offset : offset + size]
            offset += size
            out = _step(
                inner, x, state[0] if flat else state, weight, input_quantizer, weight_quantizer
            )
            state = (out,) if flat else out
            outputs.append(state[0])
        parts = [state, *reversed(finished)]
        last = tuple(torch.cat([p[k] for p in parts], 0) for k in range(len(state)))
        return (last[0] if flat else last), torch.cat(outputs, 0)

    return forward


def VariableRecurrentReverse(inner: StepFn) -> Callable[..., tuple[Hidden, torch.Tensor]]:  # noqa: N802
    """One backward direction over packed data: each sequence starts from its own last step with
    its row of the initial hidden state; the output is packed in input order."""

    def forward(
        input: torch.Tensor,
        hidden: Hidden,
        weight: Sequence[torch.Tensor],
        batch_sizes: Any,
        input_quantizer: Any,
        weight_quantizer: Any,
    ) -> tuple[Hidden, torch.Tensor]:
        initial, flat = _as_tuple(hidden)
        sizes = [int(b) for b in batch_sizes]
        active = sizes[-1]
        state = tuple(h[:active] for h in initial)
        outputs: list[torch.Tensor] = []
        end = input.size(0)
        for size in reversed(sizes):
            if size > active:  # sequences that end at this step join with their initial state
                state = tuple(
                    torch.cat((h, h0[active:size]), 0) for h, h0 in zip(state, initial, strict=True)
                )
                active = size
            x = input[end - size : end]
            end -= size
            out = _step(
                inner, x, state[0] if flat else state, weight, input_quantizer, weight_quantizer
            )
            state = (out,) if flat else out
            outputs.append(state[0])
        outputs.reverse()
        return (state[0] if flat else state), torch.cat(outputs, 0)

    return forward


def StackedRNN(  # noqa: N802 (upstream's name)
    inners: Sequence[Callable[..., tuple[Hidden, torch.Tensor]]],
    num_layers: int,
    lstm: bool = False,
    dropout: float = 0,
    train: bool = True,
) -> Callable[..., tuple[Hidden, torch.Tensor]]:
    """Stack ``num_layers`` layers of ``len(inners)`` directions each.

    The layer ``l``, direction ``d`` uses ``weight[l·D + d]``, ``hidden[l·D + d]`` and the quantizers
    at the same index; the directions' outputs are concatenated on the feature dimension and fed
    to the next layer, with ``dropout`` between layers (not after the last).
    """
    directions = len(inners)
    total = num_layers * directions

    def forward(
        input: torch.Tensor,
        hidden: Hidden,
        weight: Sequence[Sequence[torch.Tensor]],
        batch_sizes: Any,
        input_quantizers: Sequence[Any],
        weight_quantizers: Sequence[Any],
    ) -> tuple[Hidden, torch.Tensor]:
        if len(weight) != total:
            raise ValueError(
                f"expected {total} weight groups (layers × directions), got {len(weight)}"
            )
        per_index = list(zip(*hidden, strict=True)) if lstm else hidden
        last: list[Hidden] = []
        for layer in range(num_layers):
            outs = []
            for d, inner in enumerate(inners):
                i = layer * directions + d
                h, out = inner(
                    input, per_index[i], weight[i], batch_sizes,
                    input_quantizer=input_quantizers[i], weight_quantizer=weight_quantizers[i],
                )  # fmt: skip
                last.append(h)
                outs.append(out)
            input = torch.cat(outs, input.dim() - 1)
            if dropout != 0 and layer < num_layers - 1:
                input = F.dropout(input, p=dropout, training=train, inplace=False)
        if lstm:
            hs, cs = zip(*last, strict=True)
            return (torch.stack(hs, 0), torch.stack(cs, 0)), input
        return torch.stack(last, 0), input

    return forward


_CELLS: dict[str, StepFn] = {
    "RNN_RELU": RNNReLUCell,
    "RNN_TANH": RNNTanhCell,
    "LSTM": LSTMCell,
    "GRU": GRUCell,
}


def AutogradRNN(  # noqa: N802 (upstream's name)
    mode: str,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    batch_first: bool = False,
    dropout: float = 0,
    train: bool = True,
    bidirectional: bool = False,
    variable_length: bool = False,
    dropout_state: dict[str, Any] | None = None,
    flat_weight: torch.Tensor | None = None,
    input_quantizers: Sequence[Any] | None = None,
    weight_quantizers: Sequence[Any] | None = None,
) -> Callable[..., tuple[torch.Tensor, Hidden]]:
    """The whole multi-layer recurrence for ``mode`` (``"LSTM"``, ``"GRU"``, ``"RNN_TANH"``,
    ``"RNN_RELU"``). ``dropout_state``, ``flat_weight`` and the quantizer arguments here are
    accepted for upstream's signature and unused (the quantizers come with each call).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in _CELLS:
        raise ValueError(f"Unknown mode: {mode}")
    cell = _CELLS[mode]
    build = variable_recurrent_factory if variable_length else Recurrent
    directions = (build(cell), build(cell, reverse=True)) if bidirectional else (build(cell),)
    stacked = StackedRNN(directions, num_layers, mode == "LSTM", dropout=dropout, train=train)
    transpose = batch_first and not variable_length

    def forward(
        input: torch.Tensor,
        weight: Sequence[Sequence[torch.Tensor]],
        hidden: Hidden,
        batch_sizes: Any,
        input_quantizers: Sequence[Any],
        weight_quantizers: Sequence[Any],
    ) -> tuple[torch.Tensor, Hidden]:
        if transpose:
            input = input.transpose(0, 1)
        last, output = stacked(
            input, hidden, weight, batch_sizes, input_quantizers, weight_quantizers
        )
        if transpose:
            output = output.transpose(0, 1)
        return output, last

    return forward


def RNN(*args: Any, **kwargs: Any) -> Callable[..., tuple[torch.Tensor, Hidden]]:  # noqa: N802
    """:func:`AutogradRNN` built on each call (upstream's entry point; same arguments).

    Example:
        >>> import torch
        >>> w = [[torch.zeros(8, 3), torch.zeros(8, 2)]]
        >>> h0 = (torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))
        >>> out, (h, c) = RNN("LSTM", 3, 2)(torch.ones(5, 4, 3), w, h0, None, [None], [None])
        >>> tuple(out.shape), tuple(h.shape)
        ((5, 4, 2), (1, 4, 2))
    """

    def forward(input: torch.Tensor, *fargs: Any, **fkwargs: Any) -> tuple[torch.Tensor, Hidden]:
        return AutogradRNN(*args, **kwargs)(input, *fargs, **fkwargs)

    return forward
