"""File formats every layer reads (safetensors, ONNX with external data, bf16, the weight map, the fp16 keep-rules):
below backends, builder, runner and weights, above only cache and errors."""
