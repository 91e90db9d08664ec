"""enginefarm.builder: recipes → jobs → prepared ONNX → backend artifacts, validated, benchmarked and published."""
