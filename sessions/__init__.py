"""What `enginefarm.load` opens, per backend: sessions and bindings, importable without the backend registry (a warm
load, runner/warm.py, opens a remembered artifact through them alone)."""
