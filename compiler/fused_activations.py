"""The activations onnxruntime's fused contrib ops carry (FusedGemm, FusedConv), as data: each
one's ONNX attributes in activation_params order, with their ONNX defaults. The Gemm fusion writes
them, the CPU kernels apply them, INT8 and onnxruntime sessions split them back into ONNX ops; one
table so that a new activation reaches all four (Elu after a Gemm failed the build when the kernel's
own list stopped at five)."""

SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875

ACTIVATION_ATTRS: dict[str, tuple[tuple[str, float], ...]] = {
    "Relu": (), "Tanh": (), "Sigmoid": (), "Softplus": (), "Softsign": (), "HardSwish": (),
    "LeakyRelu": (("alpha", 0.01),), "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "Elu": (("alpha", 1.0),),
    "ThresholdedRelu": (("alpha", 1.0),), "Selu": (("alpha", SELU_ALPHA), ("gamma", SELU_GAMMA)),
}
# Clip is fused too, its bounds as activation_params; as an ONNX op they are inputs, not attributes.

# The ones onnxruntime's FusedGemm runs (not HardSwish or Clip).
FUSED_GEMM_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "Softplus", "Softsign", "LeakyRelu", "HardSigmoid", "Elu",
                          "ThresholdedRelu", "Selu")


def attribute_names(activation: str) -> tuple[str, ...]:
    return tuple(name for name, _ in ACTIVATION_ATTRS[activation])
