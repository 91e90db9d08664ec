"""enginefarm.cache: the artifact contract (manifest, keys, codecs) and where artifacts live (stores, device cache).

Imports no vendor SDK and no boto3; stores load their client lazily.
"""
