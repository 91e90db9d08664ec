"""The export side of filters: recognise a user's upscaler, face restorer, preview decoder, safety checker or
preprocessor file from its keys (never by unpickling code), build its torch module, and write ONNX + recipe + assets
as the family export does. See `registry.py` for the contract each architecture module fills."""
