"""The TensorRT Q/DQ placement rules as data.

Each rule has the id of ``reference/tensorrt-qdq-rules.md`` (V/P/S/H; qdq's own F for formats and T
for the engine time, issue 58), the family a :class:`~qdq.config.QuantConfig` can switch off, and
what TensorRT does that motivates it. The planner (:mod:`qdq.graph.plan`) cites these ids in every
decision (T01 and T02: ``qdq quantize --objective speed``); ``qdq.rules.explain(id)`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAMILIES", "RULES", "Rule", "explain", "rule"]


@dataclass(frozen=True)
class Rule:
    """One TensorRT placement rule.

    Attributes:
        id: the rule id from the rule specification (``"P03"``) or ``"USER"`` for user overrides.
        family: the switchable family (``QuantConfig.tensorrt(disable=("residual",))``).
        title: one line.
        tensorrt: what TensorRT does, i.e. why the rule exists.
    """

    id: str
    family: str
    title: str
    tensorrt: str


RULES: tuple[Rule, ...] = (
    Rule(
        "P01",
        "weighted",
        "Quantize the activation input and the weights of every Conv/ConvTranspose/Linear/MatMul",
        "TensorRT fuses DQ(input) and DQ(weight) into one INT8 kernel only when both are present "
        "(QuantizeDoubleInputNodes); weights per output channel (axis 0), activations per tensor.",
    ),
    Rule(
        "V12",
        "weighted",
        "ConvTranspose weights per tensor by default",
        "Which per-channel axis TensorRT's deconvolution kernels expect is version-dependent (axis 0 "
        "in 8.x per maintainers, axis 1 in NVIDIA's 10.2+ tooling); a per-tensor scale is valid on "
        "every version. Opt in with QuantConfig(conv_transpose_axis=1).",
    ),
    Rule(
        "P02",
        "weighted",
        "No Q/DQ inside a Conv epilogue (BN, bias, ReLU, SiLU...): quantize at the next consumer",
        "TensorRT fuses Conv+BN+activation and propagates the next consumer's Q back into the conv "
        "as its INT8 output; a Q/DQ in between splits the fusion.",
    ),
    Rule(
        "P03",
        "residual",
        "Residual Add: quantize only the skip input, not the fused conv branch",
        "TensorRT fuses Conv(+BN)+Add(+ReLU); the fused output takes the precision of the other "
        "(skip) operand, so a quantized skip gives INT8 out. With two conv branches the one on the "
        "longer path from their common ancestor is fused (ModelOpt build_non_residual_input_map).",
    ),
    Rule(
        "P04",
        "fanout",
        "A tensor is quantized for all its consumers or none: a gating Mul (squeeze-excitation) "
        "that reads a tensor quantized for its pool is quantized on both operands",
        "A tensor with quantized and float readers makes its producer write float and every "
        "Quantize run standalone; with both operands quantized the Mul runs as an INT8 PointWise "
        "layer and the producing conv keeps its INT8 output.",
    ),
    Rule(
        "P05",
        "residual",
        "Element-wise ops with no weighted producer to fuse into stay float",
        "Non-weighted layers with INT8 inputs also need INT8 outputs; an Add that cannot join a "
        "conv epilogue gains nothing from Q/DQ and would add standalone layers.",
    ),
    Rule(
        "P15",
        "residual",
        "Float stream: a tensor a LayerNorm/GroupNorm reads (or a normalization written as "
        "arithmetic: T5's and LLaMA's RMSNorm x.pow(2).mean(-1)) is read in float by all its readers: "
        "a pre-norm block's residual Add (transformers, diffusion ResNet blocks) and a Conv/"
        "Linear reading it directly (diffusers' 1x1 conv_shortcut) stay float",
        "The normalization runs in float, so the tensor is written in float; a quantized skip or "
        "shortcut input would need a standalone Quantize beside the float reader (P04: all "
        "readers or none), and the fused GEMM+Add would write INT8 only to be dequantized. "
        "TensorRT keeps the stream in FP16 and fuses the Add into the GEMM's float epilogue. "
        "qdq's rule (not in the reference table), from the P04 findings on ViT and diffusion "
        "UNets; NVIDIA's diffusion INT8 recipes leave conv_shortcut float too.",
    ),
    Rule(
        "P17",
        "residual",
        "Add between INT8 layers that no conv can absorb (PP-OCR's RSE ``x + x * se(x)``, an FPN "
        "top-down ``lateral + upsample(top)``): every input of its PointWise layer quantized, "
        "none inside it",
        "An Add whose operands are read by other layers too cannot join a conv epilogue; "
        "TensorRT fuses it with the pointwise ops feeding it (the squeeze-excitation gating Mul) "
        "into one PointWise layer, which runs INT8 in and out when every external input comes "
        "through a Dequantize and its output feeds a Quantize (non-weighted layers with INT8 "
        "inputs need INT8 outputs; PWN(Mul, Add) INT8->INT8, NVIDIA/TensorRT#2204). Applied "
        "when an operand is already INT8 for another reader and the output feeds a quantized "
        "op, so the producers write INT8 once (P04). qdq's rule (the placement half of P05).",
    ),
    Rule(
        "S01",
        "core",
        "One quantizer per tensor: every quantized consumer of a tensor shares one scale",
        "TensorRT merges identical Q nodes on a tensor (HorizontalMergeQNodes); different scales "
        "leave standalone re-quantize layers.",
    ),
    Rule(
        "S02",
        "concat",
        "Concat: all inputs and the output's consumers share one scale",
        "TensorRT splits the Q after a Concat into each input and eliminates the Concat (zero copy) "
        "only when every scale is equal; otherwise each input gets a re-quantize kernel. A Concat "
        "with two or more inputs written by float Conv/GEMM layers (H02's small convolutions: "
        "Res2Net) stays float: each such input's Quantize would run standalone, where the "
        "reader's one Quantize after the Concat costs one.",
    ),
    Rule(
        "S03",
        "pooling",
        "MaxPool and data-movement ops (Reshape, Flatten, Transpose, Slice, zero Pad, nearest "
        "Resize, a cyclic shift torch.roll) share one scale across them",
        "Q/DQ commute with these ops; TensorRT moves Q backward and DQ forward across them and "
        "keeps them INT8 when the scales on both sides are equal. A roll is Slices and a Concat "
        "in ONNX: the Quantize is split into the Concat's inputs, swapped with each Slice and "
        "merged on the rolled tensor.",
    ),
    Rule(
        "P06",
        "pooling",
        "Quantize the input of (Global)AveragePool when its output feeds a quantized op",
        "AveragePool is quantizable but does not commute: with DQ-in/Q-out it runs as one INT8 "
        "pooling layer instead of a float pool between two reformats.",
    ),
    Rule(
        "P07",
        "activation",
        "SiLU/Swish/Hardswish after a conv stays unquantized inside",
        "TensorRT fuses Conv+Sigmoid+Mul as a conv epilogue; a Q/DQ on one branch of x*sigmoid(x) "
        "leaves the conv output in float.",
    ),
    Rule(
        "P08",
        "pad",
        "Pad before Conv: put the Q/DQ in front of the Pad",
        "Zero padding commutes with symmetric quantization; Pad+Conv fuse only when adjacent.",
    ),
    Rule(
        "H02",
        "performance",
        "Small or odd convolutions stay float",
        "Convs with fewer than 16 input or output channels get no INT8 tensor-core kernel unless "
        "(groups=1, a channel count divisible by 8, the other >= 16, square kernel) or (grouped, "
        "output channels divisible by 8, kernel >= 3); ModelOpt excludes the rest.",
    ),
    Rule(
        "P14",
        "performance",
        "GEMV / tiny GEMMs, long-sequence attention and other activation-by-activation MatMuls "
        "stay float",
        "Linear/MatMul with K < 16 or N < 16 cannot use INT8 tensor cores; attention over more "
        "than 512 keys runs in FP16 fused MHA kernels (ModelOpt excludes it from INT8); a "
        "MatMul of two activations outside an attention pattern has no INT8 fusion.",
    ),
    Rule(
        "P16",
        "attention",
        "Attention: Q·Kᵀ and softmax·V with both operands INT8 (the scaled query, the key, the "
        "probabilities and the value quantized per tensor)",
        "TensorRT fuses MatMul → [scale/mask] → Softmax → MatMul into one MHA kernel that runs "
        "both products in INT8 when each operand comes through Q/DQ; the attention scale must "
        "multiply Q (or K) before the first product. ModelOpt quantizes these MatMuls in INT8 "
        "mode up to 512 keys. LayerNorm, Softmax and GELU stay FP16.",
    ),
    Rule(
        "P12",
        "core",
        "Graph outputs are never quantized",
        "A Q/DQ feeding only a network output runs as a standalone layer (pure overhead).",
    ),
    Rule(
        "F01",
        "core",
        "FP8 (E4M3) for Conv, Linear, MatMul and the attention products (format='fp8')",
        "TensorRT 10 runs FP8 GEMMs, FP8 convolutions and fused FP8 attention on compute "
        "capability 8.9+ (Ada, Hopper, Blackwell) when input and weight come through FP8 Q/DQ "
        "(float8e4m3fn zero point, opset >= 19).",
    ),
    Rule(
        "F02",
        "core",
        "Grouped/depthwise convolutions, ConvTranspose, pooling and element-wise layers stay INT8 "
        "in an FP8 plan",
        "TensorRT has no optimized FP8 kernels for grouped or depthwise convolutions (the 10.12 "
        "release notes recommend INT8 for ConvNets with them), documents FP8 convolution, not "
        "deconvolution, and FP8 kernels for GEMM, convolution and attention only.",
    ),
    Rule(
        "F03",
        "core",
        "Convolutions with <= 16 input or output channels or a kernel area above 32 stay INT8",
        "ModelOpt's FP8 recipe keeps these out of FP8: no FP8 tensor-core tile pays there.",
    ),
    Rule(
        "F04",
        "core",
        "GEMMs with K or N below 16 stay INT8 in an FP8 plan",
        "No FP8 tensor-core tile below 16 (ModelOpt skips them); P14 usually keeps them float.",
    ),
    Rule(
        "F05",
        "core",
        "One format per quantized tensor: a scale group read by an INT8 layer is INT8, and so is "
        "a layer reading an INT8 pool's output",
        "One Quantize serves every reader of a tensor, and a layer fuses only when its input and "
        "weight share a format: mixing would cost a reformat (a standalone Q/DQ) per boundary. "
        "TensorRT has no FP8 pooling: a pool running INT8 writes INT8 for its reader.",
    ),
    Rule(
        "F06",
        "core",
        "FP8 weights per tensor; GEMM weights per channel where the target scales FP8 GEMMs so",
        "TensorRT rejects per-channel FP8 convolution weights; per-channel FP8 GEMM scales exist "
        "from TensorRT 10.6 (Hopper) and 10.7 (Ada) only. Per tensor builds on every FP8 target; "
        "on those targets (QuantConfig(fp8_gemm_per_channel=True), which qdq quantize sets from "
        "--target) GEMM weights keep their per-output-channel axis.",
    ),
    Rule(
        "F07",
        "core",
        "Mixed plans: convolutions INT8, GEMMs and attention FP8; layers moved where INT8 loses",
        "FP8 convolutions are measured no faster than INT8 (ModelOpt's FAR3D example on an RTX "
        "6000 Ada: FP16 45.0 ms, INT8 24.6 ms, FP8 31.5 ms; users report FP8 convolutions no "
        "faster than FP16 on Ada with TensorRT 10.3), while FP8 GEMMs and fused FP8 attention are "
        "TensorRT's FP8 headline. qdq quantize --format mixed moves a convolution's input tensor "
        "to FP8 where FP8's quantization noise is measurably lower (qdq.accuracy.formats).",
    ),
    Rule(
        "F08",
        "core",
        "The softmax output of an FP8 attention is quantized at the fixed scale 1/448 (amax 1)",
        "The probabilities lie in [0, 1] whatever the data, and TensorRT's fused FP8 attention "
        "(MHA-v2) is built from a data-independent softmax-output Q/DQ at scale 1/448: ModelOpt "
        "inserts exactly that for the fusion (its FP8 ONNX exporter, PR 1289). A calibrated amax "
        "below 1 would clip the largest probabilities and give that Q/DQ another scale.",
    ),
    Rule(
        "F09",
        "core",
        "An FP8 plan of a ConvNet with grouped or depthwise convolutions keeps every convolution "
        "INT8 (its GEMMs FP8)",
        "TensorRT has no optimized FP8 kernels for grouped and depthwise convolutions and "
        "recommends INT8 for ConvNets containing them (10.12 release notes, Limitations; "
        "NVIDIA/TensorRT#4524): FP8 pointwise convolutions between INT8 depthwise ones would cross "
        "a format boundary at every block. Override(format='fp8') keeps a layer FP8.",
    ),
    Rule(
        "F10",
        "core",
        "In a plan with FP8 layers, a Concat, pool or element-wise layer reading an FP8 tensor, or "
        "an INT8 one an FP8 layer writes, or writing only FP8 readers, stays float",
        "TensorRT's FP8 kernels are GEMMs, convolutions and attention: a Concat, a pool or a "
        "PointWise layer has no FP8 version, so FP8 Q/DQ on its inputs run as standalone "
        "Dequantize layers and its FP8 reader's Quantize stands alone too; an FP8 layer cannot "
        "write INT8 either. Left float, the layer costs its reader one Quantize (YOLOv8n's FP8 "
        "export: 76 unfused Q/DQ -> 35; RepVGG-A0: 111 -> 25). A layer whose only quantized "
        "readers run FP8 writes float, so its INT8 input would be a standalone Quantize and "
        "Dequantize (DenseNet's pre-activation BatchNorm + ReLU: DenseNet-121 184 -> 63). "
        "A residual skip read in FP8 by the "
        "convolution its Add fuses into keeps its Q/DQ: the fused Add reads it in that format.",
    ),
    Rule(
        "F11",
        "core",
        "NVFP4 / MXFP8 plans: a GEMM (Linear, MatMul/Gemm with a weight) whose K is a multiple "
        "of the block (16 / 32) and whose N is at least 16 runs the block format, weight and input",
        "TensorRT 10.8 added FP4 (NVFP4: E2M1 in blocks of 16 with E4M3 block scales under an "
        "FP32 per-tensor scale) and 10.12 MXFP8 (E4M3 in blocks of 32, E8M0 scales) GEMMs on "
        "Blackwell (compute capability 10.0+), blocked along the reduction axis; activations are "
        "block-quantized at run time (TRT_FP4DynamicQuantize / TRT_MXFP8DynamicQuantize), so only "
        "NVFP4's per-tensor amax is calibrated (max). ModelOpt's NVFP4_DEFAULT_CFG and "
        "MXFP8_DEFAULT_CFG quantize every Linear's weight and input in blocks along the last "
        "axis (16 with E4M3 scales / 32 with E8M0 scales), calibrated by max.",
    ),
    Rule(
        "F12",
        "core",
        "NVFP4 / MXFP8 plans: a GEMM whose K is not a multiple of the block (or N below 16) takes "
        "the FP8 plan's format",
        "Block quantization needs whole blocks along the reduction axis (TensorRT's parser "
        "rejects a partial block; the linter's M03), and no block tile pays below 16 outputs. "
        "FP8 (or INT8, F01-F05) runs such a layer on the same Blackwell target.",
    ),
    Rule(
        "F13",
        "core",
        "NVFP4 / MXFP8 plans: convolutions and ConvTranspose take the FP8 plan's format",
        "TensorRT's FP4 and MX kernels are GEMMs (MatMul/Gemm); it has no FP4 or MX convolution "
        "(the linter's M01), and ModelOpt quantizes convolutions FP8 or INT8 in its NVFP4 and "
        "MXFP8 recipes.",
    ),
    Rule(
        "F14",
        "core",
        "One format per tensor in block plans: a scale group runs a block format only when every "
        "reader runs that format; otherwise its block readers take the FP8 plan's format",
        "One quantize serves every reader of a tensor: a block-quantized tensor beside an FP8 or "
        "INT8 reader (or a Concat, pool or element-wise layer, which have no FP4/MX version) "
        "costs a reformat, a standalone Quantize or Dequantize. The block format is given up "
        "rather than a layer moved into a format it cannot run or a user's choice undone, to a "
        "fixed point: no format boundary inside a group.",
    ),
    Rule(
        "F15",
        "core",
        "A residual skip whose Add fuses into an NVFP4/MXFP8 GEMM stays float",
        "TensorRT's FP4 and MX GEMMs write FP16/BF16 and their inputs are block-quantized at run "
        "time from a float tensor: the fused Add reads its residual in the GEMM's float output "
        "precision, so a float skip costs nothing and a quantized one a standalone Dequantize.",
    ),
    Rule(
        "F16",
        "core",
        "INT4 weight-only GEMMs (format='int4w' or Override(format='int4')): INT4 weights in "
        "blocks of 128 along K (64, 32 or 16 where 128 does not divide K), float input",
        "TensorRT 10.0+ runs block-wise INT4 weight-only GEMMs from DequantizeLinear with "
        "block_size (opset 21) and FP16/BF16 activations; ModelOpt's INT4_AWQ_CFG quantizes "
        "weights only, blocks of 128 along the last axis, max-calibrated scales (AWQ on top).",
    ),
    Rule(
        "F17",
        "core",
        "int4w plans: convolutions, GEMMs whose K is not a multiple of 16, attention products "
        "and non-weighted points run float",
        "TensorRT has no INT4 convolution or INT4 activation kernel; weight-only INT4 is for "
        "memory-bound GEMMs (the weights' bytes), and a K without a whole number of 16-element "
        "blocks has no INT4 block layout (the linter's M03/M04).",
    ),
    Rule(
        "T01",
        "core",
        "qdq quantize --objective speed: a layer whose quantization does not pay stays FP16",
        "Quantizing this layer is predicted slower than FP16 once its standalone Q/DQ and "
        "reformats are counted (qdq.lint.speed: the engine-time model on the target's GPU, the "
        "export's predicted layers against the FP16 build of the same nodes): a 3-channel stem "
        "convolution runs INT8 on CUDA cores, a small layer's Q/DQ cost more than its 8-bit "
        "math saves. The job excludes it as a user exclusion would and keeps the re-planned "
        "model only if it is not predicted slower.",
    ),
    Rule(
        "T02",
        "core",
        "--format mixed --objective speed: where INT8 and FP8 are equally accurate, the format "
        "predicted faster on the target's GPU",
        "Both formats read and write 8-bit tensors, so the time differs by the math: the GPU's "
        "INT8 and FP8 tensor-core peaks (equal on Hopper, Blackwell and datacenter Ada; FP8 "
        "half of INT8 on GeForce Ada, whose FP8 accumulates in FP32) and the CUDA-core rate of "
        "convolutions whose channels do not fill the 16-byte vectors (INT8's dp4a). Equally "
        "accurate: neither format's SQNR better by 3 dB on the input's readers (F07's margin); "
        "predicted as fast within 2 % keeps the planned format (no format boundary added).",
    ),
    Rule("USER", "core", "Excluded or changed by the user's QuantConfig", "User override."),
)

FAMILIES = frozenset(r.family for r in RULES) - {"core"}
_BY_ID = {r.id: r for r in RULES}


def rule(rule_id: str) -> Rule:
    """Return the rule with this id (``KeyError`` names the known ids)."""
    try:
        return _BY_ID[rule_id]
    except KeyError:
        raise KeyError(f"unknown rule id {rule_id!r}; known: {', '.join(_BY_ID)}") from None


def explain(rule_id: str) -> str:
    """A paragraph describing a rule.

    Example:
        >>> print(explain("P08").splitlines()[0])
        P08 [pad] Pad before Conv: put the Q/DQ in front of the Pad
    """
    r = rule(rule_id)
    return f"{r.id} [{r.family}] {r.title}\n  TensorRT: {r.tensorrt}"
